import Foundation

/// Messages known only from a serialized `google.protobuf.FileDescriptorSet`
/// (what `reflection/descriptors` returns), encoded from and decoded to JSON
/// with the .proto field names, as protobuf's JSON mapping writes them. It
/// lets a tool call a method its own compiled contract does not have. Pure
/// Swift over the wire format: proto2 scalars, enums, strings, bytes,
/// messages, repeated fields (packed or not on input).
public struct DynamicSchema: Sendable {
    public struct Field: Sendable {
        public let name: String
        public let number: Int
        public let type: Int  // google.protobuf.FieldDescriptorProto.Type
        public let repeated: Bool
        public let typeName: String  // ".pkg.Message" for messages and enums
    }

    public struct Message: Sendable {
        public let fullName: String
        public let fields: [Field]
        var byName: [String: Field] { Dictionary(fields.map { ($0.name, $0) }, uniquingKeysWith: { first, _ in first }) }
    }

    public private(set) var messages: [String: Message] = [:]  // by full name without the leading dot
    public private(set) var enums: [String: [(name: String, number: Int32)]] = [:]

    public init(fileDescriptorSet bytes: [UInt8]) throws {
        var set = ProtoReader(bytes)
        while let (number, value) = try set.next() {
            guard number == 1, case let .bytes(file) = value else { continue }
            try addFile(file)
        }
    }

    private mutating func addFile(_ bytes: [UInt8]) throws {
        var reader = ProtoReader(bytes)
        var package = ""
        var messageBytes: [[UInt8]] = []
        var enumBytes: [[UInt8]] = []
        while let (number, value) = try reader.next() {
            switch (number, value) {
            case let (2, .bytes(text)): package = String(decoding: text, as: UTF8.self)
            case let (4, .bytes(message)): messageBytes.append(message)
            case let (5, .bytes(enumeration)): enumBytes.append(enumeration)
            default: break
            }
        }
        let prefix = package.isEmpty ? "" : package + "."
        for message in messageBytes { try addMessage(message, prefix: prefix) }
        for enumeration in enumBytes { try addEnum(enumeration, prefix: prefix) }
    }

    private mutating func addMessage(_ bytes: [UInt8], prefix: String) throws {
        var reader = ProtoReader(bytes)
        var name = ""
        var fields: [Field] = []
        var nested: [[UInt8]] = []
        var nestedEnums: [[UInt8]] = []
        while let (number, value) = try reader.next() {
            switch (number, value) {
            case let (1, .bytes(text)): name = String(decoding: text, as: UTF8.self)
            case let (2, .bytes(field)): fields.append(try Self.field(field))
            case let (3, .bytes(message)): nested.append(message)
            case let (4, .bytes(enumeration)): nestedEnums.append(enumeration)
            default: break
            }
        }
        let fullName = prefix + name
        messages[fullName] = Message(fullName: fullName, fields: fields)
        for message in nested { try addMessage(message, prefix: fullName + ".") }
        for enumeration in nestedEnums { try addEnum(enumeration, prefix: fullName + ".") }
    }

    private static func field(_ bytes: [UInt8]) throws -> Field {
        var reader = ProtoReader(bytes)
        var name = "", typeName = ""
        var number = 0, type = 0, label = 1
        while let (field, value) = try reader.next() {
            switch (field, value) {
            case let (1, .bytes(text)): name = String(decoding: text, as: UTF8.self)
            case let (3, .varint(value)): number = Int(value)
            case let (4, .varint(value)): label = Int(value)
            case let (5, .varint(value)): type = Int(value)
            case let (6, .bytes(text)): typeName = String(decoding: text, as: UTF8.self)
            default: break
            }
        }
        return Field(name: name, number: number, type: type, repeated: label == 3, typeName: typeName)
    }

    private mutating func addEnum(_ bytes: [UInt8], prefix: String) throws {
        var reader = ProtoReader(bytes)
        var name = ""
        var values: [(name: String, number: Int32)] = []
        while let (number, value) = try reader.next() {
            switch (number, value) {
            case let (1, .bytes(text)): name = String(decoding: text, as: UTF8.self)
            case let (2, .bytes(valueBytes)):
                var valueReader = ProtoReader(valueBytes)
                var valueName = ""
                var valueNumber: Int32 = 0
                while let (field, item) = try valueReader.next() {
                    if field == 1, case let .bytes(text) = item { valueName = String(decoding: text, as: UTF8.self) }
                    if field == 2, case let .varint(raw) = item { valueNumber = Int32(truncatingIfNeeded: raw) }
                }
                values.append((valueName, valueNumber))
            default: break
            }
        }
        enums[prefix + name] = values
    }

    // MARK: JSON -> bytes

    /// `json` (an object with .proto field names) as a serialized `type`.
    public func encode(_ json: JSONValue, as type: String, path: String = "") throws -> [UInt8] {
        guard let message = messages[type] else { throw WireError.invalidJSON(path: path, reason: "the schema has no message \(type)") }
        guard case let .object(members) = json else { throw WireError.invalidJSON(path: path, reason: "expected an object for \(type)") }
        let fields = message.byName
        var out: [UInt8] = []
        for (key, value) in members {
            let keyPath = path.isEmpty ? key : path + "." + key
            guard let field = fields[key] ?? message.fields.first(where: { Self.camel($0.name) == key }) else {
                throw WireError.invalidJSON(path: keyPath, reason: "\(type) has no field '\(key)'")
            }
            if field.repeated {
                guard case let .array(elements) = value else { throw WireError.invalidJSON(path: keyPath, reason: "expected an array") }
                for (index, element) in elements.enumerated() { try encodeField(field, element, into: &out, path: "\(keyPath)[\(index)]") }
            } else if value != .null {
                try encodeField(field, value, into: &out, path: keyPath)
            }
        }
        return out
    }

    private func encodeField(_ field: Field, _ value: JSONValue, into out: inout [UInt8], path: String) throws {
        switch field.type {
        case 9:  // string
            ProtoWriter.tag(field.number, 2, into: &out)
            ProtoWriter.lengthDelimited(Array(try value.stringValue(path: path).utf8), into: &out)
        case 12:  // bytes
            ProtoWriter.tag(field.number, 2, into: &out)
            ProtoWriter.lengthDelimited(try value.bytesValue(path: path), into: &out)
        case 11:  // message
            ProtoWriter.tag(field.number, 2, into: &out)
            ProtoWriter.lengthDelimited(try encode(value, as: String(field.typeName.dropFirst()), path: path), into: &out)
        case 8:  // bool
            ProtoWriter.tag(field.number, 0, into: &out)
            guard case let .bool(flag) = value else { throw WireError.invalidJSON(path: path, reason: "expected true or false") }
            ProtoWriter.varint(flag ? 1 : 0, into: &out)
        case 1:  // double
            ProtoWriter.tag(field.number, 1, into: &out)
            let number: Double
            switch value {
            case let .double(d): number = d
            case let .int(i): number = Double(i)
            case let .uint(u): number = Double(u)
            default: throw WireError.invalidJSON(path: path, reason: "expected a number")
            }
            withUnsafeBytes(of: number.bitPattern.littleEndian) { out.append(contentsOf: $0) }
        case 14:  // enum: a value name or its number
            ProtoWriter.tag(field.number, 0, into: &out)
            let number: Int32
            if case let .string(name) = value {
                guard let found = enums[String(field.typeName.dropFirst())]?.first(where: { $0.name == name }) else {
                    throw WireError.invalidJSON(path: path, reason: "'\(name)' is not a value of \(field.typeName.dropFirst())")
                }
                number = found.number
            } else {
                number = Int32(truncatingIfNeeded: try value.int64Value(path: path))
            }
            ProtoWriter.varint(UInt64(bitPattern: Int64(number)), into: &out)
        case 5, 3:  // int32, int64
            ProtoWriter.tag(field.number, 0, into: &out)
            ProtoWriter.varint(UInt64(bitPattern: try value.int64Value(path: path)), into: &out)
        case 13, 4:  // uint32, uint64
            ProtoWriter.tag(field.number, 0, into: &out)
            ProtoWriter.varint(try value.uint64Value(path: path), into: &out)
        default:
            throw WireError.invalidJSON(path: path, reason: "field type \(field.type) is not supported")
        }
    }

    // MARK: bytes -> JSON

    /// A serialized `type` as JSON with the .proto field names (64-bit
    /// integers as numbers, bytes as base64, enums by name).
    public func decode(_ bytes: [UInt8], as type: String) throws -> JSONValue {
        guard let message = messages[type] else { throw DynamicSchemaError("the schema has no message \(type)") }
        let byNumber = Dictionary(message.fields.map { ($0.number, $0) }, uniquingKeysWith: { first, _ in first })
        var reader = ProtoReader(bytes)
        var members: [(String, JSONValue)] = []
        var repeatedValues: [String: [JSONValue]] = [:]
        var order: [String] = []
        while let (number, raw) = try reader.next() {
            guard let field = byNumber[number] else { continue }  // unknown: skipped
            let values = try decodeValues(field, raw)
            if field.repeated {
                if repeatedValues[field.name] == nil { order.append(field.name) }
                repeatedValues[field.name, default: []] += values
            } else if let last = values.last {
                if let index = members.firstIndex(where: { $0.0 == field.name }) { members[index].1 = last } else { members.append((field.name, last)) }
            }
        }
        for name in order { members.append((name, .array(repeatedValues[name] ?? []))) }
        let rank = Dictionary(message.fields.enumerated().map { ($1.name, $0) }, uniquingKeysWith: { first, _ in first })
        members.sort { (rank[$0.0] ?? 0) < (rank[$1.0] ?? 0) }
        return .object(members)
    }

    private func decodeValues(_ field: Field, _ raw: ProtoReader.Value) throws -> [JSONValue] {
        switch (field.type, raw) {
        case let (9, .bytes(text)):
            guard let string = String(validating: text, as: UTF8.self) else { throw WireError.invalidUTF8(field: field.name) }
            return [.string(string)]
        case let (12, .bytes(data)): return [.string(Data(data).base64EncodedString())]
        case let (11, .bytes(data)): return [try decode(data, as: String(field.typeName.dropFirst()))]
        case let (_, .bytes(packed)) where [8, 14, 5, 3, 13, 4, 1].contains(field.type):
            var reader = ProtoReader(packed)
            var values: [JSONValue] = []
            while !reader.isAtEnd {
                values += try decodeValues(field, field.type == 1 ? .fixed64(try reader.fixed64()) : .varint(try reader.varint()))
            }
            return values
        case let (8, .varint(value)): return [.bool(value != 0)]
        case let (14, .varint(value)):
            let number = Int32(truncatingIfNeeded: value)
            if let name = enums[String(field.typeName.dropFirst())]?.first(where: { $0.number == number })?.name { return [.string(name)] }
            return [.int(Int64(number))]
        case let (5, .varint(value)): return [.int(Int64(Int32(truncatingIfNeeded: value)))]
        case let (3, .varint(value)): return [.int(Int64(bitPattern: value))]
        case let (13, .varint(value)): return [.uint(UInt64(UInt32(truncatingIfNeeded: value)))]
        case let (4, .varint(value)): return [.uint(value)]
        case let (1, .fixed64(bits)): return [.double(Double(bitPattern: bits))]
        default: throw DynamicSchemaError("field \(field.name) has an unexpected wire type")
        }
    }

    static func camel(_ name: String) -> String {
        let parts = name.split(separator: "_")
        return (parts.first.map(String.init) ?? "") + parts.dropFirst().map { $0.prefix(1).uppercased() + $0.dropFirst() }.joined()
    }
}

/// The protobuf wire format, read field by field.
struct ProtoReader {
    enum Value { case varint(UInt64), fixed64(UInt64), bytes([UInt8]), fixed32(UInt32) }
    private let bytes: [UInt8]
    private var position = 0
    init(_ bytes: [UInt8]) { self.bytes = bytes }
    var isAtEnd: Bool { position >= bytes.count }

    mutating func varint() throws -> UInt64 {
        var result: UInt64 = 0
        for shift in stride(from: 0, to: 70, by: 7) {
            guard position < bytes.count else { throw DynamicSchemaError("truncated varint") }
            let byte = bytes[position]
            position += 1
            result |= UInt64(byte & 0x7F) << UInt64(shift)
            if byte < 0x80 { return result }
        }
        throw DynamicSchemaError("varint longer than 10 bytes")
    }

    mutating func fixed64() throws -> UInt64 {
        guard position + 8 <= bytes.count else { throw DynamicSchemaError("truncated fixed64") }
        var value: UInt64 = 0
        for index in 0..<8 { value |= UInt64(bytes[position + index]) << UInt64(8 * index) }
        position += 8
        return value
    }

    /// The next field, or nil at the end. Groups are refused (proto/ has none).
    mutating func next() throws -> (Int, Value)? {
        guard !isAtEnd else { return nil }
        let key = try varint()
        let number = Int(key >> 3)
        switch key & 7 {
        case 0: return (number, .varint(try varint()))
        case 1: return (number, .fixed64(try fixed64()))
        case 2:
            let length = try varint()
            guard length <= UInt64(bytes.count - position) else { throw DynamicSchemaError("a field runs past the end") }
            defer { position += Int(length) }
            return (number, .bytes(Array(bytes[position..<position + Int(length)])))
        case 5:
            guard position + 4 <= bytes.count else { throw DynamicSchemaError("truncated fixed32") }
            defer { position += 4 }
            return (number, .fixed32(UInt32(bytes[position]) | UInt32(bytes[position + 1]) << 8 | UInt32(bytes[position + 2]) << 16 | UInt32(bytes[position + 3]) << 24))
        default:
            throw DynamicSchemaError("wire type \(key & 7) is not supported")
        }
    }
}

enum ProtoWriter {
    static func varint(_ value: UInt64, into out: inout [UInt8]) {
        var rest = value
        while rest > 0x7F {
            out.append(UInt8(rest & 0x7F) | 0x80)
            rest >>= 7
        }
        out.append(UInt8(rest))
    }

    static func tag(_ number: Int, _ wireType: UInt64, into out: inout [UInt8]) {
        varint(UInt64(number) << 3 | wireType, into: &out)
    }

    static func lengthDelimited(_ bytes: [UInt8], into out: inout [UInt8]) {
        varint(UInt64(bytes.count), into: &out)
        out.append(contentsOf: bytes)
    }
}

/// Bytes that are not a message of the reflected schema.
public struct DynamicSchemaError: Error, CustomStringConvertible {
    public let description: String
    init(_ description: String) { self.description = description }
}

extension DynamicSchema {
    /// A serialized Envelope holding one Request: `id`, `timeoutMs`, and the
    /// params already serialized for the Request.params field `field`.
    public static func requestEnvelope(id: UInt64, timeoutMs: UInt32?, field: Int, params: [UInt8]) -> [UInt8] {
        var request: [UInt8] = []
        ProtoWriter.tag(1, 0, into: &request)
        ProtoWriter.varint(id, into: &request)
        if let timeoutMs {
            ProtoWriter.tag(2, 0, into: &request)
            ProtoWriter.varint(UInt64(timeoutMs), into: &request)
        }
        ProtoWriter.tag(field, 2, into: &request)
        ProtoWriter.lengthDelimited(params, into: &request)
        var envelope: [UInt8] = []
        ProtoWriter.tag(1, 2, into: &envelope)
        ProtoWriter.lengthDelimited(request, into: &envelope)
        return envelope
    }

    /// The field number of `name` in message `type` (nil when it has none).
    public func fieldNumber(_ name: String, in type: String) -> Int? {
        messages[type]?.fields.first { $0.name == name }?.number
    }
}
