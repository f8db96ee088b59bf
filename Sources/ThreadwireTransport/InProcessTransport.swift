#if canImport(Glibc)
import Glibc
#endif
import NIOConcurrencyHelpers
public import NIOCore
public import NIOPosix
public import ThreadwireNIO

/// Connections made inside the process: each `connect()` is a connected
/// socket pair whose server end gets the same pipeline as a TCP connection
/// (flow control, frame limits, the call layer) and whose other end is the
/// client's. No port, no listener, no process to start: tests run the real
/// server this way, and a program can embed one.
public final class InProcessTransport: ServerTransport {
    private struct Listening {
        var settings: ConnectionSettings
        var budget: PartialFrameBudget
        var accept: @Sendable (AcceptedConnection) throws -> Void
    }
    private enum State {
        case idle
        case listening(Listening)
        case stopped
    }
    private let state = NIOLockedValueBox(State.idle)
    private let group: any EventLoopGroup
    private let stopped: EventLoopPromise<Void>

    public init(group: any EventLoopGroup = MultiThreadedEventLoopGroup.singleton) {
        self.group = group
        stopped = group.next().makePromise()
    }

    public func listen(_ settings: ConnectionSettings,
                       accept: @escaping @Sendable (AcceptedConnection) throws -> Void) async throws -> SocketAddress? {
        let listening = Listening(settings: settings, budget: PartialFrameBudget(limit: settings.maxPartialFrameBytes), accept: accept)
        try state.withLockedValue { state in
            guard case .idle = state else { throw InProcessTransportError.alreadyListening }
            state = .listening(listening)
        }
        return nil
    }

    /// Whether `connect` is taken now (listening, and not yet stopped).
    public var isAccepting: Bool {
        if case .listening = state.withLockedValue({ $0 }) { return true }
        return false
    }

    public func stopAccepting() {
        let wasStopped = state.withLockedValue { state -> Bool in
            defer { state = .stopped }
            if case .stopped = state { return true }
            return false
        }
        if !wasStopped { stopped.succeed() }
    }

    /// A server that failed to start never stops accepting: the promise
    /// is completed here, so it is not leaked (NIO traps on that).
    deinit { stopAccepting() }

    public func waitUntilStopped() async {
        try? await stopped.futureResult.get()
    }

    /// A new connection to the server: the client's end of a connected
    /// socket pair (the caller owns and closes it), returned once the
    /// server's end is in its pipeline. Refused once the server stops accepting.
    /// `attachment` reaches the call layer with the connection (`AcceptedConnection.attachment`).
    public func connect(attachment: (any Sendable)? = nil) async throws -> Int32 {
        guard case let .listening(listening) = state.withLockedValue({ $0 }) else { throw InProcessTransportError.notAccepting }
        // A socket pair is two descriptors of the process.
        if let budget = listening.settings.descriptors {
            guard budget.admit(2, events: listening.settings.events) else { throw InProcessTransportError.outOfDescriptors(budget.exhausted) }
        }
        var taken = listening.settings.descriptors != nil
        defer { if taken { listening.settings.descriptors?.give(2) } }
        var ends: [Int32] = [-1, -1]
        guard socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0, &ends) == 0 else {
            throw IOError(errnoCode: errno, reason: "socketpair")
        }
        let settings = listening.settings
        do {
            let channel = try await ClientBootstrap(group: group)
                .channelOption(.writeBufferWaterMark, value: .init(low: settings.outboundHighWaterBytes / 2, high: settings.outboundHighWaterBytes))
                .channelInitializer { channel in
                    channel.eventLoop.makeCompletedFuture {
                        _ = try FramePipeline.configure(channel, settings: settings, budget: listening.budget, tls: nil, attachment: attachment,
                                                        accept: listening.accept)
                    }
                }
                .withConnectedSocket(ends[0])
                .get()
            // Given back when the server's end closes (the client's follows it).
            if let budget = settings.descriptors {
                taken = false
                budget.giveBack(2, whenClosed: channel)
            }
        } catch {
            close(ends[1])
            throw error
        }
        return ends[1]
    }

    /// Serves a session on a channel another listener opened and carries in
    /// its own messages (a WebSocket after its upgrade), on that channel's
    /// event loop: no socket pair, the call layer reads from the channel
    /// itself. `framing` turns the channel's messages into envelopes
    /// (frame payloads) held to the connection's frame limit and the shared
    /// budget for partial frames, and the call layer's outbound frames into
    /// the channel's messages. Refused once
    /// the server stops accepting.
    public func adoptSynchronously(_ channel: any Channel, attachment: (any Sendable)? = nil,
                                   framing: (FrameSizeLimit, PartialFrameBudget) throws -> any ChannelHandler) throws {
        guard case let .listening(listening) = state.withLockedValue({ $0 }) else { throw InProcessTransportError.notAccepting }
        let settings = listening.settings
        // The carrier's own socket is the one descriptor it holds.
        if let budget = settings.descriptors {
            guard budget.admit(1, events: settings.events) else { throw InProcessTransportError.outOfDescriptors(budget.exhausted) }
            budget.giveBack(1, whenClosed: channel)
        }
        try channel.syncOptions?.setOption(.writeBufferWaterMark,
                                           value: .init(low: settings.outboundHighWaterBytes / 2, high: settings.outboundHighWaterBytes))
        let framingHandler = try withoutActuallyEscaping(framing) { framing in
            try FramePipeline.configure(channel, settings: settings, budget: listening.budget, tls: nil,
                                        attachment: attachment, framing: framing, accept: listening.accept)
        }
        // Open before the framing and the call layer came: they hear so now,
        // as a new connection's would (handed to the framing handler as the
        // pipeline hands it an event, then passed on by it).
        let framingContext = try channel.pipeline.syncOperations.context(handler: framingHandler)
        guard let inbound = framingHandler as? any _ChannelInboundHandler else {
            preconditionFailure("a framing handler reads the channel's messages (it is an inbound handler)")
        }
        inbound.channelActive(context: framingContext)
    }
}

public enum InProcessTransportError: Error, CustomStringConvertible, Equatable {
    case alreadyListening
    case notAccepting
    case outOfDescriptors(DescriptorBudget.Exhausted)

    public var description: String {
        switch self {
        case .alreadyListening: return "this in-process transport already serves a server"
        case .notAccepting: return "the in-process server is not accepting connections (not started, or shutting down)"
        case let .outOfDescriptors(exhausted): return "the server is out of file descriptors: \(exhausted)"
        }
    }
}
