import ArgumentParser
import Foundation
import Logging
import NIOCore
import NIOPosix
import ThreadwireCore
import ThreadwireServer
import ThreadwireStore

#if canImport(Glibc)
import Glibc
#endif

@main
struct ServerCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "threadwire-server",
        abstract: "Serve threadwire threads over framed protobuf on TCP.")

    @Option(help: "HOST:PORT to listen on; port 0 picks a free port.")
    var listen = "127.0.0.1:7420"

    @Option(help: "Directory of the embedded store (created if missing).")
    var dataDir = "./data"

    @Option(help: "JSON config file (feature flags, agent limits, model catalog).")
    var config: String?

    @Option(help: "Largest accepted frame payload in bytes.")
    var maxFrameBytes = 4 * 1024 * 1024

    @Option(help: "Milliseconds a connection may stay open without initialize.")
    var handshakeTimeoutMs = 10_000

    @Option(help: "Seconds an unsubscribed idle thread stays loaded.")
    var idleUnloadSeconds = 1800.0

    @Option(help: "Seconds graceful shutdown lets running turns finish before interrupting them.")
    var turnGraceSeconds = 5.0

    @Option(help: "Record every inbound frame to this capture file.")
    var record: String?

    @Option(help: "Log level: trace, debug, info, notice, warning, error, critical.")
    var logLevel = "info"

    func run() async throws {
        // Run Swift Concurrency on NIO's event loops: requests then avoid a
        // thread switch between the concurrency pool and the loop doing I/O
        // (profiling showed context switches as the largest cost).
        _ = NIOSingletons.unsafeTryInstallSingletonPosixEventLoopGroupAsConcurrencyGlobalExecutor()
        let level = Logger.Level(rawValue: logLevel) ?? .info
        LoggingSystem.bootstrap { label in
            var handler = StreamLogHandler.standardError(label: label)
            handler.logLevel = level
            return handler
        }
        let logger = Logger(label: "threadwire")
        guard let colon = listen.lastIndex(of: ":"), let port = Int(listen[listen.index(after: colon)...]) else {
            throw ValidationError("--listen must be HOST:PORT, got '\(listen)'")
        }
        var configuration = ServerConfiguration()
        configuration.host = String(listen[..<colon])
        configuration.port = port
        configuration.maxFrameBytes = maxFrameBytes
        configuration.handshakeTimeoutMs = handshakeTimeoutMs
        configuration.idleUnloadSeconds = idleUnloadSeconds
        configuration.recordPath = record

        // Signal handling is in place before the ready line, so a SIGTERM sent
        // the moment a supervisor sees that line is never lost.
        let signals = ShutdownSignals.install()

        var settings = try config.map(ConfigFile.load) ?? ServerSettings()
        settings.shutdownTurnGraceMs = Int(turnGraceSeconds * 1000)
        let store = try SQLiteThreadStore(directory: dataDir, logger: logger)
        let server = try ThreadwireServer(configuration: configuration, settings: settings, store: store, logger: logger)
        let address = try await server.start()
        let host = address.ipAddress ?? configuration.host
        // Written straight to fd 1 (unbuffered) so a supervisor reading a pipe sees it at once.
        FileHandle.standardOutput.write(Data("threadwire listening on \(host):\(address.port ?? port)\n".utf8))

        for await received in signals {
            logger.info("shutting down", metadata: ["tw.signal": "\(received)"])
            break
        }
        await server.shutdown(grace: .milliseconds(500))
        logger.info("stopped")
        // Every acknowledged change is already committed; don't wait for
        // runtime teardown (it took seconds here).
        Glibc.exit(0)
    }
}

/// SIGINT/SIGTERM through a self-pipe: sigaction switches the disposition
/// atomically (a dispatch source plus SIG_IGN left a window where a signal was
/// dropped), and the handler only does an async-signal-safe write.
enum ShutdownSignals {
    nonisolated(unsafe) static var writeEnd: Int32 = -1

    static func install() -> AsyncStream<Int32> {
        var fds: [Int32] = [0, 0]
        guard pipe(&fds) == 0 else { fatalError("pipe() failed: \(errno)") }
        writeEnd = fds[1]
        for signalNumber in [SIGINT, SIGTERM] {
            var action = sigaction()
            action.__sigaction_handler.sa_handler = { received in
                var byte = UInt8(truncatingIfNeeded: received)
                _ = write(ShutdownSignals.writeEnd, &byte, 1)
            }
            sigemptyset(&action.sa_mask)
            action.sa_flags = SA_RESTART
            sigaction(signalNumber, &action, nil)
        }
        let readEnd = fds[0]
        return AsyncStream { continuation in
            Thread.detachNewThread {
                var byte: UInt8 = 0
                while read(readEnd, &byte, 1) == 1 { continuation.yield(Int32(byte)) }
            }
        }
    }
}
