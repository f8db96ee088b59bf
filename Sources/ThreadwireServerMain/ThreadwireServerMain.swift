import ThreadwireServerCommand

/// The process: flags, logging, metrics, signals and the service group are
/// all ServerCommand's (a library, so tests compose the same server in process).
@main
enum ThreadwireServerMain {
    static func main() async {
        await ServerCommand.main()
    }
}
