import NIOCore
import PostgresNIO
import ThreadwireCore
import ThreadwireStorage

/// A commit that only replaces one thread's row on top of its previous
/// version, with the events it keeps (settings, tools, names): the common
/// commit, which a group sends as one set-based UPDATE (`RowUpdates`).
struct RowUpdate: Sendable {
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
        let rows = updates.map(\.row)
        var binds = PostgresBindings(capacity: 4 + ThreadRow.changeable.count + 4)
        binds.append(ColumnArray(texts: rows.map(\.id)))
        binds.append(ColumnArray(texts: rows.map(\.owner)))
        binds.append(ColumnArray(texts: updates.map { $0.fence?.tree }))
        // An epoch is only compared when its tree is there.
        binds.append(updates.map { $0.fence?.epoch ?? 0 })
        for column in ColumnArray.columns(of: rows) { binds.append(column) }
        var threads: [String] = []
        var numbers: [Int64] = []
        var times: [Int64] = []
        var records: [ByteBuffer] = []
        for update in updates {
            for event in update.events {
                threads.append(update.row.id)
                numbers.append(event.sequence)
                times.append(event.createdAt)
                records.append(ByteBuffer(bytes: event.bytes))
            }
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

/// One changeable column of many rows as an array, in PostgreSQL's binary
/// array format.
struct ColumnArray: PostgresDynamicTypeEncodable {
    let kind: ColumnValue.Kind
    let count: Int
    private var hasNulls = false
    /// Each element as the format has it: its length, then its bytes.
    private var elements = ByteBuffer()

    static func sqlType(_ kind: ColumnValue.Kind) -> String {
        switch kind {
        case .text: "text"
        case .integer: "bigint"
        case .boolean: "boolean"
        }
    }

    init(kind: ColumnValue.Kind, count: Int) {
        self.kind = kind
        self.count = count
    }

    /// A `text[]` whose elements may be NULL (postgres-nio's arrays take no
    /// optionals).
    init(texts: [String?]) {
        self.init(kind: .text, count: texts.count)
        for text in texts { append(.text(text)) }
    }

    /// Every changeable column of `rows`, written row by row: a row is read
    /// once for all its columns (column by column, each read of a row copied
    /// it whole, which cost more than the JSON this replaced).
    static func columns(of rows: [ThreadRow]) -> [ColumnArray] {
        var columns = ThreadRow.changeable.map { ColumnArray(kind: $0.kind, count: rows.count) }
        let values = ThreadRow.changeable.map(\.value)
        for row in rows {
            for index in values.indices { columns[index].append(values[index](row)) }
        }
        return columns
    }

    private mutating func append(_ value: ColumnValue) {
        switch value {
        case .text(nil):
            hasNulls = true
            elements.writeInteger(-1, as: Int32.self)
        case let .text(text?):
            let lengthAt = elements.writerIndex
            elements.writeInteger(0, as: Int32.self)
            let written = elements.writeString(text)
            elements.setInteger(Int32(written), at: lengthAt)
        case let .integer(number):
            elements.writeInteger(8, as: Int32.self)
            elements.writeInteger(number)
        case let .boolean(flag):
            elements.writeInteger(1, as: Int32.self)
            elements.writeInteger(flag ? 1 : 0, as: UInt8.self)
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
        buffer.writeInteger(count == 0 ? 0 : 1, as: Int32.self)  // dimensions
        buffer.writeInteger(hasNulls ? 1 : 0, as: Int32.self)
        buffer.writeInteger(elementType.rawValue)
        guard count > 0 else { return }
        buffer.writeInteger(Int32(count))  // length
        buffer.writeInteger(1, as: Int32.self)  // lower bound
        buffer.writeImmutableBuffer(elements)
    }
}
