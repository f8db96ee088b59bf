/// The few messages of gRPC's standard services (grpc.health.v1 and
/// grpc.reflection.v1/v1alpha) that threadwire serves beside its own. They
/// are not part of proto/ (their packages are gRPC's), so they are read and
/// written here, in the codec module, the only one that handles protobuf.
public enum GRPCStandardMessages {
    public struct MalformedMessage: Error, CustomStringConvertible {
        public let description: String
    }

    // MARK: grpc.health.v1

    /// HealthCheckRequest { string service = 1; }
    public static func healthService(_ bytes: [UInt8]) throws -> String {
        var service = ""
        try ProtobufFields.read(bytes) { field, value in
            if field == 1, case let .bytes(data) = value { service = try ProtobufFields.string(data, field: "service") }
        }
        return service
    }

    public enum ServingStatus: UInt8, Sendable {
        case unknown = 0, serving = 1, notServing = 2, serviceUnknown = 3
    }

    /// HealthCheckResponse { ServingStatus status = 1; }
    public static func healthResponse(_ status: ServingStatus) -> [UInt8] {
        var out = ProtobufFields.Writer()
        out.varint(field: 1, UInt64(status.rawValue))
        return out.bytes
    }

    // MARK: grpc.reflection.v1 (v1alpha has the same messages)

    public enum ReflectionRequest: Equatable, Sendable {
        case fileByFilename(String)
        case fileContainingSymbol(String)
        case fileContainingExtension(type: String, number: Int32)
        case allExtensionNumbersOfType(String)
        case listServices
        /// None of the above (a newer field, or none set).
        case unknown
    }

    /// ServerReflectionRequest { string host = 1; oneof message_request {
    /// string file_by_filename = 3; string file_containing_symbol = 4;
    /// ExtensionRequest file_containing_extension = 5;
    /// string all_extension_numbers_of_type = 6; string list_services = 7; } }
    public static func reflectionRequest(_ bytes: [UInt8]) throws -> (host: String, request: ReflectionRequest) {
        var host = ""
        var request = ReflectionRequest.unknown
        try ProtobufFields.read(bytes) { field, value in
            guard case let .bytes(data) = value else { return }
            switch field {
            case 1: host = try ProtobufFields.string(data, field: "host")
            case 3: request = .fileByFilename(try ProtobufFields.string(data, field: "file_by_filename"))
            case 4: request = .fileContainingSymbol(try ProtobufFields.string(data, field: "file_containing_symbol"))
            case 5:
                // ExtensionRequest { string containing_type = 1; int32 extension_number = 2; }
                var type = ""
                var number: Int32 = 0
                try ProtobufFields.read(data) { inner, innerValue in
                    switch (inner, innerValue) {
                    case let (1, .bytes(name)): type = try ProtobufFields.string(name, field: "containing_type")
                    case let (2, .varint(value)): number = Int32(truncatingIfNeeded: value)
                    default: break
                    }
                }
                request = .fileContainingExtension(type: type, number: number)
            case 6: request = .allExtensionNumbersOfType(try ProtobufFields.string(data, field: "all_extension_numbers_of_type"))
            case 7: request = .listServices
            default: break
            }
        }
        return (host, request)
    }

    public enum ReflectionAnswer: Sendable {
        /// Serialized FileDescriptorProtos.
        case files([ArraySlice<UInt8>])
        case extensionNumbers(type: String)
        case services([String])
        case error(code: Int32, message: String)
    }

    /// ServerReflectionResponse { string valid_host = 1;
    /// ServerReflectionRequest original_request = 2; oneof message_response {
    /// FileDescriptorResponse file_descriptor_response = 4;
    /// ExtensionNumberResponse all_extension_numbers_response = 5;
    /// ListServiceResponse list_services_response = 6;
    /// ErrorResponse error_response = 7; } }
    public static func reflectionResponse(host: String, originalRequest: [UInt8], _ answer: ReflectionAnswer) -> [UInt8] {
        var out = ProtobufFields.Writer()
        if !host.isEmpty { out.bytes(field: 1, Array(host.utf8)) }
        out.bytes(field: 2, originalRequest)
        var inner = ProtobufFields.Writer()
        switch answer {
        case let .files(files):
            for file in files { inner.bytes(field: 1, Array(file)) }
            out.bytes(field: 4, inner.bytes)
        case let .extensionNumbers(type):
            inner.bytes(field: 1, Array(type.utf8))
            out.bytes(field: 5, inner.bytes)
        case let .services(names):
            for name in names {
                var service = ProtobufFields.Writer()
                service.bytes(field: 1, Array(name.utf8))
                inner.bytes(field: 1, service.bytes)
            }
            out.bytes(field: 6, inner.bytes)
        case let .error(code, message):
            inner.varint(field: 1, UInt64(UInt32(bitPattern: code)))
            inner.bytes(field: 2, Array(message.utf8))
            out.bytes(field: 7, inner.bytes)
        }
        return out.bytes
    }
}

extension Wire.Envelope {
    /// The Notification inside a serialized Envelope that carries one, as
    /// its own message's bytes (a gRPC stream sends it without a second
    /// encoding); nil for any other envelope.
    public static func notificationBytes(_ envelope: ArraySlice<UInt8>) -> ArraySlice<UInt8>? {
        var result: ArraySlice<UInt8>?
        do {
            try ProtobufFields.read(envelope) { field, value in
                if field == 3, case let .bytes(data) = value { result = data }
            }
        } catch {
            return nil
        }
        return result
    }
}

/// Protobuf's wire format, as far as the messages above need it.
enum ProtobufFields {
    enum Value {
        case varint(UInt64)
        case bytes(ArraySlice<UInt8>)
        case fixed
    }

    /// Calls `body` with each field of `bytes`, in order; throws on a
    /// truncated or malformed message (never reads past its end).
    static func read(_ bytes: [UInt8], _ body: (Int, Value) throws -> Void) throws {
        try read(bytes[...], body)
    }

    static func read(_ bytes: ArraySlice<UInt8>, _ body: (Int, Value) throws -> Void) throws {
        var at = bytes.startIndex
        let end = bytes.endIndex
        func varint() throws -> UInt64 {
            var value: UInt64 = 0
            var shift: UInt64 = 0
            while true {
                guard at < end, shift < 64 else { throw GRPCStandardMessages.MalformedMessage(description: "a varint is truncated or too long") }
                let byte = bytes[at]
                at += 1
                value |= UInt64(byte & 0x7F) << shift
                if byte < 0x80 { return value }
                shift += 7
            }
        }
        while at < end {
            let key = try varint()
            let field = Int(truncatingIfNeeded: key >> 3)
            guard field > 0 else { throw GRPCStandardMessages.MalformedMessage(description: "field number 0") }
            switch key & 7 {
            case 0:
                try body(field, .varint(try varint()))
            case 1, 5:
                let size = key & 7 == 1 ? 8 : 4
                guard end - at >= size else { throw GRPCStandardMessages.MalformedMessage(description: "a fixed field is truncated") }
                at += size
                try body(field, .fixed)
            case 2:
                let length = try varint()
                guard length <= UInt64(end - at) else {
                    throw GRPCStandardMessages.MalformedMessage(description: "a length-delimited field runs past the message")
                }
                let fieldEnd = at + Int(length)
                try body(field, .bytes(bytes[at..<fieldEnd]))
                at = fieldEnd
            default:
                throw GRPCStandardMessages.MalformedMessage(description: "wire type \(key & 7) is not supported")
            }
        }
    }

    static func string(_ bytes: ArraySlice<UInt8>, field: String) throws -> String {
        guard let text = String(validating: bytes, as: UTF8.self) else {
            throw GRPCStandardMessages.MalformedMessage(description: "\(field) is not valid UTF-8")
        }
        return text
    }

    struct Writer {
        var bytes: [UInt8] = []

        mutating func varint(_ value: UInt64) {
            var value = value
            while value >= 0x80 {
                bytes.append(UInt8(truncatingIfNeeded: value) | 0x80)
                value >>= 7
            }
            bytes.append(UInt8(value))
        }

        mutating func varint(field: Int, _ value: UInt64) {
            varint(UInt64(field) << 3)
            varint(value)
        }

        mutating func bytes(field: Int, _ data: [UInt8]) {
            varint(UInt64(field) << 3 | 2)
            varint(UInt64(data.count))
            bytes += data
        }
    }
}
