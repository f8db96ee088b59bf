import ArgumentParser
import Foundation
import Logging
import NIOCore
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

    @Option(help: "Record every inbound frame to this capture file.")
    var record: String?

    @Option(help: "Log level: trace, debug, info, notice, warning, error, critical.")
    var logLevel = "info"

    func run() async throws {
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

        let settings = try config.map(ConfigFile.load) ?? ServerSettings()
        let store = try SQLiteThreadStore(directory: dataDir, logger: logger)
        let server = try ThreadwireServer(configuration: configuration, settings: settings, store: store, logger: logger)
        let address = try await server.start()
        let host = address.ipAddress ?? configuration.host
        // Written straight to fd 1 (unbuffered) so a supervisor reading a pipe sees it at once.
        FileHandle.standardOutput.write(Data("threadwire listening on \(host):\(address.port ?? port)\n".utf8))

        // Stop cleanly on SIGINT or SIGTERM.
        let signals = AsyncStream<Int32> { continuation in
            for signalNumber in [SIGINT, SIGTERM] {
                signal(signalNumber, SIG_IGN)
                let source = DispatchSource.makeSignalSource(signal: signalNumber, queue: .main)
                source.setEventHandler { continuation.yield(signalNumber) }
                source.resume()
                SignalSources.keep(source)
            }
        }
        for await received in signals {
            logger.info("shutting down", metadata: ["tw.signal": "\(received)"])
            break
        }
        await server.shutdown(grace: .milliseconds(500))
    }
}

/// Keeps signal sources alive for the process lifetime.
enum SignalSources {
    nonisolated(unsafe) static var sources: [any DispatchSourceSignal] = []
    static func keep(_ source: any DispatchSourceSignal) { sources.append(source) }
}
