internal import CThreadwireProto

/// What a server reads from a client: an Envelope whose request is decoded
/// straight into a `Wire.Request`, not into `Envelope.Kind`, which keeps
/// its large cases in a box on the heap (one allocation per request, issue 54).
extension Wire.Envelope {
    public enum Inbound: Sendable, Equatable {
        case request(Wire.Request)
        /// Anything but a request, decoded as `Wire.Envelope` decodes it.
        case other(Wire.Envelope)
    }

    /// Decodes from borrowed bytes (a network buffer) without a copy: the
    /// same bytes accepted, the same values and the same errors as
    /// `init(serializedBytes:)`.
    public static func inbound(serializedBytes bytes: UnsafeRawBufferPointer) throws -> Inbound {
        let count = bytes.count
        return try CodecArena.withUnpackAllocator { allocator in
            guard let message = threadwire__v1__envelope__unpack(allocator, count, bytes.baseAddress?.assumingMemoryBound(to: UInt8.self)) else {
                throw WireError.malformed(type: protoName, byteCount: count)
            }
            defer { threadwire__v1__envelope__free_unpacked(message, allocator) }
            guard message.pointee.kind_case == THREADWIRE__V1__ENVELOPE__KIND_REQUEST else { return .other(try Self(c: message)) }
            do throws(WireError) {
                return .request(try Wire.Request(c: wireRequired(message.pointee.request)))
            } catch {
                throw error.nested(in: "request")
            }
        }
    }
}
