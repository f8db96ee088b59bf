import ArgumentParser

@main
struct ThreadwireBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "threadwire-bench",
        abstract: "threadwire benchmarks: each comparison side by side, in one run, on this machine.",
        subcommands: [Run.self, EchoServer.self, GRPCServerCommand.self, Streaming.self])
}
