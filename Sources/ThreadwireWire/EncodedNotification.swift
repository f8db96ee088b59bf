/// A notification's bytes encoded once per event and reused for every
/// subscriber (issue 28: fan-out): what differs per connection is only the
/// sequence number (field 1), which protobuf-c writes first, so a
/// connection's Envelope is the notification key, the length, the packed
/// sequence and these bytes, byte for byte what packing the whole Envelope
/// gives (a test checks). Kept in the codec module: nothing else writes
/// protobuf keys or varints.
extension Wire {
    public struct EncodedNotification: Sendable {
        /// The Notification without its sequence: metadata and payload fields.
        public let body: [UInt8]
        public let methodName: String

        public init(_ payload: Wire.Notification.Payload, metadata: [Wire.KeyValue] = [], threadSequence: UInt64? = nil) {
            body = Wire.Notification(metadata: metadata, threadSequence: threadSequence, payload: payload).serializedBytes()
            methodName = payload.methodName
        }

        /// A body encoded earlier (a kept event) whose method is known.
        public init(body: [UInt8], methodName: String) {
            self.body = body
            self.methodName = methodName
        }

        /// A body stored earlier (a kept event); its method is read from it.
        public init(storedBody: [UInt8]) {
            body = storedBody
            methodName = (try? Wire.Notification(serializedBytes: storedBody))?.payload?.methodName ?? "unknown"
        }

        /// Envelope field 3 (notification) as protobuf-c writes its key.
        private static let notificationKey: [UInt8] =
            Array(Wire.Envelope(kind: .notification(Wire.Notification())).serializedBytes().dropLast())

        /// Like `WireMessage.pack`: the size of the Envelope carrying this
        /// notification numbered `sequence`, and a writer of exactly that many bytes.
        public func packEnvelope<R>(sequence: UInt64,
                                    _ body: (_ size: Int, _ write: (UnsafeMutableRawPointer) -> Void) throws -> R) rethrows -> R {
            try Wire.Notification(sequence: sequence).pack { headSize, packHead in
                try withoutActuallyEscaping(packHead) { writeHead in
                    let notificationSize = headSize + self.body.count
                    var lengthVarint: [UInt8] = []
                    var length = UInt64(notificationSize)
                    while length >= 0x80 {
                        lengthVarint.append(UInt8(truncatingIfNeeded: length) | 0x80)
                        length >>= 7
                    }
                    lengthVarint.append(UInt8(length))
                    let size = Self.notificationKey.count + lengthVarint.count + notificationSize
                    return try body(size) { start in
                        var cursor = start
                        for part in [Self.notificationKey, lengthVarint] {
                            part.withUnsafeBytes { cursor.copyMemory(from: $0.baseAddress!, byteCount: $0.count) }
                            cursor += part.count
                        }
                        if headSize > 0 { writeHead(cursor) }
                        cursor += headSize
                        self.body.withUnsafeBytes { bytes in
                            if bytes.count > 0 { cursor.copyMemory(from: bytes.baseAddress!, byteCount: bytes.count) }
                        }
                    }
                }
            }
        }
    }
}
