public import NIOCore
public import ThreadwireNIO

/// How the server reaches its clients, apart from what it says to them (as
/// grpc-swift-2 keeps `ServerTransport` apart from its call layer): a
/// transport accepts connections and gives each a pipeline that turns bytes
/// into frames and pushes back on a client that sends faster than it is
/// answered; the call layer then adds the one handler that reads requests.
///
/// Two transports implement it: `TCPServerTransport` (the listener, TLS,
/// the descriptor reserve) and `InProcessTransport` (connections made inside
/// the process over socket pairs, for tests and embedding).
public protocol ServerTransport: Sendable {
    /// Starts accepting. Each connection gets the transport's handlers and is
    /// then handed to `accept`, on its event loop, to add the call layer's.
    /// Returns the address bound (nil for a transport that binds none).
    func listen(_ settings: ConnectionSettings,
                accept: @escaping @Sendable (AcceptedConnection) throws -> Void) async throws -> SocketAddress?
    /// Graceful shutdown begins: no new connections; open ones stay.
    func stopAccepting()
    /// Returns once the transport accepts no more connections.
    func waitUntilStopped() async
}

/// What the call layer decides about every connection's transport half.
public struct ConnectionSettings: Sendable {
    /// The largest frame accepted until the call layer raises it (small
    /// until a client authenticates).
    public var initialMaxFrameBytes: Int
    /// Bytes of incomplete frames held across all connections.
    public var maxPartialFrameBytes: Int
    /// Unsent outbound bytes at which a connection stops being writable.
    public var outboundHighWaterBytes: Int
    /// The frame a connection refused for want of file descriptors is sent
    /// (written by the codec; never sent through TLS).
    public var outOfDescriptorsRefusal: [UInt8]?
    /// TCP keepalive's idle time in whole seconds (0: off); see `Limits.tcpKeepaliveMs`.
    public var tcpKeepaliveSeconds: Int
    /// The descriptors connections may hold, shared by every transport of
    /// the process (nil: no limit but the kernel's).
    public var descriptors: DescriptorBudget?
    public var events: TransportEvents

    public init(initialMaxFrameBytes: Int, maxPartialFrameBytes: Int, outboundHighWaterBytes: Int,
                outOfDescriptorsRefusal: [UInt8]? = nil, tcpKeepaliveSeconds: Int = 0, descriptors: DescriptorBudget? = nil,
                events: TransportEvents = TransportEvents()) {
        self.initialMaxFrameBytes = initialMaxFrameBytes
        self.maxPartialFrameBytes = maxPartialFrameBytes
        self.outboundHighWaterBytes = outboundHighWaterBytes
        self.outOfDescriptorsRefusal = outOfDescriptorsRefusal
        self.tcpKeepaliveSeconds = tcpKeepaliveSeconds
        self.descriptors = descriptors
        self.events = events
    }
}

/// What the transport tells the operator's metrics and logs.
public struct TransportEvents: Sendable {
    /// A connection's reads were held back (its client is pushed back on).
    public var readsPaused: @Sendable () -> Void
    /// accept failed and the listener pauses before trying again.
    public var acceptBackedOff: @Sendable () -> Void
    /// Out of file descriptors (or of those the budget leaves connections),
    /// a connection was refused; true the first time in an episode (worth a
    /// warning).
    public var refusedOutOfDescriptors: @Sendable (_ error: any Error, _ firstInEpisode: Bool) -> Void

    public init(readsPaused: @escaping @Sendable () -> Void = {}, acceptBackedOff: @escaping @Sendable () -> Void = {},
                refusedOutOfDescriptors: @escaping @Sendable (any Error, Bool) -> Void = { _, _ in }) {
        self.readsPaused = readsPaused
        self.acceptBackedOff = acceptBackedOff
        self.refusedOutOfDescriptors = refusedOutOfDescriptors
    }
}

/// One accepted connection with its transport half built: (TLS,) flow
/// control and frame decoding. Its channel's inbound messages are frame
/// payloads (`ByteBuffer`); outbound, whole frames.
public struct AcceptedConnection {
    public let channel: any Channel
    public let flowControl: FlowControlHandler
    /// Raised by the call layer once the client authenticated.
    public let frameLimit: FrameSizeLimit
    /// What the opener of an in-process connection vouches for (the
    /// principal another transport verified); nil for a socket's.
    public var attachment: (any Sendable)? = nil
}

/// The transport half of every connection's pipeline, whatever carries it:
/// (TLS,) framing, the call layer `accept` adds, then flow control.
///
/// Flow control comes last, after the call layer: it gates `read()`, which
/// starts at the pipeline's tail, and hears writability, which the call
/// layer passes on; the call layer ends every read event itself and writes
/// through its own context, so no request's read, read-complete, write or
/// flush passes through flow control on its way (four handler hops less per
/// request than with flow control next to the socket, issue 54).
enum FramePipeline {
    /// - Parameter framing: the handler that turns what the channel reads
    ///   into envelopes (frame payloads), held to the frame limit and, for
    ///   what it holds of messages not yet complete, to the shared budget;
    ///   the frame decoder for a byte stream.
    /// - Returns: the framing handler, the first one the call layer's
    ///   inbound events pass.
    @discardableResult
    static func configure(_ channel: any Channel, settings: ConnectionSettings, budget: PartialFrameBudget,
                          tls: (() throws -> (any ChannelHandler))?, attachment: (any Sendable)? = nil,
                          framing: ((FrameSizeLimit, PartialFrameBudget) throws -> any ChannelHandler)? = nil,
                          accept: @Sendable (AcceptedConnection) throws -> Void) throws -> any ChannelHandler {
        let sync = channel.pipeline.syncOperations
        if let tls { try sync.addHandler(tls()) }
        let flowControl = FlowControlHandler(paused: settings.events.readsPaused)
        let frameLimit = FrameSizeLimit(settings.initialMaxFrameBytes)
        // Outbound frames are packed straight into ByteBuffers by the codec,
        // so no encoder handler is needed.
        let framingHandler = try framing?(frameLimit, budget) ?? FrameSplitter(limit: frameLimit, budget: budget)
        try sync.addHandler(framingHandler)
        try accept(AcceptedConnection(channel: channel, flowControl: flowControl, frameLimit: frameLimit, attachment: attachment))
        try sync.addHandler(flowControl)
        return framingHandler
    }
}
