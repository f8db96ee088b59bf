import Foundation
internal import GRDB
public import Logging
import Metrics
public import ThreadwireCore
import ThreadwireStorage

/// The embedded default store: one SQLite file in WAL mode with
/// synchronous=FULL, so a commit that returned survives kill -9 and power loss.
/// GRDB runs every statement on its own queues, never on the caller's thread
/// (NIO event loops must not block). Concurrent commits are grouped into one
/// transaction, one fsync (see `CommitQueue`).
public final class SQLiteThreadStore: ThreadStore {
    private let pool: DatabasePool
    private let queue: CommitQueue
    public let path: String
    private let directory: String

    public init(directory: String, logger: Logger = Logger(label: "threadwire.store")) throws {
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        path = (directory as NSString).appendingPathComponent("threadwire.sqlite")
        self.directory = directory
        var configuration = Configuration()
        configuration.busyMode = .timeout(10)
        pool = try DatabasePool(path: path, configuration: configuration)
        // Not in prepareDatabase: DatabasePool switches its writer to WAL and
        // then sets synchronous = NORMAL, which would override it and leave
        // commits unsynced (lost on power loss). Only the writer commits.
        try pool.writeWithoutTransaction { db in try db.execute(sql: "PRAGMA synchronous = FULL") }
        try Self.migrator.migrate(pool)
        // A group written again after a failure runs each commit in a
        // savepoint (`CommitQueue`), and SQLite copies every page a savepoint
        // changes into a statement journal, a temporary file once past
        // 64 KiB: two writes per page, more than the WAL's own (a turn
        // workload made 102 writes per turn, 50 without). In memory, it is
        // bounded by the pages one group commit changes. Set after the
        // migrations, whose table copies may sort more than fits.
        try pool.writeWithoutTransaction { db in try db.execute(sql: "PRAGMA temp_store = MEMORY") }
        queue = CommitQueue(pool: pool, logger: logger,
                            recentEvents: try pool.read(Self.eventsNotYetMoved))
    }

    public func commit(_ operations: [StoreOperation]) async throws {
        try await queue.submit(operations)
    }

    /// Proves the store can commit now: a file of `spareBytes` written and
    /// synced beside the database (SQLite reuses its WAL file, so a tiny
    /// transaction can succeed on a full disk), then one real transaction.
    public func probe() async throws {
        let file = (directory as NSString).appendingPathComponent(".health-probe")
        let spareBytes = 256 * 1024
        // On a thread of its own: an fsync can block for seconds on a busy
        // disk, and the concurrency pool's threads are the server's event loops.
        try await Self.offExecutor {
            let fd = open(file, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
            guard fd >= 0 else {
                let error = errno
                let reason = "cannot create \(file): \(String(cString: strerror(error)))"
                if error == EMFILE || error == ENFILE { throw ProbeInconclusive(reason) }
                throw StoreError.unavailable(reason)
            }
            defer { close(fd); unlink(file) }
            let chunk = [UInt8](repeating: 0, count: spareBytes)
            let written = chunk.withUnsafeBytes { write(fd, $0.baseAddress, spareBytes) }
            guard written == spareBytes, fsync(fd) == 0 else {
                throw StoreError.unavailable("cannot write to \(file): \(String(cString: strerror(errno)))")
            }
        }
        try await pool.write { db in
            try db.execute(sql: "INSERT OR REPLACE INTO health_probe (id, at) VALUES (1, ?)", arguments: [Int64(Date().timeIntervalSince1970 * 1000)])
        }
    }

    /// Runs blocking file I/O on a Dispatch thread, never on the caller's executor.
    static func offExecutor(_ body: @escaping @Sendable () throws -> Void) async throws {
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
            DispatchQueue.global(qos: .utility).async {
                do {
                    try body()
                    continuation.resume()
                } catch {
                    continuation.resume(throwing: error)
                }
            }
        }
    }

    /// The writer connection's `PRAGMA synchronous` (2 is FULL: every commit
    /// syncs the WAL before it returns).
    public var synchronousLevel: Int {
        get throws { try pool.write { db in try Int.fetchOne(db, sql: "PRAGMA synchronous") ?? -1 } }
    }

    /// The writer connection's `PRAGMA temp_store` (2 is MEMORY: savepoints'
    /// statement journals stay off the disk).
    public var tempStoreLevel: Int {
        get throws { try pool.write { db in try Int.fetchOne(db, sql: "PRAGMA temp_store") ?? -1 } }
    }

    /// Transactions written so far (fewer than commits when group commit works).
    public var transactionCount: Int {
        get async { await queue.transactions }
    }

    /// Kept events not yet moved from `thread_events_recent` to thread_events.
    public var eventsNotYetMoved: Int {
        get async throws { try await pool.read(Self.eventsNotYetMoved) }
    }

    private static func eventsNotYetMoved(_ db: Database) throws -> Int {
        try Int.fetchOne(db, sql: "SELECT count(*) FROM thread_events_recent") ?? 0
    }

    /// Group commits written a second time, each commit in its own savepoint,
    /// because one of them failed.
    public var replayedTransactionCount: Int {
        get async { await queue.replayed }
    }

    public func loadThread(_ id: ThreadID) async throws -> StoredThread? {
        try await pool.read { db in
            guard let row = try Row.fetchOne(db, sql: "SELECT * FROM threads WHERE id = ?", arguments: [id]) else { return nil }
            let history = try Row.fetchAll(db, sql: "SELECT record FROM context_items WHERE thread_id = ? ORDER BY seq", arguments: [id])
                .map { try StoredRecords.decodeContextItem([UInt8]($0["record"] as Data)) }
            let turns = try Row.fetchAll(db, sql: "SELECT seq, record FROM turns WHERE thread_id = ? ORDER BY seq", arguments: [id])
                .map { try StoredRecords.decodeTurn([UInt8]($0["record"] as Data), threadID: id, sequence: $0["seq"]) }
            return StoredThread(record: try Self.record(row), history: history, turns: turns)
        }
    }

    public func threadRecord(_ id: ThreadID) async throws -> ThreadRecord? {
        try await pool.read { db in
            try Row.fetchOne(db, sql: "SELECT * FROM threads WHERE id = ?", arguments: [id]).map(Self.record)
        }
    }

    public func listThreads(_ query: ThreadListQuery) async throws -> (records: [ThreadRecord], nextCursor: String?) {
        let column = query.sortKey == .createdAt ? "created_at" : "updated_at"
        let order = query.ascending ? "ASC" : "DESC"
        var sql = "SELECT * FROM threads WHERE archived = ?"
        var arguments: StatementArguments = [query.archived ? 1 : 0]
        if let parent = query.parentID {
            sql += " AND parent_id = ?"
            _ = arguments.append(contentsOf: [parent])
        }
        if let principal = query.principal {
            sql += " AND owner = ?"
            _ = arguments.append(contentsOf: [principal])
        }
        if let term = query.searchTerm {
            // One phrase of the trigram index: a substring match, ignoring case.
            sql += " AND rowid IN (SELECT rowid FROM thread_search WHERE thread_search MATCH ?)"
            _ = arguments.append(contentsOf: ["\"" + term.replacingOccurrences(of: "\"", with: "\"\"") + "\""])
        }
        if let position = try query.position() {
            sql += " AND (\(column), id) \(query.ascending ? ">" : "<") (?, ?)"
            _ = arguments.append(contentsOf: [position.sortValue, position.id])
        }
        sql += " ORDER BY \(column) \(order), id \(order) LIMIT ?"
        _ = arguments.append(contentsOf: [query.limit + 1])
        let finalSQL = sql
        let finalArguments = arguments
        let rows = try await pool.read { db in try Row.fetchAll(db, sql: finalSQL, arguments: finalArguments).map(Self.record) }
        let page = Array(rows.prefix(query.limit))
        let next = rows.count > query.limit ? page.last.map(query.cursor(after:)) : nil
        return (page, next)
    }

    public func agentTree(_ sessionID: ThreadID) async throws -> [ThreadRecord] {
        try await pool.read { db in
            try Row.fetchAll(db, sql: "SELECT * FROM threads WHERE session_id = ? AND parent_id IS NOT NULL ORDER BY created_at, id",
                             arguments: [sessionID]).map(Self.record)
        }
    }

    public func pendingMailbox(_ recipient: ThreadID) async throws -> [(sequence: Int64, item: ContextItem)] {
        let rows = try await pool.read { db in
            try Row.fetchAll(db, sql: "SELECT seq, record FROM mailbox WHERE recipient_id = ? ORDER BY seq", arguments: [recipient])
                .map { (sequence: $0["seq"] as Int64, bytes: [UInt8]($0["record"] as Data)) }
        }
        return try rows.map { (sequence: $0.sequence, item: try StoredRecords.decodeContextItem($0.bytes)) }
    }

    public func turnsPage(_ id: ThreadID, afterSequence: Int?, limit: Int, descending: Bool) async throws -> [TurnRecord]? {
        try await pool.read { db in
            guard try Bool.fetchOne(db, sql: "SELECT 1 FROM threads WHERE id = ?", arguments: [id]) != nil else { return nil }
            var sql = "SELECT seq, record FROM turns WHERE thread_id = ?"
            var arguments: StatementArguments = [id]
            if let afterSequence {
                sql += descending ? " AND seq < ?" : " AND seq > ?"
                _ = arguments.append(contentsOf: [afterSequence])
            }
            sql += descending ? " ORDER BY seq DESC LIMIT ?" : " ORDER BY seq ASC LIMIT ?"
            _ = arguments.append(contentsOf: [limit])
            return try Row.fetchAll(db, sql: sql, arguments: arguments)
                .map { try StoredRecords.decodeTurn([UInt8]($0["record"] as Data), threadID: id, sequence: $0["seq"]) }
        }
    }

    public func storedBytes(of principal: Principal) async throws -> Int64 {
        try await pool.read { db in
            try Int64.fetchOne(db, sql: """
                SELECT coalesce((SELECT sum(length(t.record)) FROM turns t JOIN threads h ON h.id = t.thread_id WHERE h.owner = ?), 0)
                     + coalesce((SELECT sum(length(c.record)) FROM context_items c JOIN threads h ON h.id = c.thread_id WHERE h.owner = ?), 0)
                """, arguments: [principal, principal]) ?? 0
        }
    }

    public func threadsWithRunningTurns() async throws -> [ThreadID] {
        try await pool.read { db in
            try String.fetchAll(db, sql: "SELECT DISTINCT thread_id FROM turns WHERE status = 'inProgress'")
        }
    }

    public func deleteTree(_ root: ThreadID, fence: LeaseFence?) async throws -> [ThreadID] {
        guard fence == nil else { throw DomainError.internal("this store cannot check lease fences; it serves one instance only") }
        return try await pool.write { db in
            let members = try String.fetchAll(db, sql: "SELECT id FROM threads WHERE id = ? OR session_id = ? ORDER BY id = ? DESC, id",
                                              arguments: [root, root, root])
            guard members.first == root else { return [] }
            for member in members {
                for (table, column) in [("context_items", "thread_id"), ("turns", "thread_id"), ("mailbox", "recipient_id"),
                                        ("idempotency_keys", "thread_id"), ("thread_imports", "thread_id"), ("thread_events", "thread_id"),
                                        ("thread_events_recent", "thread_id"),
                                        ("threads", "id")] {
                    try db.execute(sql: "DELETE FROM \(table) WHERE \(column) = ?", arguments: [member])
                }
            }
            return members
        }
    }

    public func threadsWithQueuedTurns() async throws -> [ThreadID] {
        // The queue is in the settings JSON, present only when not empty.
        try await pool.read { db in
            try String.fetchAll(db, sql: #"SELECT id FROM threads WHERE tool_settings LIKE '%"queue":%' ORDER BY id"#)
        }
    }

    // MARK: Rows

    static func record(_ row: Row) throws -> ThreadRecord {
        try ThreadRow(reading: SQLiteColumns(row: row)).record()
    }

    private static let insertThread = """
        INSERT INTO threads (\(ThreadRow.changeableColumns.joined(separator: ", ")), id, owner)
        VALUES (\(Array(repeating: "?", count: ThreadRow.changeableColumns.count + 2).joined(separator: ", ")))
        """
    /// Compare-and-set: only on top of the version this one replaces, and
    /// below the commit's first new event number (`applyCommit`).
    private static let updateThread = """
        UPDATE threads SET \(ThreadRow.changeableColumns.map { "\($0) = ?" }.joined(separator: ", "))
        WHERE id = ? AND version = ? AND owner = ? AND event_sequence < ?
        """

    /// The columns that SQLite's indexes (and the search triggers) read and
    /// that a thread's ordinary changes leave as they are. SQLite rewrites
    /// every index on a column named in an UPDATE's SET, equal value or not:
    /// naming all of them rewrote six index entries and ran the search
    /// trigger for each settings change, more than twice the pages of the
    /// two that move (`updated_at`'s).
    private static let steadyColumns: Set<String> = ["session_id", "parent_id", "created_at", "archived", "name", "preview"]
    /// Their positions, and the others', in `ThreadRow.changeableColumns`.
    private static let steadyPositions = ThreadRow.changeableColumns.indices.filter { steadyColumns.contains(ThreadRow.changeableColumns[$0]) }
    private static let movingPositions = ThreadRow.changeableColumns.indices.filter { !steadyColumns.contains(ThreadRow.changeableColumns[$0]) }
    /// `updateThread` for a row whose steady columns keep their values (the
    /// WHERE clause checks they do); when it changes no row, `updateThread`
    /// runs as before and tells a conflict from a steady column that moved.
    private static let updateMovingColumns = """
        UPDATE threads SET \(movingPositions.map { "\(ThreadRow.changeableColumns[$0]) = ?" }.joined(separator: ", "))
        WHERE id = ? AND version = ? AND owner = ? AND event_sequence < ?
          AND \(steadyPositions.map { "\(ThreadRow.changeableColumns[$0]) IS ?" }.joined(separator: " AND "))
        """

    /// One commit's operations. New events are refused unless numbered above
    /// the newest their thread's row carried (every kept number is at most
    /// that): `thread_events_recent` has no index to refuse a number stored
    /// again, so the row's compare-and-set does, in the same statement.
    static func applyCommit(_ operations: [StoreOperation], _ db: Database) throws {
        for operation in operations {
            switch operation {
            case let .putThread(r):
                try putThread(r, belowEvent: firstNewEvent(of: r.id, in: operations), db)
            case let .appendEvents(id, events):
                let checked = operations.contains { if case let .putThread(r) = $0 { r.id == id } else { false } }
                if !checked, let first = events.first?.sequence,
                   let newest = try Int64.fetchOne(db, sql: "SELECT event_sequence FROM threads WHERE id = ?", arguments: [id]),
                   first <= newest {
                    throw StoreError.historySequenceTaken(threadID: id, sequence: Int(first))
                }
                try apply(operation, db)
            default:
                try apply(operation, db)
            }
        }
    }

    private static func firstNewEvent(of thread: ThreadID, in operations: [StoreOperation]) -> Int64? {
        for case let .appendEvents(id, events) in operations where id == thread {
            if let first = events.first?.sequence { return first }
        }
        return nil
    }

    private static func putThread(_ r: ThreadRecord, belowEvent firstNewEvent: Int64?, _ db: Database) throws {
        // Existentials, not `[DatabaseValue]`: GRDB's initializer for a
        // sequence of one concrete type builds a key path at run time on
        // every call (3 % of a turn's CPU in a profile).
        var values: [(any DatabaseValueConvertible)?] = try ThreadRow(r).changeableValues.map { $0.databaseValue }
        if r.version <= 1 {
            // A new row: no event of its thread is stored (deleteTree takes them with it).
            guard try Int.fetchOne(db, sql: "SELECT 1 FROM threads WHERE id = ?", arguments: [r.id]) == nil else {
                throw StoreError.conflict(threadID: r.id, expectedVersion: 0)
            }
            values += [r.id, r.principal]
            try db.cachedStatement(sql: insertThread).execute(arguments: StatementArguments(values))
        } else {
            let expected: [(any DatabaseValueConvertible)?] = [r.id, r.version - 1, r.principal, firstNewEvent ?? Int64.max]
            try db.cachedStatement(sql: updateMovingColumns)
                .execute(arguments: StatementArguments(movingPositions.map { values[$0] } + expected + steadyPositions.map { values[$0] }))
            if db.changesCount == 1 { return }
            try db.cachedStatement(sql: updateThread).execute(arguments: StatementArguments(values + expected))
            guard db.changesCount == 1 else {
                if let firstNewEvent,
                   let row = try Row.fetchOne(db, sql: "SELECT version, event_sequence FROM threads WHERE id = ? AND owner = ?",
                                              arguments: [r.id, r.principal]),
                   row["version"] as Int64 == r.version - 1, row["event_sequence"] as Int64 >= firstNewEvent {
                    throw StoreError.historySequenceTaken(threadID: r.id, sequence: Int(firstNewEvent))
                }
                throw StoreError.conflict(threadID: r.id, expectedVersion: r.version - 1)
            }
        }
    }

    private static func apply(_ operation: StoreOperation, _ db: Database) throws {
        switch operation {
        case let .putThread(r):
            try putThread(r, belowEvent: nil, db)
        case let .appendHistory(id, first, items):
            for (offset, item) in items.enumerated() {
                do {
                    try db.cachedStatement(sql: "INSERT INTO context_items (thread_id, seq, record) VALUES (?, ?, ?)")
                        .execute(arguments: [id, first + offset, Data(StoredRecords.encode(item))])
                } catch let error as DatabaseError where error.resultCode == .SQLITE_CONSTRAINT {
                    throw StoreError.historySequenceTaken(threadID: id, sequence: first + offset)
                }
            }
        case let .putTurn(turn):
            try db.cachedStatement(sql: "INSERT OR REPLACE INTO turns (thread_id, turn_id, seq, record, status) VALUES (?, ?, ?, ?, ?)")
                .execute(arguments: [turn.threadID, turn.id, turn.sequence, Data(StoredRecords.encode(turn)), turn.status.rawValue])
        case let .enqueueMailbox(recipient, item):
            try db.cachedStatement(sql: "INSERT INTO mailbox (recipient_id, record) VALUES (?, ?)")
                .execute(arguments: [recipient, Data(StoredRecords.encode(item))])
        case let .removeMailbox(recipient, through):
            try db.cachedStatement(sql: "DELETE FROM mailbox WHERE recipient_id = ? AND seq <= ?").execute(arguments: [recipient, through])
        case let .claimIdempotencyKey(claim, response):
            // The key's primary key refuses a second claim; the commit then writes nothing (`CommitQueue`).
            do {
                try db.cachedStatement(sql: insertKey).execute(arguments: keyArguments(claim, response: response))
            } catch let error as DatabaseError where error.resultCode == .SQLITE_CONSTRAINT {
                throw StoreError.idempotencyKeyTaken(claim.key)
            }
        case let .recordIdempotentResponse(claim, response):
            try db.cachedStatement(sql: insertKey + " ON CONFLICT (principal, key) DO UPDATE SET response = excluded.response WHERE response IS NULL")
                .execute(arguments: keyArguments(claim, response: response))
        case let .recordImport(record):
            try db.cachedStatement(sql: "INSERT OR REPLACE INTO thread_imports (thread_id, owner, digest, lines, imported_at) VALUES (?, ?, ?, ?, ?)")
                .execute(arguments: [record.threadID, record.principal, Data(record.digest), record.lines, record.importedAt])
        case let .relinkTree(from, to):
            try db.cachedStatement(sql: "UPDATE threads SET session_id = ?, version = version + 1 WHERE session_id = ? AND id <> ?")
                .execute(arguments: [to, from, from])
        case let .appendEvents(id, events):
            for event in events {
                try db.cachedStatement(sql: "INSERT INTO thread_events_recent (thread_id, seq, created_at, record) VALUES (?, ?, ?, ?)")
                    .execute(arguments: [id, event.sequence, event.createdAt, Data(event.bytes)])
            }
        }
    }

    /// The threads with something to forget are found by a read (one index
    /// probe per thread for its oldest kept event; no writer held), then each
    /// one's old events go in short writes of a few threads each. One
    /// statement over every kept event held the writer, and so every commit,
    /// for as long as it took to scan them all (issue 49's benchmark).
    public func trimEvents(keep: Int64, createdBefore: Millis) async throws -> Int {
        try await queue.moveRecentEvents()
        let due: [ThreadID] = try await pool.read { db in
            try Row.fetchAll(db, sql: """
                SELECT t.id, t.event_sequence, e.seq AS oldest, e.created_at AS oldest_at
                FROM threads t JOIN thread_events e ON e.thread_id = t.id
                  AND e.seq = (SELECT min(o.seq) FROM thread_events o WHERE o.thread_id = t.id)
                WHERE t.event_sequence > 1
                """).compactMap { row -> ThreadID? in
                let newest: Int64 = row["event_sequence"], oldest: Int64 = row["oldest"], oldestAt: Int64 = row["oldest_at"]
                return oldest < newest && (oldest <= newest - keep || oldestAt < createdBefore) ? row["id"] : nil
            }
        }
        var forgotten = 0
        for start in stride(from: 0, to: due.count, by: Self.trimThreadsPerWrite) {
            let batch = due[start..<min(start + Self.trimThreadsPerWrite, due.count)]
            forgotten += try await pool.write { db in
                var count = 0
                for thread in batch {
                    // Read again in the write: the thread may have moved on since.
                    try db.execute(sql: """
                        DELETE FROM thread_events WHERE thread_id = ?1
                          AND seq < (SELECT t.event_sequence FROM threads t WHERE t.id = ?1)
                          AND (seq <= (SELECT t.event_sequence FROM threads t WHERE t.id = ?1) - ?2 OR created_at < ?3)
                        """, arguments: [thread, keep, createdBefore])
                    count += db.changesCount
                }
                return count
            }
        }
        return forgotten
    }

    static let trimThreadsPerWrite = 16

    /// Moved events first, then new ones: in one snapshot, every new event of
    /// a thread is newer than its moved ones (`thread_events_recent`).
    public func events(_ thread: ThreadID, after: Int64, limit: Int) async throws -> [StoredEvent] {
        try await pool.read { db in
            func fetch(_ table: String, after: Int64, limit: Int) throws -> [StoredEvent] {
                try Row.fetchAll(db, sql: "SELECT seq, created_at, record FROM \(table) WHERE thread_id = ? AND seq > ? ORDER BY seq LIMIT ?",
                                 arguments: [thread, after, limit])
                    .map { StoredEvent(sequence: $0["seq"], createdAt: $0["created_at"], bytes: [UInt8]($0["record"] as Data)) }
            }
            var events = try fetch("thread_events", after: after, limit: limit)
            if events.count < limit {
                events += try fetch("thread_events_recent", after: events.last?.sequence ?? after, limit: limit - events.count)
            }
            return events
        }
    }

    public func importRecord(_ thread: ThreadID) async throws -> ImportRecord? {
        try await pool.read { db in
            try Row.fetchOne(db, sql: "SELECT owner, digest, lines, imported_at FROM thread_imports WHERE thread_id = ?", arguments: [thread])
                .map { ImportRecord(threadID: thread, principal: $0["owner"], digest: [UInt8]($0["digest"] as Data), lines: $0["lines"],
                                    importedAt: $0["imported_at"]) }
        }
    }

    private static let insertKey = """
        INSERT INTO idempotency_keys (principal, key, method, fingerprint, thread_id, turn_ids, response, created_at)
        VALUES (?, ?, ?, ?, ?, ?, ?, ?)
        """

    private static func keyArguments(_ claim: IdempotencyClaim, response: [UInt8]?) -> StatementArguments {
        [claim.key.principal, claim.key.key, claim.method, Data(claim.fingerprint), claim.threadID,
         IdempotencyRows.turnIDs(claim.turnIDs), response.map { Data($0) }, claim.createdAtMillis]
    }

    public func idempotencyRecord(_ key: IdempotencyKey) async throws -> IdempotencyRecord? {
        try await pool.read { db in
            guard let row = try Row.fetchOne(db, sql: """
                SELECT method, fingerprint, thread_id, turn_ids, response, created_at FROM idempotency_keys
                WHERE principal = ? AND key = ?
                """, arguments: [key.principal, key.key]) else { return nil }
            let claim = IdempotencyClaim(
                key: key, method: row["method"], fingerprint: [UInt8](row["fingerprint"] as Data), threadID: row["thread_id"],
                turnIDs: IdempotencyRows.turnIDs(row["turn_ids"] as String), createdAtMillis: row["created_at"])
            return IdempotencyRecord(claim: claim, response: (row["response"] as Data?).map { [UInt8]($0) })
        }
    }

    public func purgeIdempotencyRecords(createdBefore millis: Int64) async throws -> Int {
        try await pool.write { db in
            try db.execute(sql: "DELETE FROM idempotency_keys WHERE created_at < ?", arguments: [millis])
            return db.changesCount
        }
    }
}

/// Group commit: while one transaction is being written, newly submitted
/// commits wait; the next transaction takes all of them at once. One failing
/// commit fails alone: the group is first written without savepoints, and
/// if any commit fails it is rolled back and written again with each commit
/// in its own savepoint (`replayed` counts those).
actor CommitQueue {
    private let pool: DatabasePool
    private let logger: Logger
    private var pending: [([StoreOperation], CheckedContinuation<Void, any Error>)] = []
    private var flushing = false
    private(set) var transactions = 0
    private(set) var replayed = 0
    /// About the rows in `thread_events_recent` (migration v12), moved to
    /// thread_events once they reach `moveDueAt`.
    private(set) var recentEvents: Int
    private var moveDueAt = CommitQueue.recentEventsToMove
    static let recentEventsToMove = 1024
    private let batchSize = Recorder(label: "threadwire_store_commit_batch_size", aggregate: true)
    private let latency = Metrics.Timer(label: "threadwire_store_commit_seconds")

    init(pool: DatabasePool, logger: Logger, recentEvents: Int) {
        self.pool = pool
        self.logger = logger
        self.recentEvents = recentEvents
    }

    /// Moves every new event to thread_events in one transaction: sorted by
    /// thread, each thread's index page is written once for all of its rows.
    func moveRecentEvents() async throws {
        do {
            let moved = try await pool.write { db in
                try db.execute(sql: """
                    INSERT INTO thread_events (thread_id, seq, created_at, record)
                    SELECT thread_id, seq, created_at, record FROM thread_events_recent ORDER BY thread_id, seq
                    """)
                try db.execute(sql: "DELETE FROM thread_events_recent")
                return db.changesCount
            }
            recentEvents = max(0, recentEvents - moved)
            moveDueAt = Self.recentEventsToMove
        } catch {
            // Still read from where they are; tried again after as many more.
            moveDueAt = recentEvents + Self.recentEventsToMove
            throw error
        }
    }

    func submit(_ operations: [StoreOperation]) async throws {
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
            pending.append((operations, continuation))
            if !flushing {
                flushing = true
                Task { await self.flush() }
            }
        }
    }

    private func flush() async {
        while !pending.isEmpty {
            let batch = pending
            pending = []
            let work = batch.map(\.0)
            transactions += 1
            batchSize.record(batch.count)
            let started = ContinuousClock.now
            defer { latency.record(duration: ContinuousClock.now - started) }
            do {
                let (results, wasReplayed) = try await pool.writeWithoutTransaction { db -> ([(any Error)?], Bool) in
                    if let failure = try Self.writeWhole(work, db) {
                        // Alone, the failing commit is the whole transaction.
                        guard work.count > 1 else { return ([StoreError.wrapping(failure)], false) }
                        return (try Self.writeEachInSavepoint(work, db), true)
                    }
                    return (Array(repeating: nil, count: work.count), false)
                }
                if wasReplayed { replayed += 1 }
                for ((operations, continuation), failure) in zip(batch, results) {
                    if let failure { continuation.resume(throwing: failure) } else { continuation.resume() }
                    if failure == nil {
                        for case let .appendEvents(_, events) in operations { recentEvents += events.count }
                    }
                }
            } catch {
                logger.error("store transaction failed", metadata: ["tw.error": "\(error)", "tw.commits": "\(batch.count)"])
                for (_, continuation) in batch { continuation.resume(throwing: error) }
            }
            if recentEvents >= moveDueAt {
                // After the group's answers; new commits wait for the next group meanwhile.
                do {
                    try await moveRecentEvents()
                } catch {
                    logger.error("moving new events to thread_events failed", metadata: ["tw.error": "\(error)"])
                }
            }
        }
        flushing = false
    }

    /// Every commit in one transaction, without savepoints: each savepoint
    /// is two more statements, and a copy of every page its commit changes,
    /// about a tenth of a lone update's cost (Benchmarks/commit_savepoints.py).
    /// Returns the first commit's failure, the transaction rolled back, or
    /// nil, committed. A failure of the transaction itself throws.
    private static func writeWhole(_ work: [[StoreOperation]], _ db: Database) throws -> (any Error)? {
        var failure: (any Error)?
        try db.inTransaction {
            do {
                for operations in work {
                    try SQLiteThreadStore.applyCommit(operations, db)
                }
                return .commit
            } catch {
                failure = error
                return .rollback
            }
        }
        return failure
    }

    /// The slow path after a failure: each commit in its own savepoint, so
    /// only the failing ones write nothing.
    private static func writeEachInSavepoint(_ work: [[StoreOperation]], _ db: Database) throws -> [(any Error)?] {
        var results: [(any Error)?] = []
        try db.inTransaction {
            for operations in work {
                do {
                    try db.inSavepoint {
                        try SQLiteThreadStore.applyCommit(operations, db)
                        return .commit
                    }
                    results.append(nil)
                } catch {
                    results.append(StoreError.wrapping(error))
                }
            }
            return .commit
        }
        return results
    }
}

/// A GRDB row's columns for `ThreadRow`.
private struct SQLiteColumns: ColumnReader {
    let row: Row
    func text(_ column: String) throws -> String { try row.decode(String.self, forColumn: column) }
    func optionalText(_ column: String) throws -> String? { row[column] }
    func integer(_ column: String) throws -> Int64 { try row.decode(Int64.self, forColumn: column) }
    func boolean(_ column: String) throws -> Bool { try row.decode(Bool.self, forColumn: column) }
}

private extension ColumnValue {
    var databaseValue: DatabaseValue {
        switch self {
        case let .text(value): value?.databaseValue ?? .null
        case let .integer(value): value.databaseValue
        case let .boolean(value): value.databaseValue
        }
    }
}
