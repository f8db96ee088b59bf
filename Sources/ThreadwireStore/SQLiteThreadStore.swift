import Foundation
internal import GRDB
public import Logging
public import ThreadwireCore
import ThreadwireContract
import ThreadwireWire

/// The embedded default store: one SQLite file in WAL mode with
/// synchronous=FULL, so a commit that returned survives kill -9 and power loss.
/// GRDB runs every statement on its own queues, never on the caller's thread
/// (NIO event loops must not block). Concurrent commits are grouped into one
/// transaction, one fsync (see `CommitQueue`).
public final class SQLiteThreadStore: ThreadStore {
    private let pool: DatabasePool
    private let queue: CommitQueue
    public let path: String

    public init(directory: String, logger: Logger = Logger(label: "threadwire.store")) throws {
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        path = (directory as NSString).appendingPathComponent("threadwire.sqlite")
        var configuration = Configuration()
        configuration.prepareDatabase { db in
            try db.execute(sql: "PRAGMA synchronous = FULL")
        }
        configuration.busyMode = .timeout(10)
        pool = try DatabasePool(path: path, configuration: configuration)
        try Self.migrator.migrate(pool)
        queue = CommitQueue(pool: pool, logger: logger)
    }

    static var migrator: DatabaseMigrator {
        var migrator = DatabaseMigrator()
        migrator.registerMigration("v1: threads, history, turns") { db in
            try db.execute(sql: """
                CREATE TABLE threads (
                    id TEXT PRIMARY KEY NOT NULL,
                    session_id TEXT NOT NULL,
                    parent_id TEXT,
                    forked_from_id TEXT,
                    source TEXT NOT NULL,
                    depth INTEGER NOT NULL,
                    task_name TEXT,
                    nickname TEXT,
                    preview TEXT NOT NULL,
                    name TEXT,
                    created_at INTEGER NOT NULL,
                    updated_at INTEGER NOT NULL,
                    archived INTEGER NOT NULL,
                    runtime TEXT,
                    legacy INTEGER NOT NULL,
                    selected_mode TEXT,
                    model TEXT NOT NULL,
                    cwd TEXT NOT NULL,
                    base_instructions TEXT,
                    config_overrides TEXT NOT NULL
                );
                CREATE INDEX threads_created ON threads(archived, created_at, id);
                CREATE INDEX threads_updated ON threads(archived, updated_at, id);
                CREATE INDEX threads_parent ON threads(parent_id);
                -- Model-visible history, append-only; each row a threadwire.v1.ContextItem.
                CREATE TABLE context_items (
                    thread_id TEXT NOT NULL,
                    seq INTEGER NOT NULL,
                    record BLOB NOT NULL,
                    PRIMARY KEY (thread_id, seq)
                ) WITHOUT ROWID;
                -- Each row a threadwire.v1.Turn (items, context, model request refs).
                CREATE TABLE turns (
                    thread_id TEXT NOT NULL,
                    turn_id TEXT NOT NULL,
                    seq INTEGER NOT NULL,
                    record BLOB NOT NULL,
                    PRIMARY KEY (thread_id, turn_id)
                ) WITHOUT ROWID;
                """)
        }
        return migrator
    }

    public func commit(_ operations: [StoreOperation]) async throws {
        try await queue.submit(operations)
    }

    /// Transactions written so far (fewer than commits when group commit works).
    public var transactionCount: Int {
        get async { await queue.transactions }
    }

    public func loadThread(_ id: ThreadID) async throws -> StoredThread? {
        try await pool.read { db in
            guard let row = try Row.fetchOne(db, sql: "SELECT * FROM threads WHERE id = ?", arguments: [id]) else { return nil }
            let history = try Row.fetchAll(db, sql: "SELECT record FROM context_items WHERE thread_id = ? ORDER BY seq", arguments: [id])
                .map { try ContextItem(wire: Wire.ContextItem(serializedBytes: [UInt8]($0["record"] as Data))) }
            let turns = try Row.fetchAll(db, sql: "SELECT seq, record FROM turns WHERE thread_id = ? ORDER BY seq", arguments: [id])
                .map { try TurnRecord(storedWire: Wire.Turn(serializedBytes: [UInt8]($0["record"] as Data)), threadID: id, sequence: $0["seq"]) }
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
        if let cursor = query.cursor {
            let parts = cursor.split(separator: "|", maxSplits: 1)
            guard parts.count == 2, let value = Int64(parts[0]) else {
                throw DomainError.invalidArgument("cursor '\(cursor)' is not a cursor this server returned")
            }
            sql += " AND (\(column), id) \(query.ascending ? ">" : "<") (?, ?)"
            _ = arguments.append(contentsOf: [value, String(parts[1])])
        }
        sql += " ORDER BY \(column) \(order), id \(order) LIMIT ?"
        _ = arguments.append(contentsOf: [query.limit + 1])
        let finalSQL = sql
        let finalArguments = arguments
        let rows = try await pool.read { db in try Row.fetchAll(db, sql: finalSQL, arguments: finalArguments).map(Self.record) }
        let page = Array(rows.prefix(query.limit))
        let next = rows.count > query.limit ? page.last.map { record in
            "\(query.sortKey == .createdAt ? record.createdAt : record.updatedAt)|\(record.id)"
        } : nil
        return (page, next)
    }

    // MARK: Rows

    static func record(_ row: Row) throws -> ThreadRecord {
        var record = ThreadRecord(
            id: row["id"], sessionID: row["session_id"],
            source: ThreadSourceKind(rawValue: row["source"]) ?? .appServer, depth: row["depth"],
            createdAt: row["created_at"], model: row["model"], cwd: row["cwd"])
        record.parentID = row["parent_id"]
        record.forkedFromID = row["forked_from_id"]
        record.taskName = row["task_name"]
        record.nickname = row["nickname"]
        record.preview = row["preview"]
        record.name = row["name"]
        record.updatedAt = row["updated_at"]
        record.archived = row["archived"]
        record.runtime = (row["runtime"] as String?).flatMap(MultiAgentRuntime.init(rawValue:))
        record.legacy = row["legacy"]
        record.selectedMode = (row["selected_mode"] as String?).flatMap(MultiAgentMode.init(rawValue:))
        record.baseInstructions = row["base_instructions"]
        let overrides: String = row["config_overrides"]
        record.configOverrides = try JSONDecoder().decode([KeyValuePair].self, from: Data(overrides.utf8))
        return record
    }

    static func apply(_ operation: StoreOperation, _ db: Database) throws {
        switch operation {
        case let .putThread(r):
            let overrides = String(decoding: try JSONEncoder().encode(r.configOverrides), as: UTF8.self)
            try db.cachedStatement(sql: """
                INSERT OR REPLACE INTO threads (id, session_id, parent_id, forked_from_id, source, depth, task_name,
                    nickname, preview, name, created_at, updated_at, archived, runtime, legacy, selected_mode, model,
                    cwd, base_instructions, config_overrides)
                VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                """).execute(arguments: [
                    r.id, r.sessionID, r.parentID, r.forkedFromID, r.source.rawValue, r.depth, r.taskName,
                    r.nickname, r.preview, r.name, r.createdAt, r.updatedAt, r.archived, r.runtime?.rawValue, r.legacy,
                    r.selectedMode?.rawValue, r.model, r.cwd, r.baseInstructions, overrides,
                ])
        case let .appendHistory(id, first, items):
            for (offset, item) in items.enumerated() {
                try db.cachedStatement(sql: "INSERT INTO context_items (thread_id, seq, record) VALUES (?, ?, ?)")
                    .execute(arguments: [id, first + offset, Data(item.wire.serializedBytes())])
            }
        case let .putTurn(turn):
            try db.cachedStatement(sql: "INSERT OR REPLACE INTO turns (thread_id, turn_id, seq, record) VALUES (?, ?, ?, ?)")
                .execute(arguments: [turn.threadID, turn.id, turn.sequence, Data(turn.storedWire.serializedBytes())])
        case let .setRuntimeIfUnset(id, runtime):
            // Only the runtime column: history rows and timestamps stay as they were.
            try db.execute(sql: "UPDATE threads SET runtime = ? WHERE id = ? AND runtime IS NULL",
                           arguments: [runtime.rawValue, id])
        }
    }
}

/// Group commit: while one transaction is being written, newly submitted
/// commits wait; the next transaction takes all of them at once. Each commit
/// runs in its own savepoint, so one failing commit fails alone.
actor CommitQueue {
    private let pool: DatabasePool
    private let logger: Logger
    private var pending: [([StoreOperation], CheckedContinuation<Void, any Error>)] = []
    private var flushing = false
    private(set) var transactions = 0

    init(pool: DatabasePool, logger: Logger) {
        self.pool = pool
        self.logger = logger
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
            do {
                let results = try await pool.write { db -> [String?] in
                    var results: [String?] = []
                    for operations in work {
                        do {
                            try db.inSavepoint {
                                for operation in operations { try SQLiteThreadStore.apply(operation, db) }
                                return .commit
                            }
                            results.append(nil)
                        } catch {
                            results.append("\(error)")
                        }
                    }
                    return results
                }
                for ((_, continuation), failure) in zip(batch, results) {
                    if let failure { continuation.resume(throwing: StoreFailure(message: failure)) } else { continuation.resume() }
                }
            } catch {
                logger.error("store transaction failed", metadata: ["tw.error": "\(error)", "tw.commits": "\(batch.count)"])
                for (_, continuation) in batch { continuation.resume(throwing: error) }
            }
        }
        flushing = false
    }
}

public struct StoreFailure: Error, CustomStringConvertible {
    public var message: String
    public var description: String { message }
}
