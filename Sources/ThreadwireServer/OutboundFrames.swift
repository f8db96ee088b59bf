import NIOCore
import ThreadwireNIO
import ThreadwireWire

extension Wire.Envelope {
    /// This envelope as one frame, unless its payload is over `maxPayload`.
    func frame(allocator: ByteBufferAllocator, maxPayload: Int) -> FrameResult {
        allocator.frame(maxPayload: maxPayload) { pack($0) }
    }

    /// For small frames the server makes itself (errors), never over any limit.
    func framed(allocator: ByteBufferAllocator) -> ByteBuffer {
        guard case let .framed(buffer) = frame(allocator: allocator, maxPayload: .max) else { preconditionFailure("unbounded") }
        return buffer
    }
}

extension Wire.EncodedNotification {
    /// A Notification frame numbered `sequence`, from bytes encoded once for every subscriber.
    func notificationFrame(sequence: UInt64, allocator: ByteBufferAllocator, maxPayload: Int) -> FrameResult {
        allocator.frame(maxPayload: maxPayload) { packEnvelope(sequence: sequence, $0) }
    }
}
