import NIOConcurrencyHelpers
import NIOCore
import Synchronization
import ThreadwireNIO
import ThreadwireCore
import ThreadwireWire

/// One client connection's shared state. Writes go through the channel (which
/// is safe from any thread); the lock keeps notification sequence numbers in
/// the order the frames are written.
///
/// Memory a client can make the server hold is bounded here: requests read
/// but not answered (count and bytes: past them reads stop), responses (the
/// request loop starts the next request only while the channel is writable),
/// and notifications (past the backlog limit the connection is closed).
final class Connection: Sendable {
    let id: ConnectionID
    let channel: any Channel
    private let limits: ServerLimits
    private let metrics: ServerMetrics

    /// Notification order: sequence numbers are taken and frames written
    /// under this lock. A write can flush and fire writability events
    /// synchronously, so nothing those events touch uses this lock.
    private struct State {
        var initialized = false
        var optOut: Set<String> = []
        var nextSequence: UInt64 = 1
        var principal: Principal = .standalone
        /// The token this connection authenticated with, to close it if the
        /// token is revoked (SIGHUP). Never logged.
        var credential: [UInt8]?
        /// Another instance relaying its clients' requests.
        var peer = false
    }
    private let state = NIOLockedValueBox(State())
    private struct Queue {
        var requests = 0
        var bytes = 0
    }
    private let queue = NIOLockedValueBox(Queue())
    /// Reads stopped because the request queue is full.
    private let readsHeldForQueue = Atomic<Bool>(false)
    private let closing = Atomic<Bool>(false)
    private let writableWaiters = NIOLockedValueBox<[CheckedContinuation<Void, Never>]>([])
    /// Notification bytes written but not yet taken by the kernel.
    private let notificationBacklog = Atomic<Int>(0)
    /// Resumes reads on the channel's event loop once the queue drains.
    private let resumeReads: @Sendable () -> Void
    /// Small until initialize authenticates, then `limits.maxFrameBytes`.
    let frameLimit: FrameSizeLimit
    /// The principal a verified client certificate names (mutual TLS), read
    /// once the handshake is done (before the first request is handled).
    private let certified = NIOLockedValueBox<Principal?>(nil)
    var certificatePrincipal: Principal? { certified.withLockedValue { $0 } }
    func setCertificatePrincipal(_ principal: Principal?) { certified.withLockedValue { $0 = principal } }

    init(id: ConnectionID, channel: any Channel, limits: ServerLimits, metrics: ServerMetrics,
         frameLimit: FrameSizeLimit? = nil,
         resumeReads: @escaping @Sendable () -> Void) {
        self.id = id
        self.channel = channel
        self.limits = limits
        self.metrics = metrics
        self.frameLimit = frameLimit ?? FrameSizeLimit(limits.maxFrameBytes)
        self.resumeReads = resumeReads
    }

    var isInitialized: Bool { state.withLockedValue { $0.initialized } }

    /// Who this connection acts as (`Principal.standalone` until initialize,
    /// and always on a server without authentication).
    var principal: Principal { state.withLockedValue { $0.principal } }

    /// Whether this is another instance relaying requests (never relayed again).
    var isPeer: Bool { state.withLockedValue { $0.peer } }

    /// The notification methods the client opted out of.
    var optedOut: [String] { state.withLockedValue { Array($0.optOut) } }

    /// Requests relayed to other instances for this client (set by the
    /// forwarder; closed with the connection).
    let upstreams = NIOLockedValueBox<[String: Upstream]>([:])

    func markInitialized(optOut: [String], principal: Principal = .standalone, credential: [UInt8]? = nil, peer: Bool = false) -> Bool {
        let done = state.withLockedValue { state in
            if state.initialized { return false }
            state.initialized = true
            state.optOut = Set(optOut)
            state.principal = principal
            state.credential = credential
            state.peer = peer
            return true
        }
        if done { frameLimit.raise(to: limits.maxFrameBytes) }
        return done
    }

    /// After the tokens were reloaded: false if this connection authenticated
    /// with a token that no longer names its principal.
    func credentialStillValid(_ authenticator: Authenticator) -> Bool {
        let (principal, credential) = state.withLockedValue { ($0.principal, $0.credential) }
        guard let credential else { return true }
        return authenticator.principal(presenting: credential) == principal
    }

    // MARK: Inbound queue

    /// Counts a request of `bytes` in. Returns false when the queue is now
    /// full, so the caller stops reading until `finished` drains it.
    func admit(bytes: Int) -> Bool {
        queue.withLockedValue { queue in
            queue.requests += 1
            queue.bytes += bytes
            if queue.requests >= limits.maxQueuedRequests || queue.bytes >= limits.maxQueuedRequestBytes {
                readsHeldForQueue.store(true, ordering: .relaxed)
                return false
            }
            return true
        }
    }

    func finished(bytes: Int) {
        let resume = queue.withLockedValue { queue -> Bool in
            queue.requests -= 1
            queue.bytes -= bytes
            guard readsHeldForQueue.load(ordering: .relaxed),
                  queue.requests < limits.maxQueuedRequests, queue.bytes < limits.maxQueuedRequestBytes else { return false }
            readsHeldForQueue.store(false, ordering: .relaxed)
            return true
        }
        if resume { resumeReads() }
    }

    var hasRequestsInFlight: Bool { queue.withLockedValue { $0.requests > 0 } }

    /// Whether the socket may be read now (checked by `FlowControlHandler`).
    var readsAllowed: Bool {
        channel.isWritable && !readsHeldForQueue.load(ordering: .relaxed) && !closing.load(ordering: .relaxed)
    }

    // MARK: Outbound

    /// Returns once the channel takes more writes (at once when it does), so
    /// a client that does not read its answers stops its own requests.
    func waitUntilWritable() async {
        if channel.isWritable { return }
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let ready = writableWaiters.withLockedValue { waiters -> Bool in
                // Checked again under the lock that `writabilityChanged` takes,
                // so a change between the two checks is never missed.
                if channel.isWritable || closing.load(ordering: .relaxed) || !channel.isActive { return true }
                waiters.append(continuation)
                return false
            }
            if ready { continuation.resume() }
        }
    }

    /// Called on the event loop when writability flips (or the channel closes).
    func writabilityChanged() {
        guard channel.isWritable || !channel.isActive else { return }
        let waiters = writableWaiters.withLockedValue { waiters in
            defer { waiters.removeAll() }
            return waiters
        }
        for waiter in waiters { waiter.resume() }
    }

    func closed() {
        let relays = upstreams.withLockedValue { table in
            defer { table.removeAll() }
            return Array(table.values)
        }
        for relay in relays { relay.close() }
        let waiters = writableWaiters.withLockedValue { waiters in
            closing.store(true, ordering: .relaxed)
            defer { waiters.removeAll() }
            return waiters
        }
        for waiter in waiters { waiter.resume() }
    }

    /// `flush: false` only on the event loop within a read batch; the
    /// connection handler flushes at the batch's end.
    func send(_ response: Wire.Response, flush: Bool = true) {
        write(Wire.Envelope(kind: .response(response)).frame(allocator: channel.allocator, maxPayload: limits.maxFrameBytes),
              id: response.id, flush: flush)
    }

    /// An OK response whose result was encoded before.
    func send(id: UInt64?, encoded: EncodedResult, flush: Bool = true) {
        write(encoded.responseFrame(id: id, allocator: channel.allocator, maxPayload: limits.maxFrameBytes), id: id, flush: flush)
    }

    private func write(_ framed: FrameResult, id: UInt64?, flush: Bool) {
        let frame: ByteBuffer
        switch framed {
        case let .framed(buffer):
            frame = buffer
        case let .tooLarge(size):
            // Never a frame larger than the limit the client was told.
            let refused = Wire.Response(id: id, code: StatusCode.resourceExhausted.rawValue, message:
                "the response is \(size) bytes, over max_frame_bytes (\(limits.maxFrameBytes)); page through turns with thread/turns/list")
            frame = Wire.Envelope(kind: .response(refused)).framed(allocator: channel.allocator)
        }
        metrics.frameOut(bytes: frame.readableBytes)
        if flush {
            channel.writeAndFlush(frame, promise: nil)
        } else {
            channel.write(frame, promise: nil)
        }
    }

    func notify(_ payload: Wire.Notification.Payload) {
        let method = payload.methodName
        let overLimit = state.withLockedValue { state -> String? in
            guard state.initialized, !closing.load(ordering: .relaxed), !state.optOut.contains(method) else { return nil }
            let notification = Wire.Notification(sequence: state.nextSequence, payload: payload)
            let frame: ByteBuffer
            switch Wire.Envelope(kind: .notification(notification)).frame(allocator: channel.allocator, maxPayload: limits.maxFrameBytes) {
            case let .framed(buffer):
                frame = buffer
            case let .tooLarge(size):
                // The sequence number is spent, so the client sees the gap
                // and the reason, and can read the item with thread/turns/list.
                state.nextSequence += 1
                let refused = Wire.Response(code: StatusCode.resourceExhausted.rawValue, message:
                    "notification \(notification.sequence ?? 0) (\(method)) is \(size) bytes, over max_frame_bytes (\(limits.maxFrameBytes)); not sent")
                let refusal = Wire.Envelope(kind: .response(refused)).framed(allocator: channel.allocator)
                metrics.frameOut(bytes: refusal.readableBytes)
                channel.writeAndFlush(refusal, promise: nil)
                return nil
            }
            let count = frame.readableBytes
            let backlog = notificationBacklog.load(ordering: .relaxed)
            if backlog + count > limits.maxNotificationBacklogBytes {
                closing.store(true, ordering: .relaxed)
                return "\(backlog) notification bytes are waiting for this connection to read them; max_notification_backlog_bytes is \(limits.maxNotificationBacklogBytes); closing"
            }
            state.nextSequence += 1
            notificationBacklog.add(count, ordering: .relaxed)
            metrics.frameOut(bytes: count)
            let promise = channel.eventLoop.makePromise(of: Void.self)
            promise.futureResult.whenComplete { [self] _ in notificationBacklog.subtract(count, ordering: .relaxed) }
            channel.writeAndFlush(frame, promise: promise)
            return nil
        }
        if let overLimit {
            metrics.slowSubscriberDisconnects.increment()
            close(code: .resourceExhausted, message: overLimit)
        }
    }

    /// A last response (a refusal that ends the connection), then close.
    func sendThenClose(_ response: Wire.Response) {
        closing.store(true, ordering: .relaxed)
        let frame = Wire.Envelope(kind: .response(response)).framed(allocator: channel.allocator)
        let channel = self.channel
        metrics.frameOut(bytes: frame.readableBytes)
        channel.writeAndFlush(frame).whenComplete { _ in channel.close(promise: nil) }
        channel.eventLoop.scheduleTask(in: .seconds(5)) { channel.close(promise: nil) }
    }

    /// A last error frame (a Response without id), then close. The close
    /// does not wait for a client that reads nothing.
    func close(code: StatusCode, message: String) {
        closing.store(true, ordering: .relaxed)
        let frame = Wire.Envelope(kind: .response(Wire.Response(code: code.rawValue, message: message))).framed(allocator: channel.allocator)
        let channel = self.channel
        metrics.frameOut(bytes: frame.readableBytes)
        channel.writeAndFlush(frame).whenComplete { _ in channel.close(promise: nil) }
        // Long enough for a client that reads slowly to reach the error frame.
        channel.eventLoop.scheduleTask(in: .seconds(5)) { channel.close(promise: nil) }
    }
}

/// Live connections by id; the engine's notification sink.
final class ConnectionRegistry: EventSink, Sendable {
    private let connections = NIOLockedValueBox([ConnectionID: Connection]())
    private let baseInstructions: @Sendable (ThreadRecord) -> String

    init(baseInstructions: @escaping @Sendable (ThreadRecord) -> String) {
        self.baseInstructions = baseInstructions
    }

    /// Adds the connection unless `limit` are open; the count after.
    func add(_ connection: Connection, limit: Int) -> Bool {
        connections.withLockedValue { table in
            guard table.count < limit else { return false }
            table[connection.id] = connection
            return true
        }
    }

    func remove(_ id: ConnectionID) { connections.withLockedValue { $0[id] = nil } }
    var all: [Connection] { connections.withLockedValue { Array($0.values) } }
    var count: Int { connections.withLockedValue { $0.count } }

    func deliver(_ deliveries: [Delivery]) {
        for delivery in deliveries where !delivery.recipients.isEmpty {
            let payload = NotificationMapping.payload(delivery.event, baseInstructions: baseInstructions)
            let targets = connections.withLockedValue { table in delivery.recipients.compactMap { table[$0] } }
            for connection in targets { connection.notify(payload) }
        }
    }
}

/// Stops reading a connection while its answers are not being taken (the
/// channel is not writable) or its request queue is full, and reads again
/// when both clear: the client's TCP window then pushes back on it.
final class FlowControlHandler: ChannelDuplexHandler, @unchecked Sendable {
    typealias InboundIn = NIOAny
    typealias OutboundIn = NIOAny

    private var context: ChannelHandlerContext?
    private var readPending = false
    var connection: Connection?
    private let metrics: ServerMetrics

    init(metrics: ServerMetrics) { self.metrics = metrics }

    func handlerAdded(context: ChannelHandlerContext) { self.context = context }
    func handlerRemoved(context: ChannelHandlerContext) { self.context = nil }

    func read(context: ChannelHandlerContext) {
        if let connection, !connection.readsAllowed {
            if !readPending { metrics.backpressurePauses.increment() }
            readPending = true
            return
        }
        context.read()
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        connection?.writabilityChanged()
        resumeIfAllowed()
        context.fireChannelWritabilityChanged()
    }

    /// On the event loop: issues the read that was held, if reads may go on.
    func resumeIfAllowed() {
        guard readPending, let context, connection?.readsAllowed ?? true else { return }
        readPending = false
        context.read()
    }
}

/// Outbound frames packed straight into the buffer the socket writes from:
/// header and payload in one allocation, no intermediate array.
enum FrameResult {
    case framed(ByteBuffer)
    case tooLarge(Int)
}

/// The bytes of a Response's result field, encoded once and reused: a
/// Response frame is then its id and code packed by protobuf-c, followed by
/// these bytes. protobuf-c writes fields in field-number order and every
/// result field comes after id (1) and code (2), so the frame is byte for byte
/// what packing the whole Response gives (a test checks).
struct EncodedResult: Sendable {
    let resultField: [UInt8]

    init(_ result: Wire.Response.Result) {
        resultField = Wire.Response(result: result).serializedBytes()
    }

    /// Envelope field 2 (response) as protobuf-c writes its key.
    private static let responseKey: [UInt8] = Array(Wire.Envelope(kind: .response(Wire.Response())).serializedBytes().dropLast())

    func responseFrame(id: UInt64?, allocator: ByteBufferAllocator, maxPayload: Int) -> FrameResult {
        Wire.Response(id: id, code: StatusCode.ok.rawValue).pack { headSize, writeHead in
            let responseSize = headSize + resultField.count
            let size = Self.responseKey.count + Self.varintSize(UInt64(responseSize)) + responseSize
            guard size <= maxPayload else { return .tooLarge(size) }
            var buffer = allocator.buffer(capacity: Framing.headerSize + size)
            buffer.writeFrameHeader(payloadSize: size)
            buffer.writeBytes(Self.responseKey)
            var length = UInt64(responseSize)
            while length >= 0x80 {
                buffer.writeInteger(UInt8(truncatingIfNeeded: length) | 0x80)
                length >>= 7
            }
            buffer.writeInteger(UInt8(length))
            buffer.writePacked(size: headSize, writeHead)
            buffer.writeBytes(resultField)
            return .framed(buffer)
        }
    }

    private static func varintSize(_ value: UInt64) -> Int {
        var size = 1
        var rest = value >> 7
        while rest > 0 { size += 1; rest >>= 7 }
        return size
    }
}

extension ByteBuffer {
    /// Flags (none) and the payload length: the frame header of docs/protocol.md.
    mutating func writeFrameHeader(payloadSize: Int) {
        writeInteger(UInt8(0))
        writeInteger(UInt32(payloadSize))
    }

    /// Lets protobuf-c pack `size` bytes straight into this buffer.
    mutating func writePacked(size: Int, _ write: (UnsafeMutableRawPointer) -> Void) {
        guard size > 0 else { return }
        writeWithUnsafeMutableBytes(minimumWritableBytes: size) { raw in
            write(raw.baseAddress!)
            return size
        }
    }
}

extension Wire.Envelope {
    func frame(allocator: ByteBufferAllocator, maxPayload: Int) -> FrameResult {
        pack { size, write in
            guard size <= maxPayload else { return .tooLarge(size) }
            var buffer = allocator.buffer(capacity: Framing.headerSize + size)
            buffer.writeFrameHeader(payloadSize: size)
            buffer.writePacked(size: size, write)
            return .framed(buffer)
        }
    }

    /// For small frames the server makes itself (errors), never over any limit.
    func framed(allocator: ByteBufferAllocator) -> ByteBuffer {
        guard case let .framed(buffer) = frame(allocator: allocator, maxPayload: .max) else { preconditionFailure("unbounded") }
        return buffer
    }
}
