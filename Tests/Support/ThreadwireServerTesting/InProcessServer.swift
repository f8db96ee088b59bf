public import Foundation
public import Logging
import NIOConcurrencyHelpers
public import NIOCore
public import Prometheus
public import ServiceLifecycle
public import Testing
public import ThreadwireClient
public import ThreadwireServerCommand
public import ThreadwireTransport

/// The real server, composed from the same flags and config file as the
/// `threadwire-server` binary (`ServerCommand.compose`), running its service
/// group inside the test process on an `InProcessTransport`: the same
/// pipeline, call layer, engine and SQLite store, without a process or a
/// port. Tests that need a process boundary (kill -9, signals, descriptor
/// limits, real proxies, the admin endpoint) use `ServerProcess`.
///
/// Its surface matches `ServerProcess` where tests share it (`launch`,
/// `client`, `restart`, `stop`, `start`, `rewriteConfig`, `token`), so a
/// test moves between the two by its first line.
public final class InProcessServer: @unchecked Sendable {
    private let setup: TestServerSetup
    public var dataDir: String { setup.dataDir }
    private let extraArguments: [String]
    /// Bearer token `client()` presents.
    public var token: String?

    private struct Running {
        let transport: InProcessTransport
        let group: ServiceGroup
        let task: Task<Void, any Error>
    }
    private let running = NIOLockedValueBox<Running?>(nil)

    private init(config: String?, arguments: [String]) throws {
        setup = try TestServerSetup(config: config)
        extraArguments = arguments
    }

    /// - Parameter config: the server's JSON config file contents.
    /// - Parameter arguments: more `threadwire-server` flags.
    public static func launch(config: String? = nil, arguments: [String] = []) async throws -> InProcessServer {
        let server = try InProcessServer(config: config, arguments: arguments)
        try await server.start()
        return server
    }

    /// Composes the server from its flags and runs its services until `stop`;
    /// returns once it accepts connections.
    public func start() async throws {
        let command = try ServerCommand.parse(setup.arguments(extraArguments))
        let logger = Logger(label: "threadwire-in-process") { label in
            var handler = StreamLogHandler.standardError(label: label)
            handler.logLevel = .error
            return handler
        }
        let transport = InProcessTransport()
        let (listening, listened) = AsyncStream<Void>.makeStream()
        let composed = try await command.compose(logger: logger, metricsRegistry: PrometheusCollectorRegistry(), transport: transport,
                                                 onListening: { _ in listened.yield(); listened.finish() })
        let group = ServiceGroup(configuration: .init(services: composed.services, logger: logger))
        let task = Task {
            defer { listened.finish() }
            try await group.run()
        }
        for await _ in listening { break }
        guard transport.isAccepting else {
            // The group ended before it listened: its error.
            try await task.value
            throw InProcessServerError.endedBeforeListening
        }
        running.withLockedValue { $0 = Running(transport: transport, group: group, task: task) }
    }

    /// Graceful shutdown, as SIGTERM does to the binary: drains and ends
    /// every service. Returns 0 when the group ended without an error (the
    /// binary's exit status), 1 otherwise; nil if it was not running.
    @discardableResult
    public func stop() async -> Int32? {
        guard let current = running.withLockedValue({ state -> Running? in defer { state = nil }; return state }) else { return nil }
        await current.group.triggerGracefulShutdown()
        do {
            try await current.task.value
            return 0
        } catch {
            Issue.record("in-process server ended with \(error)")
            return 1
        }
    }

    public func restart() async throws {
        await stop()
        try await start()
    }

    /// Writes a new config (takes effect at the next restart).
    public func rewriteConfig(_ config: String) throws { try setup.rewriteConfig(config) }

    /// A connection's client end (the caller owns it): for `RawSocket`.
    public func connectSocket() async throws -> Int32 {
        guard let transport = running.withLockedValue({ $0?.transport }) else { throw InProcessServerError.notRunning }
        return try await transport.connect()
    }

    public func client(initialize: Bool = true, optOut: [String] = []) async throws -> ThreadwireClient {
        let client = try await ThreadwireClient.connect(socket: try await connectSocket())
        if initialize { try await client.initialize(name: "tests", optOut: optOut, authToken: token) }
        return client
    }

    /// A server nobody stopped: shut down gracefully in the background, and
    /// the data directory removed once it has ended.
    deinit {
        let dataDir = self.dataDir
        guard let current = running.withLockedValue({ $0 }) else {
            try? FileManager.default.removeItem(atPath: dataDir)
            return
        }
        Task {
            await current.group.triggerGracefulShutdown()
            _ = try? await current.task.value
            try? FileManager.default.removeItem(atPath: dataDir)
        }
    }
}

public enum InProcessServerError: Error {
    case endedBeforeListening
    case notRunning
}
