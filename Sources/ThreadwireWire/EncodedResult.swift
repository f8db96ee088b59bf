/// The bytes of a Response's result field, encoded once and reused (a
/// thread/read of an unchanged snapshot): an OK Response's envelope is then
/// its id and code, written as protobuf-c packs them, followed by these bytes.
/// protobuf-c writes fields in field-number order and every result field
/// comes after id (1) and code (2), so the payload is byte for byte what
/// packing the whole Envelope gives (a test checks). Kept in the codec
/// module: nothing else writes protobuf keys or varints.
extension Wire {
    public struct EncodedResult: Sendable {
        public let resultField: [UInt8]

        public init(_ result: Wire.Response.Result) {
            resultField = Wire.Response(result: result).serializedBytes()
        }

        /// The result's own message (a gRPC response): `resultField` is its
        /// oneof field's key and length, then these bytes.
        public var messageBytes: ArraySlice<UInt8> {
            var at = resultField.startIndex
            for _ in 0..<2 {  // the key's varint, then the length's
                while at < resultField.endIndex, resultField[at] & 0x80 != 0 { at += 1 }
                at += 1
            }
            return resultField[min(at, resultField.endIndex)...]
        }

        /// Like `WireMessage.pack`: the size of the Envelope that carries an OK
        /// Response with `id` and this result, and a writer of exactly that many bytes.
        /// Written here rather than packed by protobuf-c: the head is two
        /// varint fields, and packing them took a codec arena and two arrays
        /// per response (issue 54).
        @inlinable
        public func packResponse<R>(id: UInt64?, code: UInt32 = 0,
                                    _ body: (_ size: Int, _ write: (UnsafeMutableRawPointer) -> Void) throws -> R) rethrows -> R {
            // Response fields 1 (id) and 2 (code) as protobuf-c writes a set
            // proto2 optional: key, then value, both varints.
            let headSize = (id.map { 1 + ProtoVarint.size($0) } ?? 0) + 1 + ProtoVarint.size(UInt64(code))
            let responseSize = headSize + resultField.count
            let size = 1 + ProtoVarint.size(UInt64(responseSize)) + responseSize
            return try body(size) { start in
                var cursor = start
                ProtoVarint.writeKey(field: 2, wireType: .lengthDelimited, to: &cursor)  // Envelope.response
                ProtoVarint.write(UInt64(responseSize), to: &cursor)
                if let id {
                    ProtoVarint.writeKey(field: 1, wireType: .varint, to: &cursor)
                    ProtoVarint.write(id, to: &cursor)
                }
                ProtoVarint.writeKey(field: 2, wireType: .varint, to: &cursor)
                ProtoVarint.write(UInt64(code), to: &cursor)
                resultField.withUnsafeBytes { bytes in
                    if bytes.count > 0 { cursor.copyMemory(from: bytes.baseAddress!, byteCount: bytes.count) }
                }
            }
        }
    }
}

/// Protobuf's keys and base-128 varints, for the frames spliced around bytes
/// encoded once (`EncodedResult`, `EncodedNotification`); tests check them
/// byte for byte against protobuf-c's packing of the whole message.
/// Inlinable with their callers, so the server's frame writer gets them
/// specialized rather than through generic entry points.
@usableFromInline
enum ProtoVarint {
    @usableFromInline
    enum WireType: UInt64 {
        case varint = 0
        case lengthDelimited = 2
    }

    /// Bytes `value` takes: one per 7 bits, at least one.
    @inlinable @inline(__always)
    static func size(_ value: UInt64) -> Int {
        (64 - (value | 1).leadingZeroBitCount + 6) / 7
    }

    @inlinable @inline(__always)
    static func write(_ value: UInt64, to cursor: inout UnsafeMutableRawPointer) {
        var rest = value
        while rest >= 0x80 {
            cursor.storeBytes(of: UInt8(truncatingIfNeeded: rest) | 0x80, as: UInt8.self)
            cursor += 1
            rest >>= 7
        }
        cursor.storeBytes(of: UInt8(rest), as: UInt8.self)
        cursor += 1
    }

    /// A key of a field under 16 (one byte).
    @inlinable @inline(__always)
    static func writeKey(field: UInt64, wireType: WireType, to cursor: inout UnsafeMutableRawPointer) {
        write(field << 3 | wireType.rawValue, to: &cursor)
    }
}
