import Foundation
import ThreadwireServerCommand

/// The process: flags, logging, metrics, signals and the service group are
/// all ServerCommand's (a library, so tests compose the same server in process).
@main
enum ThreadwireServerMain {
    static func main() async {
        let given = Array(CommandLine.arguments.dropFirst())
        // A subcommand (config check) reads what it names, not this process's settings.
        if given.first == "config" { await ServerCommand.main(given); return }
        let arguments: [String]
        do {
            // THREADWIRE_* variables and config file keys stand for the flags not given (SettingSources).
            arguments = try await SettingSources.arguments(given, environment: ProcessInfo.processInfo.environment)
        } catch {
            ServerCommand.exit(withError: error)
        }
        await ServerCommand.main(arguments)
    }
}
