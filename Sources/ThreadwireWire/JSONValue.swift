import Foundation

/// A JSON value that keeps object key order and exact 64-bit integers, so the
/// CLI prints fields in .proto order and ids round-trip without loss.
public enum JSONValue: Sendable, Equatable {
    case null
    case bool(Bool)
    case int(Int64)
    case uint(UInt64)
    case double(Double)
    case string(String)
    case array([JSONValue])
    case object([(String, JSONValue)])

    public static func == (lhs: JSONValue, rhs: JSONValue) -> Bool {
        switch (lhs, rhs) {
        case (.null, .null): return true
        case let (.bool(a), .bool(b)): return a == b
        case let (.int(a), .int(b)): return a == b
        case let (.uint(a), .uint(b)): return a == b
        case let (.int(a), .uint(b)), let (.uint(b), .int(a)): return a >= 0 && UInt64(a) == b
        case let (.double(a), .double(b)): return a == b
        case let (.string(a), .string(b)): return a == b
        case let (.array(a), .array(b)): return a == b
        case let (.object(a), .object(b)):
            return a.count == b.count && zip(a, b).allSatisfy { $0.0 == $1.0 && $0.1 == $1.1 }
        default: return false
        }
    }

    public subscript(key: String) -> JSONValue? {
        guard case let .object(fields) = self else { return nil }
        return fields.first { $0.0 == key }?.1
    }

    // MARK: Parsing and printing

    public static func parse(_ text: String) throws -> JSONValue {
        do {
            return try JSONDecoder().decode(Decoded.self, from: Data(text.utf8)).value
        } catch let error as WireError {
            throw error
        } catch {
            let data = Data(text.utf8)
            throw WireError.invalidJSON(path: "", reason: "not JSON (\(JSONErrorPosition.locate(data) ?? JSONErrorPosition.describe(error, in: data)))")
        }
    }

    /// Decodable bridge: JSONDecoder is strict about types, so `true` never
    /// reads as 1; object keys come back unordered and are sorted for stability.
    private struct Decoded: Decodable {
        let value: JSONValue

        init(from decoder: any Decoder) throws {
            if let container = try? decoder.container(keyedBy: AnyKey.self) {
                value = .object(try container.allKeys.map(\.stringValue).sorted().map {
                    ($0, try container.decode(Decoded.self, forKey: AnyKey(stringValue: $0)).value)
                })
                return
            }
            if var container = try? decoder.unkeyedContainer() {
                var items: [JSONValue] = []
                while !container.isAtEnd { items.append(try container.decode(Decoded.self).value) }
                value = .array(items)
                return
            }
            let single = try decoder.singleValueContainer()
            if single.decodeNil() { value = .null }
            else if let b = try? single.decode(Bool.self) { value = .bool(b) }
            else if let n = try? single.decode(Int64.self) { value = .int(n) }
            else if let n = try? single.decode(UInt64.self) { value = .uint(n) }
            else if let d = try? single.decode(Double.self) { value = .double(d) }
            else { value = .string(try single.decode(String.self)) }
        }
    }

    private struct AnyKey: CodingKey {
        var stringValue: String
        var intValue: Int? { nil }
        init(stringValue: String) { self.stringValue = stringValue }
        init?(intValue: Int) { nil }
    }

    /// Compact or indented JSON text.
    public func render(pretty: Bool = false) -> String {
        var out = ""
        write(into: &out, pretty: pretty, indent: 0)
        return out
    }

    private func write(into out: inout String, pretty: Bool, indent: Int) {
        let pad = pretty ? String(repeating: "  ", count: indent + 1) : ""
        let closePad = pretty ? String(repeating: "  ", count: indent) : ""
        let newline = pretty ? "\n" : ""
        switch self {
        case .null: out += "null"
        case let .bool(b): out += b ? "true" : "false"
        case let .int(n): out += String(n)
        case let .uint(n): out += String(n)
        case let .double(d): out += d.isFinite ? String(d) : "null"
        case let .string(s): JSONValue.escape(s, into: &out)
        case let .array(items):
            if items.isEmpty { out += "[]"; return }
            out += "[" + newline
            for (index, item) in items.enumerated() {
                out += pad
                item.write(into: &out, pretty: pretty, indent: indent + 1)
                out += (index == items.count - 1 ? "" : ",") + newline
            }
            out += closePad + "]"
        case let .object(fields):
            if fields.isEmpty { out += "{}"; return }
            out += "{" + newline
            for (index, (key, value)) in fields.enumerated() {
                out += pad
                JSONValue.escape(key, into: &out)
                out += pretty ? ": " : ":"
                value.write(into: &out, pretty: pretty, indent: indent + 1)
                out += (index == fields.count - 1 ? "" : ",") + newline
            }
            out += closePad + "}"
        }
    }

    private static func escape(_ string: String, into out: inout String) {
        out += "\""
        for scalar in string.unicodeScalars {
            switch scalar {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            case _ where scalar.value < 0x20:
                out += "\\u" + String(repeating: "0", count: 4 - String(scalar.value, radix: 16).count)
                    + String(scalar.value, radix: 16)
            default: out.unicodeScalars.append(scalar)
            }
        }
        out += "\""
    }

    // MARK: Typed access used by the generated decoders

    func objectFields(path: String) throws -> [(String, JSONValue)] {
        guard case let .object(fields) = self else { throw WireError.invalidJSON(path: path, reason: "expected an object") }
        return fields
    }

    func arrayElements(path: String) throws -> [JSONValue] {
        guard case let .array(items) = self else { throw WireError.invalidJSON(path: path, reason: "expected an array") }
        return items
    }

    /// Bytes as protobuf's JSON mapping writes them: standard or URL-safe base64.
    func bytesValue(path: String) throws -> [UInt8] {
        guard case let .string(s) = self else { throw WireError.invalidJSON(path: path, reason: "expected a base64 string") }
        var standard = s.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        while standard.count % 4 != 0 { standard += "=" }
        guard let data = Data(base64Encoded: standard) else { throw WireError.invalidJSON(path: path, reason: "expected base64") }
        return Array(data)
    }

    func stringValue(path: String) throws -> String {
        guard case let .string(s) = self else { throw WireError.invalidJSON(path: path, reason: "expected a string") }
        // protobuf-c carries strings as C strings: the bytes after a NUL
        // would be dropped without a word, so refuse them here.
        guard !s.utf8.contains(0) else {
            throw WireError.invalidJSON(path: path, reason: "a string may not contain U+0000 (the binary protocol's strings end at NUL)")
        }
        return s
    }

    func boolValue(path: String) throws -> Bool {
        guard case let .bool(b) = self else { throw WireError.invalidJSON(path: path, reason: "expected true or false") }
        return b
    }

    func doubleValue(path: String) throws -> Double {
        switch self {
        case let .double(d): return d
        case let .int(n): return Double(n)
        case let .uint(n): return Double(n)
        default: throw WireError.invalidJSON(path: path, reason: "expected a number")
        }
    }

    /// Integers may also come as decimal strings (protobuf's JSON form of 64-bit values).
    private func integer<T: FixedWidthInteger>(_: T.Type, path: String) throws -> T {
        let value: T?
        switch self {
        case let .int(n): value = T(exactly: n)
        case let .uint(n): value = T(exactly: n)
        case let .string(s): value = T(s)
        default: value = nil
        }
        guard let value else { throw WireError.invalidJSON(path: path, reason: "expected an integer that fits \(T.self)") }
        return value
    }

    func int32Value(path: String) throws -> Int32 { try integer(Int32.self, path: path) }
    func int64Value(path: String) throws -> Int64 { try integer(Int64.self, path: path) }
    func uint32Value(path: String) throws -> UInt32 { try integer(UInt32.self, path: path) }
    func uint64Value(path: String) throws -> UInt64 { try integer(UInt64.self, path: path) }
}
