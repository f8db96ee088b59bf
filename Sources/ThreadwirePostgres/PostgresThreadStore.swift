// Over 400 lines: ThreadStore's methods against PostgreSQL, one query each;
// the schema, the commit function and the batcher live in their own files.
import Foundation
public import Logging
import NIOCore
import NIOPosix
import PostgresNIO
public import ThreadwireCore
import ThreadwireStorage

/// The store on PostgreSQL (postgres-nio), for deployments that already run
/// it and for several threadwire instances on one database. Same records and
/// rules as the SQLite store: a commit is one transaction, a thread row is
/// replaced only on top of the version it replaces (compare-and-set), history
/// is append-only. Concurrent commits run on the client's pooled connections
/// in parallel; PostgreSQL groups their WAL flushes.
public final class PostgresThreadStore: ThreadStore {
    let client: PostgresClient
    private let runner: Task<Void, Never>
    let logger: Logger
    /// Where it connects, without the password (for logs and errors).
    public let location: String

    /// Connects (`postgres://user[:password]@host[:port]/database`; the
    /// password may also come from PGPASSWORD) and brings the schema up to
    /// date. Safe when several instances start at once.
    /// `stalledTransactionTimeout`: a transaction left open that long
    /// between statements is ended by PostgreSQL. A fenced commit holds its
    /// lease row while it runs; if its process is paused or cut off
    /// mid-commit, this is how the lock is freed so another instance can
    /// take the thread over (the paused commit then fails).
    /// `operationTimeout`: how long a call may take before it fails
    /// (default: 5 s, or twice the stalled-transaction timeout if longer);
    /// with leases, no longer than one, so an instance cut off from the
    /// database gives up in time for another to take its threads over.
    public static func connect(url: String, logger: Logger, startupTimeout: Duration = .seconds(15),
                               stalledTransactionTimeout: Duration = .seconds(5),
                               operationTimeout: Duration? = nil) async throws -> PostgresThreadStore {
        let target = try PostgresURL(url)
        var configuration = PostgresClient.Configuration(
            host: target.host, port: target.port, username: target.user,
            password: target.password ?? ProcessInfo.processInfo.environment["PGPASSWORD"],
            database: target.database, tls: .disable)
        configuration.options.maximumConnections = 16
        // The pool's keep-alive pings and the idle timeout of connections
        // above the minimum are timers armed each time a connection goes back
        // to the pool and cancelled when it is taken again: two task groups
        // and a Dispatch timer per commit, which woke a Dispatch thread twice
        // per request (8 context switches per settings/update at one client,
        // ~340 µs of CPU). Without the pings and with a few connections kept
        // for good, a lone request's path arms no timer; PostgreSQL's own TCP
        // keep-alives (set per session below) keep idle connections through
        // middleboxes and find a client that went away, and a connection that
        // died while idle fails its next call within `operationTimeout`
        // (UNAVAILABLE, which clients retry with their idempotency key).
        configuration.options.keepAliveBehavior = nil
        configuration.options.minimumConnections = 4
        let (seconds, attoseconds) = stalledTransactionTimeout.components
        let stalledMs = max(100, seconds * 1000 + attoseconds / 1_000_000_000_000_000)
        configuration.options.additionalStartupParameters = [
            ("idle_in_transaction_session_timeout", "\(stalledMs)"),
            ("tcp_keepalives_idle", "30"), ("tcp_keepalives_interval", "10"), ("tcp_keepalives_count", "3"),
        ]
        // One direct connection first: a refused port or a wrong password is
        // reported at once (the pool would retry it quietly).
        var direct = PostgresConnection.Configuration(
            host: target.host, port: target.port, username: target.user, password: configuration.password,
            database: target.database, tls: .disable)
        direct.options.additionalStartupParameters = configuration.options.additionalStartupParameters
        do {
            let probe = try await PostgresConnection.connect(
                on: MultiThreadedEventLoopGroup.singleton.next(), configuration: direct, id: 0, logger: logger).get()
            try await probe.close()
        } catch {
            throw StoreError.unavailable("cannot connect to PostgreSQL at \(target.redacted): \(String(reflecting: error))")
        }
        let client = PostgresClient(configuration: configuration, backgroundLogger: logger)
        let store = PostgresThreadStore(client: client, lone: LoneUpdateConnections(configuration: direct, logger: logger),
                                        logger: logger, location: target.redacted,
                                        operationTimeout: operationTimeout ?? max(.seconds(5), stalledTransactionTimeout * 2))
        do {
            // The pool retries a refused connection for ever: startup gives up.
            try await withThrowingTaskGroup(of: Void.self) { group in
                group.addTask { try await store.migrate() }
                group.addTask {
                    try await Task.sleep(for: startupTimeout)
                    throw StoreError.unavailable("no answer within \(startupTimeout)")
                }
                try await group.next()
                group.cancelAll()
            }
        } catch {
            store.close()
            throw StoreError.unavailable("PostgreSQL at \(target.redacted): \(String(reflecting: error))")
        }
        return store
    }

    /// See `bounded`.
    let operationTimeout: Duration
    private let commits: CommitBatcher

    private init(client: PostgresClient, lone: LoneUpdateConnections, logger: Logger, location: String, operationTimeout: Duration) {
        self.operationTimeout = operationTimeout
        self.client = client
        self.lone = lone
        self.logger = logger
        self.location = location
        commits = CommitBatcher(client: client, logger: logger, timeout: operationTimeout, location: location)
        runner = Task { await client.run() }
    }

    /// Closes the pool's connections.
    public func close() {
        lone.close()
        runner.cancel()
    }

    deinit {
        lone.close()
        runner.cancel()
    }

    // MARK: Writes

    /// Fenced: the commit writes nothing unless its tree is still leased at
    /// the fence's epoch, and holds the lease row FOR SHARE until it is
    /// durable, so a takeover (which updates that row) waits for it.
    /// Concurrent commits are grouped (`CommitBatcher`).
    /// A commit that only replaces one thread row (a settings update, a
    /// name, an archive), when no other commit is under way, is one prepared
    /// UPDATE of its own, on a connection kept for these
    /// (`LoneUpdateConnections`): a lone commit needs no grouping, and the
    /// commit function's JSON and PL/pgSQL cost more than so small a change.
    /// Under concurrency every commit goes to the group commit, whose one
    /// transaction and WAL flush for many is worth more.
    public func commit(_ operations: [StoreOperation], fence: LeaseFence?) async throws {
        if CommitFunction.Commit.updatedThread(operations) != nil, case let .putThread(record) = operations[0], !commits.busy {
            var event: StoredEvent?
            if operations.count == 2, case let .appendEvents(_, events) = operations[1] { event = events.count == 1 ? events[0] : nil }
            if operations.count == 1 || event != nil, let (line, connection) = lone.take() {
                try await updateThread(record, event: event, fence: fence, on: connection, of: line)
                return
            }
        }
        try await commits.commit(operations, fence: fence)
    }

    /// The connections lone updates run on (see `commit`).
    private let lone: LoneUpdateConnections

    public func commit(_ operations: [StoreOperation]) async throws {
        try await commit(operations, fence: nil)
    }

    /// The row replaced on top of the version it replaces, only while the
    /// fence's lease row has its epoch (read FOR SHARE, so a takeover waits
    /// for this transaction): the same checks as the commit function, in one
    /// statement, one round trip and one transaction, as PostgreSQL's own
    /// benchmark makes its updates (the function's JSON and PL/pgSQL cost
    /// more than the update itself for a change this small).
    /// The statement runs in the calling task: once `operationTimeout`
    /// passes, its connection is closed, which ends it (a connection cut off
    /// by a partition would otherwise wait for TCP to give up).
    private func updateThread(_ record: ThreadRecord, event: StoredEvent?, fence: LeaseFence?, on connection: PostgresConnection,
                              of line: LoneUpdateConnection) async throws {
        let statement: ThreadUpdate
        do {
            statement = ThreadUpdate(row: try ThreadRow(record), previousVersion: record.version - 1, fence: fence, event: event)
        } catch {
            line.giveBack(connection)
            throw error
        }
        // Written at once from the connection's own loop while it is open, so
        // it reaches postgres-nio's handler, which fails it if the connection
        // closes later (our deadline closes it). A write to a closed channel
        // is dropped and its statement never ends, deadline or not.
        guard connection.eventLoop.inEventLoop, !connection.isClosed else {
            line.giveBack(connection)
            return try await commits.commit([.putThread(record)] + (event.map { [.appendEvents(record.id, [$0])] } ?? []), fence: fence)
        }
        let deadline = StatementDeadline()
        let alarm = DeadlineTimer.shared.schedule(after: operationTimeout) {
            if deadline.expire() { connection.closeNow() }
        }
        var updated = 0
        var failure: (any Error)?
        do {
            for try await _ in try await connection.execute(statement, logger: logger) { updated += 1 }
        } catch {
            failure = error
        }
        DeadlineTimer.shared.cancel(alarm)
        if deadline.settle() {
            line.discard(connection)
            throw StoreError.outcomeUnknown("PostgreSQL at \(location) did not complete a commit within \(operationTimeout)")
        }
        line.giveBack(connection)
        if let failure { throw CommitBatcher.classified(failure) }
        guard updated == 0 else { return }
        // Refused: the lease moved on, or the row is not at the version replaced.
        if let fence {
            let epoch = try await bounded("a lease's read") {
                try await self.client.query("SELECT epoch FROM thread_leases WHERE tree = \(fence.tree)", logger: self.logger)
                    .decode(Int64.self).first { _ in true }
            }
            if epoch != fence.epoch { throw StoreError.leaseLost(fence) }
        }
        throw StoreError.conflict(threadID: record.id, expectedVersion: record.version - 1)
    }

    /// Commits so far and the calls they took (fewer calls: more grouping).
    public var commitStatistics: CommitStatistics { commits.statistics }

    /// A call that does not end within `operationTimeout` fails (the
    /// connection it waits on may be dead: a paused process, a partition),
    /// so no request or turn waits on it for ever.
    func bounded<T: Sendable>(_ what: String, _ body: @escaping @Sendable () async throws -> T) async throws -> T {
        let timeout = operationTimeout
        let location = self.location
        return try await withDeadline(timeout, timeoutError: {
            StoreError.unavailable("PostgreSQL at \(location) did not complete \(what) within \(timeout)")
        }, body)
    }

    /// One real write, so health follows whether commits work. The pool
    /// waits for ever for a connection to a database that went away: the
    /// probe gives up after `probeTimeout`, so readiness fails instead.
    public func probe() async throws {
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask {
                try await self.client.query(
                    "INSERT INTO health_probe (id, at) VALUES (1, \(nowMillis())) ON CONFLICT (id) DO UPDATE SET at = EXCLUDED.at",
                    logger: self.logger)
            }
            group.addTask {
                try await Task.sleep(for: Self.probeTimeout)
                throw StoreError.unavailable("PostgreSQL at \(self.location) did not commit within \(Self.probeTimeout)")
            }
            try await group.next()
            group.cancelAll()
        }
    }

    static let probeTimeout: Duration = .seconds(3)

    // MARK: Reads

    static let threadColumns = """
        id, session_id, parent_id, forked_from_id, source, depth, task_name, nickname, preview, name, created_at,
        updated_at, archived, runtime, legacy, selected_mode, model, cwd, base_instructions, config_overrides, version,
        agent_status, agent_final_message, agent_closed, owner, tool_settings, agent_role, event_sequence
        """

    public func loadThread(_ id: ThreadID) async throws -> StoredThread? {
        try await bounded("a thread's load") { try await self.load(id) }
    }

    private func load(_ id: ThreadID) async throws -> StoredThread? {
        try await client.withConnection { connection in
            // One snapshot for the row, its history and its turns.
            try await connection.query("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", logger: logger)
            do {
                guard let record = try await self.records(connection, PostgresQuery(
                    unsafeSQL: "SELECT \(Self.threadColumns) FROM threads WHERE id = $1", binds: Self.binds(id))).first else {
                    try await connection.query("COMMIT", logger: logger)
                    return nil
                }
                var history: [ContextItem] = []
                for try await record in try await connection.query(
                    "SELECT record FROM context_items WHERE thread_id = \(id) ORDER BY seq", logger: logger).decode(Data.self) {
                    history.append(try StoredRecords.decodeContextItem([UInt8](record)))
                }
                let turns = try await self.turns(connection, PostgresQuery(
                    unsafeSQL: "SELECT seq, record FROM turns WHERE thread_id = $1 ORDER BY seq", binds: Self.binds(id)), threadID: id)
                try await connection.query("COMMIT", logger: logger)
                return StoredThread(record: record, history: history, turns: turns)
            } catch {
                _ = try? await connection.query("ROLLBACK", logger: logger)
                throw error
            }
        }
    }

    public func threadRecord(_ id: ThreadID) async throws -> ThreadRecord? {
        try await bounded("a thread's read") {
            try await self.client.withConnection { connection in
                try await self.records(connection, PostgresQuery(
                    unsafeSQL: "SELECT \(Self.threadColumns) FROM threads WHERE id = $1", binds: Self.binds(id))).first
            }
        }
    }

    public func listThreads(_ query: ThreadListQuery) async throws -> (records: [ThreadRecord], nextCursor: String?) {
        let column = query.sortKey == .createdAt ? "created_at" : "updated_at"
        let order = query.ascending ? "ASC" : "DESC"
        var binds = PostgresBindings()
        binds.append(query.archived)
        var sql = "SELECT \(Self.threadColumns) FROM threads WHERE archived = $1"
        if let parent = query.parentID {
            binds.append(parent)
            sql += " AND parent_id = $\(binds.count)"
        }
        if let principal = query.principal {
            binds.append(principal)
            sql += " AND owner = $\(binds.count)"
        }
        if let term = query.searchTerm {
            // thread_search's trigram index serves the match (migration 13).
            let escaped = term.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: "%", with: "\\%")
                .replacingOccurrences(of: "_", with: "\\_")
            binds.append("%" + escaped + "%")
            sql += " AND id IN (SELECT thread_id FROM thread_search WHERE doc ILIKE $\(binds.count))"
        }
        if let position = try query.position() {
            binds.append(position.sortValue)
            binds.append(position.id)
            sql += " AND (\(column), id) \(query.ascending ? ">" : "<") ($\(binds.count - 1), $\(binds.count))"
        }
        binds.append(query.limit + 1)
        sql += " ORDER BY \(column) \(order), id \(order) LIMIT $\(binds.count)"
        let rows = try await client.withConnection { connection in
            try await self.records(connection, PostgresQuery(unsafeSQL: sql, binds: binds))
        }
        let page = Array(rows.prefix(query.limit))
        let next = rows.count > query.limit ? page.last.map(query.cursor(after:)) : nil
        return (page, next)
    }

    public func agentTree(_ sessionID: ThreadID) async throws -> [ThreadRecord] {
        try await client.withConnection { connection in
            try await self.records(connection, PostgresQuery(
                unsafeSQL: "SELECT \(Self.threadColumns) FROM threads WHERE session_id = $1 AND parent_id IS NOT NULL ORDER BY created_at, id",
                binds: Self.binds(sessionID)))
        }
    }

    public func pendingMailbox(_ recipient: ThreadID) async throws -> [(sequence: Int64, item: ContextItem)] {
        var result: [(sequence: Int64, item: ContextItem)] = []
        for try await (sequence, record) in try await client.query(
            "SELECT seq, record FROM mailbox WHERE recipient_id = \(recipient) ORDER BY seq", logger: logger).decode((Int64, Data).self) {
            result.append((sequence, try StoredRecords.decodeContextItem([UInt8](record))))
        }
        return result
    }

    public func turnsPage(_ id: ThreadID, afterSequence: Int?, limit: Int, descending: Bool) async throws -> [TurnRecord]? {
        try await client.withConnection { connection in
            var exists = false
            for try await _ in try await connection.query("SELECT 1 FROM threads WHERE id = \(id)", logger: logger) { exists = true }
            guard exists else { return nil }
            var binds = Self.binds(id)
            var sql = "SELECT seq, record FROM turns WHERE thread_id = $1"
            if let afterSequence {
                binds.append(afterSequence)
                sql += descending ? " AND seq < $2" : " AND seq > $2"
            }
            binds.append(limit)
            sql += descending ? " ORDER BY seq DESC LIMIT $\(binds.count)" : " ORDER BY seq ASC LIMIT $\(binds.count)"
            return try await self.turns(connection, PostgresQuery(unsafeSQL: sql, binds: binds), threadID: id)
        }
    }

    public func storedBytes(of principal: Principal) async throws -> Int64 {
        try await bounded("a measure of stored bytes") {
            var bytes: Int64 = 0
            for try await sum in try await self.client.query("""
                SELECT (coalesce((SELECT sum(octet_length(t.record)) FROM turns t JOIN threads h ON h.id = t.thread_id WHERE h.owner = \(principal)), 0)
                      + coalesce((SELECT sum(octet_length(c.record)) FROM context_items c JOIN threads h ON h.id = c.thread_id WHERE h.owner = \(principal)), 0))::BIGINT
                """, logger: self.logger).decode(Int64.self) {
                bytes = sum
            }
            return bytes
        }
    }

    public func threadsWithRunningTurns() async throws -> [ThreadID] {
        var ids: [ThreadID] = []
        for try await id in try await client.query(
            "SELECT DISTINCT thread_id FROM turns WHERE status = 'inProgress' ORDER BY thread_id", logger: logger).decode(String.self) {
            ids.append(id)
        }
        return ids
    }

    public func deleteTree(_ root: ThreadID, fence: LeaseFence?) async throws -> [ThreadID] {
        let tree = fence?.tree
        let epoch = fence?.epoch
        // One statement: all of it or nothing, and none of it unless the
        // fence is still the tree's lease (checked under FOR SHARE).
        let (members, held): ([ThreadID], Bool) = try await bounded("a tree's deletion") {
            for try await (ids, held) in try await self.client.query("""
                WITH lease AS (SELECT 1 FROM thread_leases WHERE tree = \(tree) AND epoch = \(epoch) FOR SHARE),
                allowed AS (SELECT (\(tree)::text IS NULL OR EXISTS (SELECT 1 FROM lease)) AS ok),
                members AS (SELECT id FROM threads WHERE (id = \(root) OR session_id = \(root)) AND (SELECT ok FROM allowed)),
                c AS (DELETE FROM context_items WHERE thread_id IN (SELECT id FROM members)),
                t AS (DELETE FROM turns WHERE thread_id IN (SELECT id FROM members)),
                m AS (DELETE FROM mailbox WHERE recipient_id IN (SELECT id FROM members)),
                k AS (DELETE FROM idempotency_keys WHERE thread_id IN (SELECT id FROM members)),
                i AS (DELETE FROM thread_imports WHERE thread_id IN (SELECT id FROM members)),
                e AS (DELETE FROM thread_events WHERE thread_id IN (SELECT id FROM members)),
                gone AS (DELETE FROM threads WHERE id IN (SELECT id FROM members) RETURNING id)
                SELECT coalesce(array_agg(id ORDER BY id = \(root) DESC, id), '{}'), (SELECT ok FROM allowed) FROM gone
                """, logger: self.logger).decode(([String], Bool).self) {
                return (ids, held)
            }
            return ([], true)
        }
        if !held, let fence { throw StoreError.leaseLost(fence) }
        return members.first == root ? members : []
    }

    public func threadsWithQueuedTurns() async throws -> [ThreadID] {
        // The queue is in the settings JSON, present only when not empty.
        try await bounded("the search for queued turns") {
            var ids: [ThreadID] = []
            for try await id in try await self.client.query(
                #"SELECT id FROM threads WHERE tool_settings LIKE '%"queue":%' ORDER BY id"#, logger: self.logger).decode(String.self) {
                ids.append(id)
            }
            return ids
        }
    }

    public func idempotencyRecord(_ key: IdempotencyKey) async throws -> IdempotencyRecord? {
        try await bounded("an idempotency key's read") {
            let rows = try await self.client.query("""
                SELECT method, fingerprint, thread_id, turn_ids, response, created_at FROM idempotency_keys
                WHERE principal = \(key.principal) AND key = \(key.key)
                """, logger: self.logger)
            for try await (method, fingerprint, thread, turns, response, created) in rows.decode(
                (String, Data, String?, String, Data?, Int64).self) {
                let claim = IdempotencyClaim(key: key, method: method, fingerprint: [UInt8](fingerprint), threadID: thread,
                                             turnIDs: IdempotencyRows.turnIDs(turns), createdAtMillis: created)
                return IdempotencyRecord(claim: claim, response: response.map { [UInt8]($0) })
            }
            return nil
        }
    }

    public func trimEvents(keep: Int64, createdBefore: Millis) async throws -> Int {
        // The threads with something to forget first (an index probe each for
        // its oldest event), then their events a few threads per statement:
        // one DELETE over every stored event outgrows the operation timeout
        // at scale, and cut there it forgets nothing, pass after pass.
        let due: [ThreadID] = try await bounded("the search for old events") {
            var threads: [ThreadID] = []
            for try await id in try await self.client.query("""
                SELECT t.id FROM threads t
                CROSS JOIN LATERAL (SELECT e.seq, e.created_at FROM thread_events e
                                    WHERE e.thread_id = t.id ORDER BY e.seq LIMIT 1) oldest
                WHERE oldest.seq < t.event_sequence
                  AND (oldest.seq <= t.event_sequence - \(keep) OR oldest.created_at < \(createdBefore))
                """, logger: self.logger).decode(String.self) {
                threads.append(id)
            }
            return threads
        }
        var forgotten = 0
        for start in stride(from: 0, to: due.count, by: Self.trimThreadsPerStatement) {
            let batch = Array(due[start..<min(start + Self.trimThreadsPerStatement, due.count)])
            forgotten += try await bounded("the trim of old events") {
                // The thread's newest number read again here: it may have moved on.
                for try await count in try await self.client.query("""
                    WITH gone AS (DELETE FROM thread_events e USING threads t
                        WHERE t.id = ANY(\(batch)) AND t.id = e.thread_id AND e.seq < t.event_sequence
                          AND (e.seq <= t.event_sequence - \(keep) OR e.created_at < \(createdBefore))
                        RETURNING 1)
                    SELECT count(*)::BIGINT FROM gone
                    """, logger: self.logger).decode(Int64.self) {
                    return Int(count)
                }
                return 0
            }
        }
        return forgotten
    }

    static let trimThreadsPerStatement = 16

    public func events(_ thread: ThreadID, after: Int64, limit: Int) async throws -> [StoredEvent] {
        try await bounded("a thread's events' read") {
            var events: [StoredEvent] = []
            for try await (seq, at, record) in try await self.client.query(
                "SELECT seq, created_at, record FROM thread_events WHERE thread_id = \(thread) AND seq > \(after) ORDER BY seq LIMIT \(limit)",
                logger: self.logger
            ).decode((Int64, Int64, ByteBuffer).self) {
                events.append(StoredEvent(sequence: seq, createdAt: at, bytes: Array(buffer: record)))
            }
            return events
        }
    }

    public func importRecord(_ thread: ThreadID) async throws -> ImportRecord? {
        try await bounded("an import record's read") {
            for try await (owner, digest, lines, at) in try await self.client.query(
                "SELECT owner, digest, lines, imported_at FROM thread_imports WHERE thread_id = \(thread)", logger: self.logger
            ).decode((String, Data, Int64, Int64).self) {
                return ImportRecord(threadID: thread, principal: owner, digest: [UInt8](digest), lines: Int(lines), importedAt: at)
            }
            return nil
        }
    }

    public func purgeIdempotencyRecords(createdBefore millis: Int64) async throws -> Int {
        try await bounded("the purge of old idempotency keys") {
            var purged = 0
            for try await _ in try await self.client.query(
                "DELETE FROM idempotency_keys WHERE created_at < \(millis) RETURNING 1", logger: self.logger).decode(Int.self) {
                purged += 1
            }
            return purged
        }
    }

    // MARK: Rows

    private static func binds(_ id: String) -> PostgresBindings {
        var binds = PostgresBindings()
        binds.append(id)
        return binds
    }


    private func turns(_ connection: PostgresConnection, _ query: PostgresQuery, threadID: ThreadID) async throws -> [TurnRecord] {
        var turns: [TurnRecord] = []
        for try await (sequence, record) in try await connection.query(query, logger: logger).decode((Int, Data).self) {
            turns.append(try StoredRecords.decodeTurn([UInt8](record), threadID: threadID, sequence: sequence))
        }
        return turns
    }

    private func records(_ connection: PostgresConnection, _ query: PostgresQuery) async throws -> [ThreadRecord] {
        var records: [ThreadRecord] = []
        for try await row in try await connection.query(query, logger: logger) {
            let record = try ThreadRow(reading: PostgresColumns(cells: row.makeRandomAccess())).record()
            records.append(record)
        }
        return records
    }
}

/// A PostgreSQL row's columns for `ThreadRow`.
private struct PostgresColumns: ColumnReader {
    let cells: PostgresRandomAccessRow
    func text(_ column: String) throws -> String { try cells[column].decode(String.self) }
    func optionalText(_ column: String) throws -> String? { try cells[column].decode(String?.self) }
    func integer(_ column: String) throws -> Int64 { try cells[column].decode(Int64.self) }
    func boolean(_ column: String) throws -> Bool { try cells[column].decode(Bool.self) }
}
