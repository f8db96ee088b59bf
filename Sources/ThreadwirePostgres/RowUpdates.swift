import NIOCore
import PostgresNIO
import ThreadwireCore
import ThreadwireStorage

/// A commit that only replaces one thread's row on top of its previous
/// version, with the events it keeps (settings, tools, names): the common
/// commit, which a group sends as one set-based UPDATE (`RowUpdates`).
/// A class: a commit is handed on several times while it waits, and a copy
/// of a row retains every one of its strings.
final class RowUpdate: Sendable {
    let row: ThreadRow
    let fence: LeaseFence?
    let events: [StoredEvent]

    /// Nil unless replacing the row (and keeping its events) is all
    /// `operations` do.
    init?(_ operations: [StoreOperation], fence: LeaseFence?) throws {
        guard CommitFunction.Commit.updatedThread(operations) != nil, case let .putThread(record) = operations[0] else { return nil }
        row = try ThreadRow(record)
        self.fence = fence
        if operations.count == 2, case let .appendEvents(_, events) = operations[1] {
            self.events = events
        } else {
            events = []
        }
    }
}

/// Row replacements of distinct threads as one statement, each column a
/// binary array parameter `unnest` reads back into rows: no JSON for
/// PostgreSQL to lex and populate (as `json` it took a fifth of PostgreSQL's
/// CPU in a group of settings changes; writing the arrays costs the server
/// about what writing the JSON did). The checks are the
/// commit function's, in its order: every fence locked FOR SHARE in tree
/// order (the aggregate takes them all before a row is written), then each
/// row compare-and-set on owner and version; a row's events are inserted
/// only if it was replaced. Answers the ids of the rows replaced.
struct RowUpdates: PostgresPreparedStatement {
    typealias Row = String
    static let name = "threadwire_row_updates"

    static let sql: String = {
        let columns = ThreadRow.changeable
        var count = 0
        func parameter(_ type: String) -> String {
            count += 1
            return "$\(count)::\(type)[]"
        }
        let rows = (["text", "text", "text", "bigint"] + columns.map { ColumnArray.sqlType($0.kind) }).map(parameter)
        let events = ["text", "bigint", "bigint", "bytea"].map(parameter)
        let names = columns.map(\.name)
        return """
            WITH batch AS MATERIALIZED (
                SELECT * FROM unnest(\(rows.joined(separator: ", "))) AS b(id, owner, fence_tree, fence_epoch, \(names.joined(separator: ", ")))),
            held AS MATERIALIZED (
                SELECT coalesce(array_agg(l.tree || ' ' || l.epoch), '{}') AS fences FROM (
                    SELECT tree, epoch FROM thread_leases WHERE tree IN (SELECT fence_tree FROM batch) ORDER BY tree FOR SHARE) l),
            updated AS (
                UPDATE threads t SET \(names.map { "\($0) = b.\($0)" }.joined(separator: ", "))
                FROM batch b, held h
                WHERE t.id = b.id AND t.owner = b.owner AND t.version = b.version - 1
                  AND (b.fence_tree IS NULL OR b.fence_tree || ' ' || b.fence_epoch = ANY (h.fences))
                RETURNING t.id),
            kept AS (
                INSERT INTO thread_events (thread_id, seq, created_at, record)
                SELECT e.thread_id, e.seq, e.created_at, e.record
                FROM unnest(\(events.joined(separator: ", "))) AS e(thread_id, seq, created_at, record)
                JOIN updated u ON u.id = e.thread_id)
            SELECT id FROM updated
            """
    }()

    let bindings: PostgresBindings

    init(_ updates: [RowUpdate]) {
        // One pass over the rows: every cell row by row (a row's values
        // taken by one `ThreadRow` method, which borrows it), then each
        // column written straight from the cells.
        let columns = ThreadRow.changeable
        var ids: [String?] = [], owners: [String?] = [], trees: [String?] = [], epochs: [Int64] = []
        var cells: [ColumnValue] = []
        ids.reserveCapacity(updates.count)
        owners.reserveCapacity(updates.count)
        trees.reserveCapacity(updates.count)
        epochs.reserveCapacity(updates.count)
        cells.reserveCapacity(updates.count * columns.count)
        var threads: [String?] = [], numbers: [Int64] = [], times: [Int64] = [], records: [ByteBuffer] = []
        for update in updates {
            ids.append(update.row.id)
            owners.append(update.row.owner)
            trees.append(update.fence?.tree)
            // An epoch is only compared when its tree is there.
            epochs.append(update.fence?.epoch ?? 0)
            update.row.appendChangeableValues(to: &cells)
            for event in update.events {
                threads.append(update.row.id)
                numbers.append(event.sequence)
                times.append(event.createdAt)
                records.append(ByteBuffer(bytes: event.bytes))
            }
        }
        var binds = PostgresBindings(capacity: 4 + columns.count + 4)
        binds.append(ColumnArray(texts: ids))
        binds.append(ColumnArray(texts: owners))
        binds.append(ColumnArray(texts: trees))
        binds.append(epochs)
        for index in columns.indices {
            binds.append(ColumnArray(kind: columns[index].kind, cells: cells, first: index, stride: columns.count))
        }
        binds.append(ColumnArray(texts: threads))
        binds.append(numbers)
        binds.append(times)
        binds.append(records)
        bindings = binds
    }

    func makeBindings() throws -> PostgresBindings { bindings }
    func decodeRow(_ row: PostgresRow) throws -> String { try row.decode(String.self) }
}

/// One column of many rows as an array parameter, in PostgreSQL's binary
/// array format, written straight into the bindings (postgres-nio's arrays
/// take no optionals, and an array per column built apart, then copied in,
/// cost a group more than the rows' JSON did).
struct ColumnArray: PostgresDynamicTypeEncodable {
    let kind: ColumnValue.Kind
    /// The column's values are `cells[first]`, `cells[first + stride]`, …
    let cells: [ColumnValue]
    let first: Int
    let stride: Int

    /// A `text[]` whose elements may be NULL.
    init(texts: [String?]) {
        self.init(kind: .text, cells: texts.map { .text($0) }, first: 0, stride: 1)
    }

    init(kind: ColumnValue.Kind, cells: [ColumnValue], first: Int, stride: Int) {
        self.kind = kind
        self.cells = cells
        self.first = first
        self.stride = stride
    }

    static func sqlType(_ kind: ColumnValue.Kind) -> String {
        switch kind {
        case .text: "text"
        case .integer: "bigint"
        case .boolean: "boolean"
        }
    }

    private var elementType: PostgresDataType {
        switch kind {
        case .text: .text
        case .integer: .int8
        case .boolean: .bool
        }
    }

    var psqlType: PostgresDataType {
        switch kind {
        case .text: .textArray
        case .integer: .int8Array
        case .boolean: .boolArray
        }
    }

    var psqlFormat: PostgresFormat { .binary }

    func encode<JSONEncoder: PostgresJSONEncoder>(into buffer: inout ByteBuffer, context: PostgresEncodingContext<JSONEncoder>) {
        let elements = Swift.stride(from: first, to: cells.count, by: stride)
        // Sized first, then written in one go: a ByteBuffer write per
        // element (each checking uniqueness and exclusivity) cost more than
        // the bytes.
        var size = 12
        var count = 0
        var hasNulls = false
        for index in elements {
            count += 1
            switch cells[index] {
            case .text(nil): hasNulls = true; size += 4
            case let .text(text?): size += 4 + text.utf8.count
            case .integer: size += 4 + 8
            case .boolean: size += 4 + 1
            }
        }
        if count > 0 { size += 8 }
        buffer.writeWithUnsafeMutableBytes(minimumWritableBytes: size) { bytes in
            var at = 0
            func put(_ value: Int32) {
                bytes.storeBytes(of: value.bigEndian, toByteOffset: at, as: Int32.self)
                at += 4
            }
            put(count == 0 ? 0 : 1)  // dimensions
            put(hasNulls ? 1 : 0)
            put(Int32(bitPattern: elementType.rawValue))
            guard count > 0 else { return at }
            put(Int32(count))  // length
            put(1)  // lower bound
            // Each element as the format has it: its length, then its bytes.
            for index in elements {
                switch cells[index] {
                case .text(nil):
                    put(-1)
                case let .text(text?):
                    let utf8 = text.utf8
                    put(Int32(utf8.count))
                    UnsafeMutableRawBufferPointer(rebasing: bytes[at...]).copyBytes(from: utf8)
                    at += utf8.count
                case let .integer(number):
                    put(8)
                    bytes.storeBytes(of: number.bigEndian, toByteOffset: at, as: Int64.self)
                    at += 8
                case let .boolean(flag):
                    put(1)
                    bytes[at] = flag ? 1 : 0
                    at += 1
                }
            }
            return at
        }
    }
}
