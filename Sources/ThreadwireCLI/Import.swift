import ArgumentParser
struct Import: AsyncParsableCommand { func run() async throws {} }
