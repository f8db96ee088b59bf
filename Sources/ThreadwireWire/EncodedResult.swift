/// The bytes of a Response's result field, encoded once and reused (a
/// thread/read of an unchanged snapshot): an OK Response's envelope is then
/// its id and code packed by protobuf-c, followed by these bytes.
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

        /// Envelope field 2 (response) as protobuf-c writes its key.
        private static let responseKey: [UInt8] = Array(Wire.Envelope(kind: .response(Wire.Response())).serializedBytes().dropLast())

        /// Like `WireMessage.pack`: the size of the Envelope that carries an OK
        /// Response with `id` and this result, and a writer of exactly that many bytes.
        public func packResponse<R>(id: UInt64?, code: UInt32 = 0,
                                    _ body: (_ size: Int, _ write: (UnsafeMutableRawPointer) -> Void) throws -> R) rethrows -> R {
            try Wire.Response(id: id, code: code).pack { headSize, packHead in
                try withoutActuallyEscaping(packHead) { writeHead in
                let responseSize = headSize + resultField.count
                var lengthVarint: [UInt8] = []
                var length = UInt64(responseSize)
                while length >= 0x80 {
                    lengthVarint.append(UInt8(truncatingIfNeeded: length) | 0x80)
                    length >>= 7
                }
                lengthVarint.append(UInt8(length))
                let size = Self.responseKey.count + lengthVarint.count + responseSize
                return try body(size) { start in
                    var cursor = start
                    for part in [Self.responseKey, lengthVarint] {
                        part.withUnsafeBytes { cursor.copyMemory(from: $0.baseAddress!, byteCount: $0.count) }
                        cursor += part.count
                    }
                    if headSize > 0 { writeHead(cursor) }
                    cursor += headSize
                    resultField.withUnsafeBytes { bytes in
                        if bytes.count > 0 { cursor.copyMemory(from: bytes.baseAddress!, byteCount: bytes.count) }
                    }
                }
                }
            }
        }
    }
}
