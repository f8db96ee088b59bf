import Foundation
public import ThreadwireCore
import ThreadwireContract
import ThreadwireWire

/// How history items and turns are written to disk, for every store: the one
/// place that knows the format (the stores only move the bytes).
///
/// The format is the contract's protobuf encoding of `ContextItem` and `Turn`
/// (`proto/threadwire/v1`), behind a one-byte format version. Kept on
/// purpose rather than a format of the store's own: the contract's
/// compatibility rules (fields are added, never renumbered or retyped) are
/// exactly the rules a stored record needs, protobuf readers skip fields they
/// do not know, and the codec is fuzzed and checked under valgrind already.
/// An API change that follows the rules needs no migration; one that breaks
/// them would break clients first. The version byte is where a different
/// format would start: a record without it (written before it existed) is
/// read as the same encoding.
public enum StoredRecords {
    /// The current format: the contract's protobuf encoding.
    static let formatVersion: UInt8 = 1
    /// A zero byte, which no protobuf message starts with (it would be the
    /// tag of field 0, which protobuf forbids), then the format version.
    static let marker: [UInt8] = [0x00, formatVersion]

    public static func encode(_ item: ContextItem) -> [UInt8] {
        marker + item.wire.serializedBytes()
    }

    public static func decodeContextItem(_ bytes: [UInt8]) throws -> ContextItem {
        try ContextItem(wire: payload(bytes).withUnsafeBytes { try Wire.ContextItem(serializedBytes: $0) })
    }

    public static func encode(_ turn: TurnRecord) -> [UInt8] {
        marker + turn.storedWire.serializedBytes()
    }

    public static func decodeTurn(_ bytes: [UInt8], threadID: ThreadID, sequence: Int) throws -> TurnRecord {
        try TurnRecord(storedWire: payload(bytes).withUnsafeBytes { try Wire.Turn(serializedBytes: $0) }, threadID: threadID, sequence: sequence)
    }

    /// The protobuf bytes of a record: after the marker, or all of them for
    /// a record written before the marker existed.
    static func payload(_ bytes: [UInt8]) throws -> ArraySlice<UInt8> {
        guard bytes.count >= 2, bytes[0] == 0x00 else { return bytes[...] }
        guard bytes[1] == formatVersion else {
            throw StoreError.unavailable("a stored record has format \(bytes[1]); this server reads format \(formatVersion): upgrade it")
        }
        return bytes[2...]
    }
}
