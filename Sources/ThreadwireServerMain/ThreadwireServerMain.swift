import Foundation
import ThreadwireServerCommand

/// The process: flags, logging, metrics, signals and the service group are
/// all ServerCommand's (a library, so tests compose the same server in process).
@main
enum ThreadwireServerMain {
    static func main() async {
        let arguments: [String]
        do {
            // THREADWIRE_* variables stand for the flags not given (EnvironmentFlags).
            arguments = try EnvironmentFlags.arguments(Array(CommandLine.arguments.dropFirst()), environment: ProcessInfo.processInfo.environment)
        } catch {
            ServerCommand.exit(withError: error)
        }
        await ServerCommand.main(arguments)
    }
}
