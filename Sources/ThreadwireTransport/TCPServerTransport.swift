import NIOConcurrencyHelpers
public import NIOCore
public import NIOPosix
public import NIOSSL
import ThreadwireNIO
#if canImport(Glibc)
import Glibc
#endif

/// Clients over TCP, optionally TLS: the listening socket (made here so that
/// the descriptor reserve can accept on it), accept backoff, and the
/// descriptor reserve for running out of file descriptors.
public final class TCPServerTransport: ServerTransport {
    public let host: String
    public let port: Int
    private let tls: NIOSSLContext?
    private let group: any EventLoopGroup
    private let listener = NIOLockedValueBox<(any Channel)?>(nil)
    private static let backlog: Int32 = 256

    public init(host: String, port: Int, tls: NIOSSLContext? = nil, group: any EventLoopGroup = MultiThreadedEventLoopGroup.singleton) {
        self.host = host
        self.port = port
        self.tls = tls
        self.group = group
    }

    public func listen(_ settings: ConnectionSettings,
                       accept: @escaping @Sendable (AcceptedConnection) throws -> Void) async throws -> SocketAddress? {
        let budget = PartialFrameBudget(limit: settings.maxPartialFrameBytes)
        let events = settings.events
        let tls = self.tls
        let descriptor = try ListeningSocket.open(host: host, port: port, backlog: Self.backlog)
        // No handshake to send a refusal through with TLS.
        let reserve = DescriptorReserve(refusal: tls == nil ? settings.outOfDescriptorsRefusal : nil)
        let channel = try await ServerBootstrap(group: group)
            .serverChannelInitializer { channel in
                // Out of file descriptors, accept fails at once; without a
                // pause the loop would spin on it.
                channel.eventLoop.makeCompletedFuture {
                    if let budget = settings.descriptors {
                        try channel.pipeline.syncOperations.addHandler(AcceptGate(budget: budget))
                    }
                    try channel.pipeline.syncOperations.addHandler(AcceptBackoffHandler(backoffProvider: { error in
                        events.acceptBackedOff()
                        guard DescriptorReserve.isOutOfDescriptors(error) else { return .milliseconds(250) }
                        if reserve.refusePending(listener: descriptor) {
                            events.refusedOutOfDescriptors(error, reserve.shouldWarn())
                            return nil
                        }
                        return .milliseconds(250)
                    }))
                }
            }
            .childChannelOption(.socketOption(.tcp_nodelay), value: 1)
            .childChannelOption(.writeBufferWaterMark, value: .init(low: settings.outboundHighWaterBytes / 2, high: settings.outboundHighWaterBytes))
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    if let budget = settings.descriptors {
                        // Refused at once, before accept itself fails: see DescriptorBudget.
                        guard budget.admit(1, events: events) else {
                            try channel.pipeline.syncOperations.addHandler(RefuseConnectionHandler(refusal: tls == nil ? settings.outOfDescriptorsRefusal : nil, budget: budget))
                            return
                        }
                        budget.giveBack(1, whenClosed: channel)
                    }
                    try Self.keepAlive(channel, idleSeconds: settings.tcpKeepaliveSeconds)
                    try FramePipeline.configure(channel, settings: settings, budget: budget,
                                                tls: tls.map { context in { NIOSSLServerHandler(context: context) } }, accept: accept)
                }
            }
            .withBoundSocket(descriptor)
            .get()
        ListeningSocket.setBacklog(descriptor, Self.backlog)
        listener.withLockedValue { $0 = channel }
        return channel.localAddress
    }

    /// Kernel keepalive probes after `idleSeconds` of silence, then every
    /// `min(10, max(1, idle / 2))` s; three unanswered probes close the
    /// connection (the handler then sees it inactive, as on any reset).
    static func keepAlive(_ channel: any Channel, idleSeconds: Int) throws {
        guard idleSeconds > 0 else { return }
        guard let options = channel.syncOptions else { throw ChannelError.operationUnsupported }
        let interval = min(10, max(1, idleSeconds / 2))
        try options.setOption(.socketOption(.so_keepalive), value: 1)
        try options.setOption(.tcpOption(.init(rawValue: CInt(TCP_KEEPIDLE))), value: idleSeconds)
        try options.setOption(.tcpOption(.init(rawValue: CInt(TCP_KEEPINTVL))), value: interval)
        try options.setOption(.tcpOption(.init(rawValue: CInt(TCP_KEEPCNT))), value: 3)
    }

    public func stopAccepting() {
        listener.withLockedValue { $0 }?.close(promise: nil)
    }

    public func waitUntilStopped() async {
        try? await listener.withLockedValue { $0 }?.closeFuture.get()
    }
}
