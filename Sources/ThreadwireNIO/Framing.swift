public import NIOCore
import Synchronization

/// gRPC-style framing: 1 flags byte + 4-byte big-endian length + payload.
public enum Framing {
    public static let headerSize = 5
    public static let defaultMaxFrameBytes = 4 * 1024 * 1024
    /// Bit 0 ("compressed") is reserved until a compression is negotiated;
    /// no other bit is defined, so every flag bit must be 0.
    public static let definedFlags: UInt8 = 0

    /// One whole frame's header and payload bytes.
    public static func frame(_ payload: [UInt8]) -> [UInt8] {
        var buffer = ByteBuffer()
        buffer.reserveCapacity(headerSize + payload.count)
        buffer.writeFrameHeader(payloadSize: payload.count)
        buffer.writeBytes(payload)
        return Array(buffer.readableBytesView)
    }
}

/// A protocol violation in the byte stream: the connection cannot continue
/// because the frame boundary is lost.
public enum FrameError: Error, Equatable, CustomStringConvertible {
    case undefinedFlags(UInt8)
    case frameTooLarge(length: Int, limit: Int)
    case truncated(bufferedBytes: Int)
    case partialFramesOverBudget(limit: Int)

    public var description: String {
        switch self {
        case let .undefinedFlags(flags):
            return "frame flags 0x\(String(flags, radix: 16)) set undefined bits (compression is not negotiated; flags must be 0)"
        case let .frameTooLarge(length, limit):
            return "frame length \(length) exceeds the maximum of \(limit) bytes"
        case let .truncated(count):
            return "connection closed in the middle of a frame (\(count) bytes buffered)"
        case let .partialFramesOverBudget(limit):
            return "incomplete frames held across all connections would pass max_partial_frame_bytes (\(limit) bytes); send each frame whole and promptly"
        }
    }
}

/// Bytes of incomplete frames held by every decoder that shares it, so many
/// connections each trickling a large frame cannot pin unbounded memory.
public final class PartialFrameBudget: Sendable {
    public let limit: Int
    private let held = Atomic<Int>(0)

    public init(limit: Int) { self.limit = limit }

    public var heldBytes: Int { held.load(ordering: .relaxed) }

    /// Takes `bytes` more; false (and nothing taken) if that passes the limit.
    func reserve(_ bytes: Int) -> Bool {
        var current = held.load(ordering: .relaxed)
        while true {
            guard current + bytes <= limit else { return false }
            let (exchanged, original) = held.compareExchange(expected: current, desired: current + bytes, ordering: .relaxed)
            if exchanged { return true }
            current = original
        }
    }

    func release(_ bytes: Int) {
        if bytes > 0 { held.subtract(bytes, ordering: .relaxed) }
    }
}

/// One decoder's share of a `PartialFrameBudget`: the bytes of frames not
/// yet complete it holds now, given back when it changes or goes.
public struct PartialFrameShare {
    private let budget: PartialFrameBudget?
    private var reserved = 0

    public init(_ budget: PartialFrameBudget?) { self.budget = budget }

    /// Brings this share to `held` bytes; throws (nothing more taken) when
    /// that passes the budget.
    public mutating func hold(_ held: Int) throws {
        guard let budget else { return }
        if held > reserved {
            guard budget.reserve(held - reserved) else { throw FrameError.partialFramesOverBudget(limit: budget.limit) }
        } else {
            budget.release(reserved - held)
        }
        reserved = held
    }

    public mutating func releaseAll() {
        budget?.release(reserved)
        reserved = 0
    }
}

/// One connection's frame size limit, which can change while it is open: a
/// server that authenticates accepts only small frames until `initialize`
/// succeeds, then raises it.
public final class FrameSizeLimit: Sendable {
    private let bytes: Atomic<Int>
    public init(_ bytes: Int) { self.bytes = Atomic(bytes) }
    public var current: Int { bytes.load(ordering: .relaxed) }
    public func raise(to bytes: Int) { self.bytes.store(bytes, ordering: .relaxed) }
}

/// Splits the stream into frame payloads. The length is checked against the
/// limit from the header alone, before any payload is buffered.
public struct FrameDecoder: ByteToMessageDecoder {
    public typealias InboundOut = ByteBuffer

    private let limit: FrameSizeLimit
    private var share: PartialFrameShare

    public var maxFrameBytes: Int { limit.current }

    public init(maxFrameBytes: Int = Framing.defaultMaxFrameBytes, budget: PartialFrameBudget? = nil) {
        self.init(limit: FrameSizeLimit(maxFrameBytes), budget: budget)
    }

    public init(limit: FrameSizeLimit, budget: PartialFrameBudget? = nil) {
        self.limit = limit
        share = PartialFrameShare(budget)
    }

    public mutating func decode(context: ChannelHandlerContext, buffer: inout ByteBuffer) throws -> DecodingState {
        guard let payload = try Self.nextFrame(&buffer, maxFrameBytes: maxFrameBytes) else {
            try share.hold(buffer.readableBytes)
            return .needMoreData
        }
        context.fireChannelRead(Self.wrapInboundOut(payload))
        // The handler may not call again on an empty buffer: a finished
        // frame's bytes leave the budget now.
        if buffer.readableBytes == 0 { try share.hold(0) }
        return .continue
    }

    public mutating func decoderRemoved(context: ChannelHandlerContext) {
        share.releaseAll()
    }

    public mutating func decodeLast(context: ChannelHandlerContext, buffer: inout ByteBuffer, seenEOF: Bool) throws -> DecodingState {
        while try decode(context: context, buffer: &buffer) == .continue {}
        if buffer.readableBytes > 0 {
            let count = buffer.readableBytes
            buffer.moveReaderIndex(forwardBy: count)
            throw FrameError.truncated(bufferedBytes: count)
        }
        return .needMoreData
    }

    /// The next complete payload, nil if more bytes are needed (the buffer is then untouched).
    public static func nextFrame(_ buffer: inout ByteBuffer, maxFrameBytes: Int) throws -> ByteBuffer? {
        guard let flags: UInt8 = buffer.getInteger(at: buffer.readerIndex) else { return nil }
        if flags & ~Framing.definedFlags != 0 { throw FrameError.undefinedFlags(flags) }
        guard let length: UInt32 = buffer.getInteger(at: buffer.readerIndex + 1) else { return nil }
        if Int(length) > maxFrameBytes { throw FrameError.frameTooLarge(length: Int(length), limit: maxFrameBytes) }
        guard buffer.readableBytes >= Framing.headerSize + Int(length) else { return nil }
        buffer.moveReaderIndex(forwardBy: Framing.headerSize)
        return buffer.readSlice(length: Int(length))
    }
}

/// Frames outbound payloads (serialized envelopes).
public struct FrameEncoder: MessageToByteEncoder {
    public typealias OutboundIn = [UInt8]

    public init() {}

    public func encode(data: [UInt8], out: inout ByteBuffer) throws {
        out.reserveCapacity(Framing.headerSize + data.count)
        out.writeFrameHeader(payloadSize: data.count)
        out.writeBytes(data)
    }
}

/// The server's frame decoder as one concrete handler: what
/// `ByteToMessageHandler(FrameDecoder(…))` does, the same limits, budget and
/// errors, without the generic handler's per-read cost (its unspecialized
/// decode loop, metadata and witness lookups were about 5 % of the server's
/// CPU per request in issue 54's profiles). Each complete payload is passed
/// on as it is found; the bytes of a frame not yet complete are kept (and
/// counted against the shared budget) until the rest arrives. A protocol
/// violation is passed on once as an error, and nothing read after it is.
public final class FrameSplitter: ChannelInboundHandler {
    public typealias InboundIn = ByteBuffer
    public typealias InboundOut = ByteBuffer

    private enum State {
        case reading
        /// Inside a pass over a read: a close that happens there ends the pass.
        case splitting
        /// A violation was passed on, or the channel went inactive: bytes are dropped.
        case done
    }

    private let limit: FrameSizeLimit
    private var share: PartialFrameShare
    private var state = State.reading
    /// What is left of earlier reads: the start of a frame not yet complete.
    private var pending: ByteBuffer?

    public init(limit: FrameSizeLimit, budget: PartialFrameBudget? = nil) {
        self.limit = limit
        share = PartialFrameShare(budget)
    }

    public convenience init(maxFrameBytes: Int = Framing.defaultMaxFrameBytes, budget: PartialFrameBudget? = nil) {
        self.init(limit: FrameSizeLimit(maxFrameBytes), budget: budget)
    }

    public func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch state {
        case .done:
            return
        case .splitting:
            // Read again from inside a pass (a handler after this one
            // read synchronously): split after what the pass holds.
            append(unwrapInboundIn(data))
            return
        case .reading:
            append(unwrapInboundIn(data))
        }
        state = .splitting
        do {
            while var buffer = pending {
                pending = nil
                while let payload = try FrameDecoder.nextFrame(&buffer, maxFrameBytes: limit.current) {
                    context.fireChannelRead(wrapInboundOut(payload))
                    // The handlers after this one closed the channel.
                    guard case .splitting = state else { return }
                }
                // What is left is the start of an incomplete frame (or nothing).
                guard let later = pending else {
                    if buffer.readableBytes > 0 { keep(buffer, context: context) }
                    break
                }
                // Bytes read from inside the pass follow it: split them too.
                if buffer.readableBytes > 0 {
                    buffer.writeImmutableBuffer(later)
                    pending = buffer
                }
            }
            try share.hold(pending?.readableBytes ?? 0)
            state = .reading
        } catch {
            fail(context: context, error)
        }
    }

    private func append(_ buffer: ByteBuffer) {
        guard var earlier = pending else {
            pending = buffer
            return
        }
        pending = nil  // `earlier` the only reference: appended in place
        earlier.writeImmutableBuffer(buffer)
        pending = earlier
    }

    /// Keeps the start of an incomplete frame. A few bytes left at the end
    /// of a large read buffer are copied out, so that they do not hold the
    /// whole buffer: the budget counts only the bytes.
    private func keep(_ rest: ByteBuffer, context: ChannelHandlerContext) {
        guard rest.storageCapacity > 1024, rest.storageCapacity > 4 * rest.readableBytes else {
            pending = rest
            return
        }
        var copy = context.channel.allocator.buffer(capacity: rest.readableBytes)
        copy.writeImmutableBuffer(rest)
        pending = copy
    }

    public func channelInactive(context: ChannelHandlerContext) {
        if case .reading = state { finishInput(context: context) }
        state = .done
        pending = nil
        share.releaseAll()
        context.fireChannelInactive()
    }

    public func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        // A half-closed input ends the stream as a close does.
        if case ChannelEvent.inputClosed = event, case .reading = state {
            finishInput(context: context)
            state = .done
        }
        context.fireUserInboundEventTriggered(event)
    }

    public func handlerRemoved(context: ChannelHandlerContext) {
        state = .done
        pending = nil
        share.releaseAll()
    }

    /// The stream ended: bytes of a frame that will never be complete are a truncated frame.
    private func finishInput(context: ChannelHandlerContext) {
        guard let left = pending, left.readableBytes > 0 else { return }
        pending = nil
        fail(context: context, FrameError.truncated(bufferedBytes: left.readableBytes))
    }

    private func fail(context: ChannelHandlerContext, _ error: any Error) {
        state = .done
        pending = nil
        share.releaseAll()
        context.fireErrorCaught(error)
    }
}
