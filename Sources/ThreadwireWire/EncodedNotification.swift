/// A notification's bytes encoded once per event and reused for every
/// subscriber (issue 28: fan-out): what differs per connection is only the
/// sequence number (field 1), which protobuf-c writes first, so a
/// connection's Envelope is the notification key, the length, the sequence
/// (written as protobuf-c packs it) and these bytes, byte for byte what
/// packing the whole Envelope gives (a test checks). Kept in the codec
/// module: nothing else writes protobuf keys or varints (`ProtoVarint`).
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

        /// Like `WireMessage.pack`: the size of the Envelope carrying this
        /// notification numbered `sequence`, and a writer of exactly that many bytes.
        @inlinable
        public func packEnvelope<R>(sequence: UInt64,
                                    _ body: (_ size: Int, _ write: (UnsafeMutableRawPointer) -> Void) throws -> R) rethrows -> R {
            // Notification field 1 (sequence): key, then value, both varints.
            let notificationSize = 1 + ProtoVarint.size(sequence) + self.body.count
            let size = 1 + ProtoVarint.size(UInt64(notificationSize)) + notificationSize
            return try body(size) { start in
                var cursor = start
                ProtoVarint.writeKey(field: 3, wireType: .lengthDelimited, to: &cursor)  // Envelope.notification
                ProtoVarint.write(UInt64(notificationSize), to: &cursor)
                ProtoVarint.writeKey(field: 1, wireType: .varint, to: &cursor)
                ProtoVarint.write(sequence, to: &cursor)
                self.body.withUnsafeBytes { bytes in
                    if bytes.count > 0 { cursor.copyMemory(from: bytes.baseAddress!, byteCount: bytes.count) }
                }
            }
        }
    }
}
