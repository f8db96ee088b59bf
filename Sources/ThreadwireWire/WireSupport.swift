internal import CThreadwireProto
import Foundation

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

/// Memory for the C side of one decode or encode: protobuf-c's unpacked tree
/// (through `ProtobufCAllocator`) or the C struct a Swift value is packed from.
/// Allocation bumps a cursor through a first block on the caller's stack, then
/// through malloc'd blocks chained together; everything is freed at once when
/// the call ends, so no C pointer outlives it and no per-field malloc/free is
/// paid. With `THREADWIRE_CODEC_EXACT_ALLOCATIONS=1` every allocation is its own
/// malloc block of the exact size instead, so valgrind and sanitizers see each
/// one (`make memcheck` runs both ways).
struct CodecArena {
    private var cursor: UnsafeMutableRawPointer
    private var end: UnsafeMutableRawPointer
    /// Chained malloc'd blocks; the first word of each points to the previous.
    private var blocks: UnsafeMutableRawPointer?
    private let exact: Bool

    /// At most 1 KiB: larger temporary allocations make the runtime check
    /// the stack bounds first, which costs more than the block saves.
    static let firstBlockBytes = 1024
    private static let alignment = 16
    private static let headerBytes = 16
    static let exactAllocations: Bool = {
        guard let value = getenv("THREADWIRE_CODEC_EXACT_ALLOCATIONS") else { return false }
        return String(cString: value) == "1"
    }()

    private init(first: UnsafeMutableRawBufferPointer) {
        cursor = first.baseAddress!
        end = first.baseAddress! + first.count
        blocks = nil
        exact = Self.exactAllocations
    }

    /// Runs `body` with an arena whose first block lives on this stack frame.
    static func with<R>(_ body: (inout CodecArena) throws -> R) rethrows -> R {
        try withUnsafeTemporaryAllocation(byteCount: firstBlockBytes, alignment: alignment) { first in
            var arena = CodecArena(first: first)
            defer { arena.releaseBlocks() }
            return try body(&arena)
        }
    }

    mutating func allocate(byteCount: Int) -> UnsafeMutableRawPointer {
        let size = max(1, byteCount)
        if exact { return newBlock(payload: size) }
        let aligned = (Int(bitPattern: cursor) + Self.alignment - 1) & ~(Self.alignment - 1)
        if aligned + size <= Int(bitPattern: end) {
            let pointer = UnsafeMutableRawPointer(bitPattern: aligned)!
            cursor = pointer + size
            return pointer
        }
        // A large request gets a block of its own; the current block stays in use.
        let blockPayload = max(size, 4 * Self.firstBlockBytes)
        let pointer = newBlock(payload: blockPayload)
        if blockPayload > size {
            cursor = pointer + size
            end = pointer + blockPayload
        }
        return pointer
    }

    private mutating func newBlock(payload: Int) -> UnsafeMutableRawPointer {
        let block = malloc(Self.headerBytes + payload)!
        block.storeBytes(of: blocks, as: UnsafeMutableRawPointer?.self)
        blocks = block
        return block + Self.headerBytes
    }

    private mutating func releaseBlocks() {
        while let block = blocks {
            blocks = block.load(as: UnsafeMutableRawPointer?.self)
            free(block)
        }
    }

    /// A NUL-terminated copy, as protobuf-c wants strings.
    mutating func cString(_ string: String) -> UnsafeMutablePointer<CChar>? {
        let utf8 = string.utf8
        let count = utf8.count
        let copy = allocate(byteCount: count + 1).bindMemory(to: CChar.self, capacity: count + 1)
        let copied: Void? = utf8.withContiguousStorageIfAvailable { bytes in
            if count > 0 { UnsafeMutableRawPointer(copy).copyMemory(from: bytes.baseAddress!, byteCount: count) }
        }
        if copied == nil {
            var index = 0
            for byte in utf8 { copy[index] = CChar(bitPattern: byte); index += 1 }
        }
        copy[count] = 0
        return copy
    }

    /// A copy of `bytes` for a protobuf-c `bytes` field.
    mutating func binary(_ bytes: [UInt8]) -> ProtobufCBinaryData {
        let copy = allocate(byteCount: max(bytes.count, 1))
        bytes.withUnsafeBytes { source in
            if let base = source.baseAddress, !source.isEmpty { copy.copyMemory(from: base, byteCount: source.count) }
        }
        return ProtobufCBinaryData(len: bytes.count, data: copy.assumingMemoryBound(to: UInt8.self))
    }

    /// A C array of `count` elements, each produced by `element`.
    mutating func array<Source, T>(_ values: [Source], _ element: (Source, inout CodecArena) -> T) -> UnsafeMutablePointer<T>? {
        let pointer = allocate(byteCount: values.count * MemoryLayout<T>.stride).bindMemory(to: T.self, capacity: values.count)
        for (index, value) in values.enumerated() {
            (pointer + index).initialize(to: element(value, &self))
        }
        return pointer
    }

    mutating func message<M: CBridgedMessage>(
        _ value: M, _ zero: M.CMessage, _ initialize: (UnsafeMutablePointer<M.CMessage>?) -> Void
    ) -> UnsafeMutablePointer<M.CMessage>? {
        let pointer = allocate(byteCount: MemoryLayout<M.CMessage>.stride).bindMemory(to: M.CMessage.self, capacity: 1)
        pointer.initialize(to: zero)
        initialize(pointer)
        value.fill(&pointer.pointee, arena: &self)
        return pointer
    }

    /// protobuf-c's allocator interface over this arena, for `unpack` and
    /// `free_unpacked` (whose frees are no-ops: the arena frees at the end).
    static func withUnpackAllocator<R>(_ body: (UnsafeMutablePointer<ProtobufCAllocator>) throws -> R) rethrows -> R {
        try with { arena in
            try withUnsafeMutablePointer(to: &arena) { arenaPointer in
                var allocator = ProtobufCAllocator(
                    alloc: { data, size in
                        data!.assumingMemoryBound(to: CodecArena.self).pointee.allocate(byteCount: size)
                    },
                    free: { _, _ in },
                    allocator_data: UnsafeMutableRawPointer(arenaPointer))
                return try body(&allocator)
            }
        }
    }
}

/// Internal half of the generated bridge.
protocol CBridgedMessage {
    associatedtype CMessage
    func fill(_ c: inout CMessage, arena: inout CodecArena)
}

extension WireError {
    /// The same error one message further out: "model" becomes
    /// "thread_start.model". Paths are built only while an error unwinds, so
    /// a decode that succeeds formats no strings.
    func nested(in field: StaticString) -> WireError {
        switch self {
        case let .invalidUTF8(path):
            return .invalidUTF8(field: fieldPath("\(field)", path))
        case let .invalidEnumValue(path, value):
            return .invalidEnumValue(field: fieldPath("\(field)", path), value: value)
        case .malformed, .invalidJSON:
            return self
        }
    }
}

@inline(__always)
func wireBytes(_ data: ProtobufCBinaryData) -> [UInt8] {
    guard data.len > 0, let base = data.data else { return [] }
    return Array(UnsafeBufferPointer(start: base, count: data.len))
}

/// Bytes in JSON, as protobuf's JSON mapping writes them.
func wireBase64(_ bytes: [UInt8]) -> String { Data(bytes).base64EncodedString() }

@inline(__always)
func wireString(_ pointer: UnsafeMutablePointer<CChar>?, field: StaticString) throws(WireError) -> String {
    guard let pointer else { return "" }
    guard let string = String(validatingCString: pointer) else {
        throw WireError.invalidUTF8(field: "\(field)")
    }
    return string
}

@inline(__always)
func wireEnum<E: WireEnum>(_ raw: Int32, field: StaticString) throws(WireError) -> E {
    guard let value = E(rawValue: raw) else { throw WireError.invalidEnumValue(field: "\(field)", value: raw) }
    return value
}

/// A submessage pointer protobuf-c left NULL where the contract needs one.
@inline(__always)
func wireRequired<T>(_ pointer: UnsafeMutablePointer<T>?) throws(WireError) -> UnsafeMutablePointer<T> {
    guard let pointer else { throw WireError.malformed(type: String(describing: T.self), byteCount: 0) }
    return pointer
}

/// "parent.field", or "field" at the top level.
func fieldPath(_ parent: String, _ field: String) -> String {
    parent.isEmpty ? field : parent + "." + field
}

/// The release both binaries report (`--version`, ServerInfo.version,
/// `threadwire_build_info`): one place to change it.
public enum ThreadwireRelease {
    public static let version = "0.1.0"
}
