internal import CThreadwireProto

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// Namespace for the Swift mirrors of the .proto messages, so they can't be
/// mistaken for domain types (`Wire.Thread` vs the domain's `AgentThread`).
public enum Wire {}

/// What can go wrong turning bytes or JSON into a `Wire` message.
public enum WireError: Error, Equatable, CustomStringConvertible {
    /// protobuf-c refused the bytes (it gives no detail beyond that).
    case malformed(type: String, byteCount: Int)
    /// A string field is not valid UTF-8 (protobuf-c does not check).
    case invalidUTF8(field: String)
    /// An enum field holds a number the contract does not define.
    case invalidEnumValue(field: String, value: Int32)
    case invalidJSON(path: String, reason: String)

    public var description: String {
        switch self {
        case let .malformed(type, count):
            return "could not decode \(type) from \(count) bytes"
        case let .invalidUTF8(field):
            return "field '\(field)' is not valid UTF-8"
        case let .invalidEnumValue(field, value):
            return "field '\(field)' has undefined enum value \(value)"
        case let .invalidJSON(path, reason):
            return path.isEmpty ? "invalid JSON: \(reason)" : "invalid JSON at '\(path)': \(reason)"
        }
    }
}

/// A message of the contract: binary via protobuf-c, JSON via field names.
public protocol WireMessage: Sendable, Equatable {
    static var protoName: String { get }
    init()
    init(serializedBytes: [UInt8]) throws
    init(serializedBytes: UnsafeRawBufferPointer) throws
    func serializedBytes() -> [UInt8]
    func pack<R>(_ body: (_ size: Int, _ write: (UnsafeMutableRawPointer) -> Void) throws -> R) rethrows -> R
    init(json: JSONValue, path: String) throws
    func jsonValue() -> JSONValue
}

extension WireMessage {
    public init(serializedBytes bytes: [UInt8]) throws {
        self = try bytes.withUnsafeBytes { try Self(serializedBytes: $0) }
    }

    public func serializedBytes() -> [UInt8] {
        pack { size, write in
            [UInt8](unsafeUninitializedCapacity: size) { buffer, written in
                if size > 0 { write(buffer.baseAddress!) }
                written = size
            }
        }
    }
}

/// An enum of the contract.
public protocol WireEnum: RawRepresentable, Sendable, Equatable, CaseIterable where RawValue == Int32 {
    static var protoName: String { get }
    var protoValueName: String { get }
}

extension WireEnum {
    init(wireRawValue raw: Int32, path: String) throws {
        guard let value = Self(rawValue: raw) else {
            throw WireError.invalidEnumValue(field: path, value: raw)
        }
        self = value
    }

    /// Accepts the proto value name ("MULTI_AGENT_MODE_PROACTIVE"), its short
    /// form in any case style ("proactive", "PROACTIVE"), or the number.
    public init(json: JSONValue, path: String) throws {
        switch json {
        case let .int(n):
            try self.init(wireRawValue: Int32(truncatingIfNeeded: n), path: path)
        case let .uint(n):
            try self.init(wireRawValue: Int32(truncatingIfNeeded: n), path: path)
        case let .string(name):
            let wanted = Self.normalized(name)
            guard let match = Self.allCases.first(where: {
                Self.normalized($0.protoValueName) == wanted || Self.normalized(String(describing: $0)) == wanted
            }) else {
                throw WireError.invalidJSON(path: path, reason: "'\(name)' is not a value of \(Self.protoName)")
            }
            self = match
        default:
            throw WireError.invalidJSON(path: path, reason: "expected an enum name or number")
        }
    }

    private static func normalized(_ name: String) -> String {
        String(name.lowercased().filter { $0 != "_" })
    }
}

/// Owns the C memory borrowed by a C struct while it is packed. Everything is
/// freed at once after `pack`, so no C pointer outlives the encode call.
final class Arena {
    private var allocations: [UnsafeMutableRawPointer] = []

    func cString(_ string: String) -> UnsafeMutablePointer<CChar>? {
        let copy = strdup(string)!
        allocations.append(UnsafeMutableRawPointer(copy))
        return copy
    }

    func array<T>(_ values: [T]) -> UnsafeMutablePointer<T>? {
        let pointer = cAllocate(T.self, count: values.count)
        pointer.initialize(from: values, count: values.count)
        return pointer
    }

    func message<M: CBridgedMessage>(
        _ value: M, _ zero: M.CMessage, _ initialize: (UnsafeMutablePointer<M.CMessage>?) -> Void
    ) -> UnsafeMutablePointer<M.CMessage>? {
        let pointer = cAllocate(M.CMessage.self, count: 1)
        pointer.initialize(to: zero)
        initialize(pointer)
        value.fill(&pointer.pointee, arena: self)
        return pointer
    }

    /// malloc, not Swift's allocator, because `releaseAll` frees with free().
    private func cAllocate<T>(_: T.Type, count: Int) -> UnsafeMutablePointer<T> {
        let raw = malloc(max(1, count) * MemoryLayout<T>.stride)!
        allocations.append(raw)
        return raw.bindMemory(to: T.self, capacity: max(1, count))
    }

    /// The arena holds only trivially-destructible C values, so deallocating
    /// without deinitializing is correct.
    func releaseAll() {
        for allocation in allocations { free(allocation) }
        allocations.removeAll()
    }
}

/// Internal half of the generated bridge.
protocol CBridgedMessage {
    associatedtype CMessage
    func fill(_ c: inout CMessage, arena: Arena)
}

func wireString(_ pointer: UnsafeMutablePointer<CChar>?, path: String) throws -> String {
    guard let pointer else { return "" }
    guard let string = String(validatingCString: pointer) else {
        throw WireError.invalidUTF8(field: path)
    }
    return string
}

func wirePointee<T>(_ pointer: UnsafeMutablePointer<T>?) throws -> T {
    guard let pointer else { throw WireError.malformed(type: String(describing: T.self), byteCount: 0) }
    return pointer.pointee
}

/// "parent.field", or "field" at the top level.
func fieldPath(_ parent: String, _ field: String) -> String {
    parent.isEmpty ? field : parent + "." + field
}
