import ThreadwireNIO

/// Every bound the server puts on what one client, or all of them, can make
/// it hold. Each is a flag and a config key (docs/configuration.md, "Limits"); the ones a
/// client must respect are reported by `initialize`.
public struct ServerLimits: Sendable, Equatable {
    /// Largest frame payload accepted, and sent.
    public var maxFrameBytes = Framing.defaultMaxFrameBytes
    /// Requests read but not answered, per connection: past it the server
    /// stops reading that socket until answers drain.
    public var maxQueuedRequests = 1024
    /// The same bound in payload bytes.
    public var maxQueuedRequestBytes = 8 * 1024 * 1024
    /// Outbound bytes not yet taken by the kernel at which the server stops
    /// reading a connection and stops starting its requests; it resumes
    /// below half of it.
    public var outboundHighWaterBytes = 1024 * 1024
    /// Notification bytes not yet taken by a connection before it is closed
    /// as a slow subscriber.
    public var maxNotificationBacklogBytes = 8 * 1024 * 1024
    /// Open connections; one more gets an error frame and is closed.
    public var maxConnections = 4096
    /// Milliseconds an initialized connection with nothing in flight and no
    /// subscription may stay silent (0: never closed).
    public var idleTimeoutMs = 300_000
    /// Bytes of incomplete frames held across all connections.
    public var maxPartialFrameBytes = 64 * 1024 * 1024
    /// Milliseconds a connection may stay open without initialize.
    public var handshakeTimeoutMs = 10_000
    /// TCP keepalive on client connections: after this many milliseconds
    /// without a packet from the peer the kernel probes it, and closes the
    /// connection when it stays silent (0: no keepalive). What reclaims a
    /// half-open connection (the peer's host gone without a FIN) that the
    /// idle timeout spares: a subscriber waiting for notifications.
    public var tcpKeepaliveMs = 60_000

    public init() {}

    /// Names the first limit that cannot work, for a startup error.
    public func validate() throws(LimitError) {
        func positive(_ value: Int, _ key: String) throws(LimitError) {
            guard value > 0 else { throw LimitError(message: "\(key) must be positive, got \(value)") }
        }
        try positive(maxFrameBytes, "max_frame_bytes")
        guard maxFrameBytes <= Int(UInt32.max) else { throw LimitError(message: "max_frame_bytes must fit in 32 bits") }
        try positive(maxQueuedRequests, "max_queued_requests")
        try positive(maxQueuedRequestBytes, "max_queued_request_bytes")
        try positive(outboundHighWaterBytes, "outbound_high_water_bytes")
        try positive(maxNotificationBacklogBytes, "max_notification_backlog_bytes")
        try positive(maxConnections, "max_connections")
        guard idleTimeoutMs >= 0 else { throw LimitError(message: "idle_timeout_ms must not be negative") }
        try positive(maxPartialFrameBytes, "max_partial_frame_bytes")
        guard maxPartialFrameBytes >= maxFrameBytes + Framing.headerSize else {
            throw LimitError(message: "max_partial_frame_bytes (\(maxPartialFrameBytes)) must hold at least one whole frame (max_frame_bytes \(maxFrameBytes) + \(Framing.headerSize))")
        }
        try positive(handshakeTimeoutMs, "handshake_timeout_ms")
        guard tcpKeepaliveMs == 0 || tcpKeepaliveMs >= 1000 else {
            throw LimitError(message: "tcp_keepalive_ms must be 0 (off) or at least 1000 (the kernel counts whole seconds), got \(tcpKeepaliveMs)")
        }
    }
}

public struct LimitError: Error, CustomStringConvertible {
    public var message: String
    public var description: String { message }
}
