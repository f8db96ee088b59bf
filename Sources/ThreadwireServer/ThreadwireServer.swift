import Foundation
public import Logging
import Metrics
import NIOConcurrencyHelpers
public import NIOCore
import NIOPosix
public import ThreadwireCore
import ThreadwireNIO
import ThreadwireWire

public struct ServerConfiguration: Sendable {
    public var host = "127.0.0.1"
    public var port = 7420
    public var maxFrameBytes = Framing.defaultMaxFrameBytes
    public var maxQueuedRequests = 1024
    public var handshakeTimeoutMs = 10_000
    public var idleUnloadSeconds = 1800.0
    /// Write every inbound frame to this capture file.
    public var recordPath: String?
    public init() {}
}

/// What every connection shares.
final class ServerServices: Sendable {
    let engine: ThreadEngine
    let registry: ConnectionRegistry
    let info: ServerInfo
    let logger: Logger
    let recorder: FrameRecorder?
    let connectionsGauge: Meter
    private let requestCounters: NIOLockedValueBox<[String: Counter]>

    init(engine: ThreadEngine, registry: ConnectionRegistry, info: ServerInfo, logger: Logger, recorder: FrameRecorder?) {
        self.engine = engine
        self.registry = registry
        self.info = info
        self.logger = logger
        self.recorder = recorder
        connectionsGauge = Meter(label: "threadwire.connections.active")
        requestCounters = NIOLockedValueBox([:])
    }

    /// Counters are keyed by method and status only (closed sets), never ids.
    func count(method: String, code: StatusCode) {
        let key = "\(method)|\(code.rawValue)"
        let counter = requestCounters.withLockedValue { table in
            if let existing = table[key] { return existing }
            let counter = Counter(label: "threadwire.requests", dimensions: [("method", method), ("code", "\(code.rawValue)")])
            table[key] = counter
            return counter
        }
        counter.increment()
    }
}

/// The TCP server: binds, accepts, and drains on shutdown.
public final class ThreadwireServer: Sendable {
    private let configuration: ServerConfiguration
    private let services: ServerServices
    private let group: any EventLoopGroup
    private let listener = NIOLockedValueBox<(any Channel)?>(nil)
    private let draining = ManagedAtomicFlag()

    public init(configuration: ServerConfiguration, settings: ServerSettings, store: any ThreadStore,
                backend: any ModelBackend = ScriptedEchoBackend(), logger: Logger) throws {
        self.configuration = configuration
        group = MultiThreadedEventLoopGroup.singleton
        let flag = draining
        var info = ServerInfo(
            maxFrameBytes: configuration.maxFrameBytes, maxQueuedRequests: configuration.maxQueuedRequests,
            handshakeTimeoutMs: configuration.handshakeTimeoutMs, draining: { flag.value })
        info.settings = settings
        let registry = ConnectionRegistry(baseInstructions: { [settings] in settings.baseInstructions(for: $0) })
        let engine = ThreadEngine(store: store, backend: backend, settings: settings, sink: registry,
                                  idleUnloadAfter: .milliseconds(Int(configuration.idleUnloadSeconds * 1000)))
        let recorder = try configuration.recordPath.map { try FrameRecorder(path: $0) }
        services = ServerServices(engine: engine, registry: registry, info: info, logger: logger, recorder: recorder)
    }

    /// Binds and starts accepting; returns the bound address (port 0 picks one).
    /// Turns that a dead process left running are recovered first, so no
    /// client ever sees a thread ACTIVE with a turn nobody runs.
    public func start() async throws -> SocketAddress {
        let recovered = try await services.engine.recoverInterruptedTurns()
        if recovered > 0 {
            services.logger.notice("recovered threads whose turns were left running", metadata: ["tw.threads": "\(recovered)"])
        }
        let services = self.services
        let maxFrameBytes = configuration.maxFrameBytes
        let counter = ManagedAtomicCounter()
        let channel = try await ServerBootstrap(group: group)
            .serverChannelOption(.backlog, value: 256)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelOption(.socketOption(.tcp_nodelay), value: 1)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandlers([
                        ByteToMessageHandler(FrameDecoder(maxFrameBytes: maxFrameBytes)),
                        MessageToByteHandler(FrameEncoder()),
                        ConnectionHandler(connectionID: counter.next(), services: services),
                    ])
                }
            }
            .bind(host: configuration.host, port: configuration.port)
            .get()
        listener.withLockedValue { $0 = channel }
        return channel.localAddress!
    }

    /// Graceful shutdown: health turns NOT_SERVING and new work is refused,
    /// the listener closes, in-flight requests get `grace` to finish, then
    /// every connection is closed.
    public func shutdown(grace: Duration = .seconds(2)) async {
        draining.set()
        let channel = listener.withLockedValue { $0 }
        try? await channel?.close()
        // Running turns get their grace, then are interrupted and recorded.
        await services.engine.shutdown()
        try? await Task.sleep(for: grace)
        for connection in services.registry.all { try? await connection.channel.close() }
        services.recorder?.close()
    }
}

/// Small lock-based helpers (avoids a swift-atomics dependency for two flags).
final class ManagedAtomicFlag: Sendable {
    private let box = NIOLockedValueBox(false)
    var value: Bool { box.withLockedValue { $0 } }
    func set() { box.withLockedValue { $0 = true } }
}

final class ManagedAtomicCounter: Sendable {
    private let box = NIOLockedValueBox<UInt64>(0)
    func next() -> UInt64 { box.withLockedValue { $0 += 1; return $0 } }
}

/// Writes inbound frames to a capture file (format: docs/protocol.md "Capture files").
/// Event loops only append to a memory buffer; a background thread writes it
/// out, so recording adds no file I/O to request handling.
final class FrameRecorder: Sendable {
    static let magic = Array("TWCAP1\n".utf8)
    private struct State {
        var pending: [UInt8] = []
        var closed = false
    }
    private let state = NIOLockedValueBox(State())
    private let wake = ConditionLock(value: 0)
    private let handle: FileHandle
    private let finished = ConditionLock(value: 0)

    init(path: String) throws {
        guard FileManager.default.createFile(atPath: path, contents: Data(Self.magic)),
              let handle = FileHandle(forWritingAtPath: path) else {
            throw DomainError.invalidArgument("cannot create capture file \(path)")
        }
        handle.seekToEndOfFile()
        self.handle = handle
        Thread.detachNewThread { [self] in self.writerLoop() }
    }

    private func writerLoop() {
        while true {
            // Wake when a buffer fills or every 20 ms; the lock is held only on success.
            if wake.lock(whenValue: 1, timeoutSeconds: 0.02) { wake.unlock(withValue: 0) }
            let (bytes, closed) = state.withLockedValue { state -> ([UInt8], Bool) in
                defer { state.pending.removeAll(keepingCapacity: true) }
                return (state.pending, state.closed)
            }
            if !bytes.isEmpty { handle.write(Data(bytes)) }
            if closed {
                handle.closeFile()
                finished.lock()
                finished.unlock(withValue: 1)
                return
            }
        }
    }

    /// Kind 1: an inbound frame exactly as received (header + payload).
    func record(connection: UInt64, payload: [UInt8]) {
        write(kind: 1, connection: connection, body: Framing.frame(payload))
    }

    /// Kind 2: request `requestID` of this connection created `createdID` (a
    /// thread or turn id), so a replay can map later references to its own.
    func recordCreated(connection: UInt64, requestID: UInt64, createdID: String) {
        var body: [UInt8] = []
        Self.append(requestID, to: &body)
        let id = Array(createdID.utf8)
        body += [UInt8(id.count >> 8), UInt8(id.count & 0xff)] + id
        write(kind: 2, connection: connection, body: body)
    }

    private func write(kind: UInt8, connection: UInt64, body: [UInt8]) {
        var bytes: [UInt8] = [kind]
        Self.append(UInt64(Date().timeIntervalSince1970 * 1_000_000), to: &bytes)
        Self.append(connection, to: &bytes)
        bytes += body
        let full = state.withLockedValue { state -> Bool in
            state.pending += bytes
            return state.pending.count >= 256 * 1024
        }
        if full {
            wake.lock()
            wake.unlock(withValue: 1)
        }
    }

    static func append(_ value: UInt64, to bytes: inout [UInt8]) {
        for shift in stride(from: 56, through: 0, by: -8) { bytes.append(UInt8((value >> UInt64(shift)) & 0xff)) }
    }

    /// Writes what is buffered and closes the file.
    func close() {
        state.withLockedValue { $0.closed = true }
        wake.lock()
        wake.unlock(withValue: 1)
        if finished.lock(whenValue: 1, timeoutSeconds: 5) { finished.unlock() }
    }
}
