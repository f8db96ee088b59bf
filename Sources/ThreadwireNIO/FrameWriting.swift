public import NIOCore

/// An outbound frame packed straight into the buffer the socket writes
/// from (header and payload in one allocation), or the size that was over
/// the limit the peer was told.
public enum FrameResult {
    case framed(ByteBuffer)
    case tooLarge(Int)
}

extension Framing {
    /// Flags (none) and the payload length, big-endian: the frame header of
    /// docs/protocol.md. The one place it is written.
    static func storeHeader(payloadSize: Int, at start: UnsafeMutableRawPointer) {
        start.storeBytes(of: UInt8(0), as: UInt8.self)
        (start + 1).storeBytes(of: UInt32(payloadSize).bigEndian, as: UInt32.self)
    }
}

extension ByteBuffer {
    public mutating func writeFrameHeader(payloadSize: Int) {
        writeWithUnsafeMutableBytes(minimumWritableBytes: Framing.headerSize) { raw in
            Framing.storeHeader(payloadSize: payloadSize, at: raw.baseAddress!)
            return Framing.headerSize
        }
    }

    /// The frame header, then `size` payload bytes that `write` puts at a
    /// pointer: one reservation and one move of the writer index for both
    /// (the header's two integers written apart were a tenth of an answer's
    /// framing, issue 54).
    mutating func writeFrame(payloadSize size: Int, _ write: (UnsafeMutableRawPointer) -> Void) {
        writeWithUnsafeMutableBytes(minimumWritableBytes: Framing.headerSize + size) { raw in
            let start = raw.baseAddress!
            Framing.storeHeader(payloadSize: size, at: start)
            if size > 0 { write(start + Framing.headerSize) }
            return Framing.headerSize + size
        }
    }
}

extension ByteBufferAllocator {
    /// A frame of a payload that a packer writes itself (protobuf-c's
    /// `pack`: its size, then a writer of exactly that many bytes), refused
    /// rather than built when the payload is over `maxPayload`.
    public func frame(maxPayload: Int,
                      packing pack: ((_ size: Int, _ write: (UnsafeMutableRawPointer) -> Void) -> FrameResult) -> FrameResult) -> FrameResult {
        pack { size, write in
            guard size <= maxPayload else { return .tooLarge(size) }
            var buffer = self.buffer(capacity: Framing.headerSize + size)
            buffer.writeFrame(payloadSize: size, write)
            return .framed(buffer)
        }
    }
}

/// Frames a connection's small answers in one buffer, used again once the
/// socket has taken the last frame written from it: a closed-loop client's
/// request then costs no allocation for its answer (two per answer before:
/// the buffer's storage object and its bytes, issue 54). While a write still
/// holds the buffer (a client that is slow to read, answers pipelined in one
/// read), a frame gets storage of its own, exactly its size, as before; so
/// unsent bytes are never held in larger allocations than they need.
/// Frames over `reusableBytes` always get their own, and an idle
/// connection keeps at most `reusableBytes` for its next answer.
///
/// Confined to the connection's event loop.
public struct ReusedFrameBuffer {
    public static let defaultReusableBytes = 1024
    private var spare: ByteBuffer?
    private let reusableBytes: Int

    public init(reusableBytes: Int = defaultReusableBytes) {
        self.reusableBytes = reusableBytes
    }

    /// As `ByteBufferAllocator.frame(maxPayload:packing:)`.
    public mutating func frame(allocator: ByteBufferAllocator, maxPayload: Int,
                               packing pack: ((_ size: Int, _ write: (UnsafeMutableRawPointer) -> Void) -> FrameResult) -> FrameResult) -> FrameResult {
        pack { size, write in
            guard size <= maxPayload else { return .tooLarge(size) }
            let total = Framing.headerSize + size
            guard total <= reusableBytes else {
                var own = allocator.buffer(capacity: total)
                own.writeFrame(payloadSize: size, write)
                return .framed(own)
            }
            // Taken, not copied: a copy would make the storage look shared
            // and `clear` would always allocate.
            var buffer = spare.take() ?? allocator.buffer(capacity: total)
            // The same storage unless a write still holds it (then new storage of `total` bytes).
            buffer.clear(minimumCapacity: total)
            buffer.writeFrame(payloadSize: size, write)
            spare = buffer
            return .framed(buffer)
        }
    }
}
