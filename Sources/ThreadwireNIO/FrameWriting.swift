public import NIOCore

/// An outbound frame packed straight into the buffer the socket writes
/// from (header and payload in one allocation), or the size that was over
/// the limit the peer was told.
public enum FrameResult {
    case framed(ByteBuffer)
    case tooLarge(Int)
}

extension ByteBuffer {
    /// Flags (none) and the payload length: the frame header of
    /// docs/protocol.md. The one place it is written.
    public mutating func writeFrameHeader(payloadSize: Int) {
        writeInteger(UInt8(0))
        writeInteger(UInt32(payloadSize))
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
            buffer.writeFrameHeader(payloadSize: size)
            if size > 0 {
                buffer.writeWithUnsafeMutableBytes(minimumWritableBytes: size) { raw in
                    write(raw.baseAddress!)
                    return size
                }
            }
            return .framed(buffer)
        }
    }
}
