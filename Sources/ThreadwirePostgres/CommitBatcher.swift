import Foundation
import Logging
import PostgresNIO
import Synchronization
import ThreadwireCore
import ThreadwireStorage

/// Group commit. Every commit becomes one element of a call to
/// `threadwire_commit` (a PL/pgSQL function, `CommitFunction`): commits that
/// arrive while `maxCallsInFlight` calls run wait and then go together, in
/// one round trip, one transaction and one WAL flush; a lone commit is sent
/// at once, so a quiet server adds no delay. Before it writes anything, the
/// function checks each commit's fence and versions, so a refused commit
/// (stale version, lost lease) writes nothing and does not disturb the others
/// of its call. A call whose commits each only replace a different thread's
/// row (settings, tools, names) goes as one set-based UPDATE with the same
/// checks instead (`ThreadUpdates`). A call that fails as a whole (a
/// constraint, a dropped connection) is retried one commit per call, so only
/// the commit at fault fails.
final class CommitBatcher: Sendable {
    private struct Pending: Sendable {
        let commit: CommitFunction.Commit
        let continuation: CheckedContinuation<Void, any Error>
    }

    private struct State {
        var pending: [Pending] = []
        var callsInFlight = 0
        var statistics = CommitStatistics()

        mutating func take(_ count: Int) -> [Pending] {
            let taken = Array(pending.prefix(count))
            pending.removeFirst(taken.count)
            return taken
        }
    }

    /// Two calls overlap: one is flushing the WAL while the next fills.
    static let maxCallsInFlight = 2
    /// Fences locked by one call stay few (lock table, statement size).
    static let maxCommitsPerCall = 64

    private let state = Mutex(State())
    private let client: PostgresClient
    private let logger: Logger
    private let timeout: Duration
    private let location: String

    /// `timeout`: a call that does not end within it fails (see `PostgresThreadStore.bounded`).
    init(client: PostgresClient, logger: Logger, timeout: Duration, location: String) {
        self.client = client
        self.logger = logger
        self.timeout = timeout
        self.location = location
    }

    func commit(_ operations: [StoreOperation], fence: LeaseFence?) async throws {
        let commit = try CommitFunction.Commit(operations, fence: fence)
        try await withCheckedThrowingContinuation { continuation in
            let startCalling = state.withLock { state -> Bool in
                state.pending.append(Pending(commit: commit, continuation: continuation))
                guard state.callsInFlight < Self.maxCallsInFlight else { return false }
                state.callsInFlight += 1
                return true
            }
            // On the committing request's loop when it has one (see
            // `EventLoopTaskExecutor`): the call's awaits then continue in place.
            if startCalling { Task(executorPreference: TaskTracker.inheritedExecutor) { await self.drain() } }
        }
    }

    var statistics: CommitStatistics { state.withLock { $0.statistics } }

    /// Whether a call runs or commits wait for one.
    var busy: Bool { state.withLock { $0.callsInFlight > 0 || !$0.pending.isEmpty } }

    /// Calls until nothing waits.
    private func drain() async {
        while true {
            let batch = state.withLock { state -> [Pending] in
                let batch = state.take(Self.maxCommitsPerCall)
                if batch.isEmpty {
                    state.callsInFlight -= 1
                } else {
                    state.statistics.calls += 1
                    state.statistics.commits += batch.count
                }
                return batch
            }
            if batch.isEmpty { return }
            // The call runs in this task; if it hangs (a dead connection, a
            // paused database), the alarm answers its commits with an error
            // and frees its slot, and this task is abandoned.
            let answer = Answer(batch.map(\.continuation))
            let (timeout, location) = (self.timeout, self.location)
            let alarm = DeadlineTimer.shared.schedule(after: timeout) {
                let error = StoreError.outcomeUnknown("PostgreSQL at \(location) did not complete a commit within \(timeout)")
                if answer.give(batch.map { _ in .failure(error) }) { self.abandoned() }
            }
            let outcomes = await run(batch.map(\.commit))
            DeadlineTimer.shared.cancel(alarm)
            guard answer.give(outcomes) else { return }
        }
    }

    /// A hung call's slot is free again; commits that wait get a new call.
    private func abandoned() {
        let restart = state.withLock { state -> Bool in
            guard !state.pending.isEmpty else {
                state.callsInFlight -= 1
                return false
            }
            return true
        }
        if restart { Task(executorPreference: TaskTracker.inheritedExecutor) { await self.drain() } }
    }

    /// One outcome per commit.
    private func run(_ commits: [CommitFunction.Commit]) async -> [Result<Void, any Error>] {
        do {
            return try await call(commits)
        } catch where commits.count > 1 && Self.refusedByServer(error) {
            logger.debug("a grouped commit failed; committing its commits one by one", metadata: [
                "tw.commits": "\(commits.count)", "tw.error": "\(String(reflecting: error))"])
            var outcomes: [Result<Void, any Error>] = []
            for commit in commits {
                do { outcomes.append(try await call([commit])[0]) } catch { outcomes.append(.failure(Self.classified(error))) }
            }
            return outcomes
        } catch {
            return commits.map { _ in .failure(Self.classified(error)) }
        }
    }

    /// PostgreSQL answered with an error: the transaction was rolled back.
    static func refusedByServer(_ error: any Error) -> Bool {
        (error as? PSQLError)?.serverInfo != nil
    }

    /// context_items' primary key refused an append: PostgreSQL's detail is
    /// "Key (thread_id, seq)=(ID, SEQ) already exists." (the id may hold
    /// commas, the sequence cannot).
    static func historySequenceTaken(_ error: any Error) -> StoreError? {
        guard let info = (error as? PSQLError)?.serverInfo, info[.sqlState] == "23505",
              info[.constraintName] == "context_items_pkey", let detail = info[.detail],
              let match = detail.firstMatch(of: /^Key \(thread_id, seq\)=\((.*), (\d+)\) already exists\.$/),
              let sequence = Int(match.2) else { return nil }
        return .historySequenceTaken(threadID: String(match.1), sequence: sequence)
    }

    /// A refusal stays what it is; anything else (the connection lost or
    /// timed out mid-call) leaves the commit's outcome unknown.
    static func classified(_ error: any Error) -> any Error {
        if let taken = historySequenceTaken(error) { return taken }
        if refusedByServer(error) || error is StoreError { return error }
        return StoreError.outcomeUnknown("\(String(reflecting: error))")
    }

    private func call(_ commits: [CommitFunction.Commit]) async throws -> [Result<Void, any Error>] {
        if let threads = Self.distinctUpdatedThreads(commits) { return try await updateThreads(commits, threads: threads) }
        return try await callFunction(commits)
    }

    private func callFunction(_ commits: [CommitFunction.Commit]) async throws -> [Result<Void, any Error>] {
        var binds = PostgresBindings()
        binds.append(CommitJSON.encode(commits))
        var statuses: [String] = []
        for try await row in try await client.execute(CommitFunction.Call(bindings: binds), logger: logger) {
            statuses = row
        }
        guard statuses.count == commits.count else {
            throw StoreError.unavailable("threadwire_commit answered \(statuses.count) outcomes for \(commits.count) commits")
        }
        return zip(commits, statuses).map { commit, status in
            switch status {
            case "ok":
                return .success(())
            case "lease_lost":
                return .failure(StoreError.leaseLost(LeaseFence(tree: commit.tree ?? "", epoch: commit.epoch ?? 0)))
            case "key_taken":
                guard let key = commit.claimedKey else { return .failure(StoreError.unavailable("threadwire_commit answered 'key_taken' for a commit without a key")) }
                return .failure(StoreError.idempotencyKeyTaken(key))
            default:
                // "conflict <id> <expected version>"
                let parts = status.split(separator: " ")
                guard parts.count == 3, parts[0] == "conflict", let expected = Int64(parts[2]) else {
                    return .failure(StoreError.unavailable("threadwire_commit answered '\(status)'"))
                }
                return .failure(StoreError.conflict(threadID: String(parts[1]), expectedVersion: expected))
            }
        }
    }
}

extension CommitBatcher {
    /// The threads of `commits` when each only replaces a different thread's
    /// row (the common group: settings, tools, names of many threads).
    static func distinctUpdatedThreads(_ commits: [CommitFunction.Commit]) -> [String]? {
        var threads: [String] = []
        var seen = Set<String>()
        for commit in commits {
            guard let thread = commit.updatedThread, seen.insert(thread).inserted else { return nil }
            threads.append(thread)
        }
        return threads
    }

    /// Row replacements of distinct threads as one set-based UPDATE (one
    /// statement, no PL/pgSQL loop: PostgreSQL spent about 38 µs per commit
    /// in the function's loop and JSON against 19 µs in the UPDATE itself),
    /// with the function's checks in its order: every fence locked FOR SHARE
    /// in tree order (the aggregate takes them all before a row is
    /// written), then each row compare-and-set on owner and version. A commit whose
    /// row was not replaced wrote nothing; the commit function then names
    /// its refusal (a lost lease or a conflict cannot come right again).
    private func updateThreads(_ commits: [CommitFunction.Commit], threads: [String]) async throws -> [Result<Void, any Error>] {
        state.withLock { $0.statistics.rowUpdateCalls += 1 }
        var binds = PostgresBindings()
        binds.append(CommitJSON.encode(commits))
        var replaced = Set<String>()
        for try await thread in try await client.execute(CommitFunction.ThreadUpdates(bindings: binds), logger: logger) {
            replaced.insert(thread)
        }
        var outcomes: [Result<Void, any Error>] = []
        for (commit, thread) in zip(commits, threads) {
            outcomes.append(replaced.contains(thread) ? .success(()) : try await callFunction([commit])[0])
        }
        return outcomes
    }
}

/// Answers the commits of one call once: with the call's outcomes, or with
/// a timeout error if its alarm comes first.
private final class Answer: Sendable {
    private let continuations: Mutex<[CheckedContinuation<Void, any Error>]?>

    init(_ continuations: [CheckedContinuation<Void, any Error>]) { self.continuations = Mutex(continuations) }

    /// False if they were already answered.
    func give(_ outcomes: [Result<Void, any Error>]) -> Bool {
        guard let continuations = continuations.withLock({ state in defer { state = nil }; return state }) else { return false }
        for (continuation, outcome) in zip(continuations, outcomes) { continuation.resume(with: outcome) }
        return true
    }
}

/// How well commits were grouped: `commits` sent in `calls` calls, of which
/// `rowUpdateCalls` went as one set-based UPDATE.
public struct CommitStatistics: Sendable, Equatable {
    public var calls = 0
    public var commits = 0
    public var rowUpdateCalls = 0
}

/// The PL/pgSQL function every commit goes through, and its input.
enum CommitFunction {
    /// One commit as JSON: its fence and its operations (bytes in base64).
    struct Commit: Encodable, Sendable {
        var tree: String?
        var epoch: Int64?
        var ops: [Operation]
        /// The key its claim stores (not sent: named when it is refused).
        var claimedKey: IdempotencyKey?
        /// The thread whose row is this commit's only change, on top of an
        /// earlier version (not sent: such commits can go as one UPDATE).
        var updatedThread: String?

        init(_ operations: [StoreOperation], fence: LeaseFence?) throws {
            tree = fence?.tree
            epoch = fence?.epoch
            ops = try operations.map(Operation.init)
            for case let .claimIdempotencyKey(claim, _) in operations { claimedKey = claim.key }
            if operations.count == 1, case let .putThread(record) = operations[0], record.version > 1 { updatedThread = record.id }
        }

        enum CodingKeys: String, CodingKey { case tree, epoch, ops }
    }

    /// `k` names the kind; the other keys are the kind's.
    struct Operation: Encodable, Sendable {
        var k: String
        var r: ThreadRow?
        var id: String?
        var first: Int?
        var items: [Data]?
        var seq: Int?
        var record: Data?
        var status: String?
        var through: Int64?
        var turnID: String?
        // An idempotency key's principal, key, method, fingerprint, turn ids and creation time.
        var p: String?
        var key: String?
        var m: String?
        var fp: Data?
        var turns: String?
        var at: Int64?
        // An import record's line count; a relink's new tree.
        var lines: Int?
        var to: String?

        init(_ operation: StoreOperation) throws {
            switch operation {
            case let .putThread(record):
                k = "thread"
                r = try ThreadRow(record)
            case let .appendHistory(thread, first, items):
                k = "history"
                id = thread
                self.first = first
                self.items = items.map { Data(StoredRecords.encode($0)) }
            case let .putTurn(turn):
                k = "turn"
                id = turn.threadID
                turnID = turn.id
                seq = turn.sequence
                record = Data(StoredRecords.encode(turn))
                status = turn.status.rawValue
            case let .enqueueMailbox(recipient, item):
                k = "mail+"
                id = recipient
                record = Data(StoredRecords.encode(item))
            case let .removeMailbox(recipient, through):
                k = "mail-"
                id = recipient
                self.through = through
            case let .claimIdempotencyKey(claim, response):
                k = "key"
                setKey(claim)
                record = response.map { Data($0) }
            case let .recordIdempotentResponse(claim, response):
                k = "reply"
                setKey(claim)
                record = Data(response)
            case let .recordImport(imported):
                k = "import"
                id = imported.threadID
                p = imported.principal
                fp = Data(imported.digest)
                lines = imported.lines
                at = imported.importedAt
            case let .relinkTree(from, to):
                k = "relink"
                id = from
                self.to = to
            }
        }

        private mutating func setKey(_ claim: IdempotencyClaim) {
            p = claim.key.principal
            key = claim.key.key
            m = claim.method
            fp = Data(claim.fingerprint)
            id = claim.threadID
            turns = IdempotencyRows.turnIDs(claim.turnIDs)
            at = claim.createdAtMillis
        }

        enum CodingKeys: String, CodingKey {
            case k, r, id, first, items, seq, record, status, through, turnID = "turn", p, key, m, fp, turns, at, lines, to
        }
    }

    /// Commits that each only replace a distinct thread's row, in the
    /// function's input shape: the ids of the rows replaced.
    struct ThreadUpdates: PostgresPreparedStatement {
        typealias Row = String
        static let name = "threadwire_thread_updates"
        static let sql = """
            WITH batch AS MATERIALIZED (
                SELECT r.*, c->>'tree' AS fence_tree, (c->>'epoch')::bigint AS fence_epoch
                FROM json_array_elements($1::json) c, LATERAL json_populate_record(NULL::threads, c->'ops'->0->'r') r),
            held AS MATERIALIZED (
                SELECT coalesce(array_agg(l.tree || ' ' || l.epoch), '{}') AS fences FROM (
                    SELECT tree, epoch FROM thread_leases WHERE tree IN (SELECT fence_tree FROM batch) ORDER BY tree FOR SHARE) l)
            UPDATE threads t SET \(ThreadRow.changeableColumns.map { "\($0) = b.\($0)" }.joined(separator: ", "))
            FROM batch b, held h
            WHERE t.id = b.id AND t.owner = b.owner AND t.version = b.version - 1
              AND (b.fence_tree IS NULL OR b.fence_tree || ' ' || b.fence_epoch = ANY (h.fences))
            RETURNING t.id
            """
        let bindings: PostgresBindings
        func makeBindings() throws -> PostgresBindings { bindings }
        func decodeRow(_ row: PostgresRow) throws -> String { try row.decode(String.self) }
    }

    struct Call: PostgresPreparedStatement {
        typealias Row = [String]
        static let name = "threadwire_commit_call"
        static let sql = "SELECT threadwire_commit($1::jsonb)"
        let bindings: PostgresBindings
        func makeBindings() throws -> PostgresBindings { bindings }
        func decodeRow(_ row: PostgresRow) throws -> [String] { try row.decode([String].self) }
    }

    /// Outcomes, one per commit: "ok", "lease_lost", or "conflict <thread>
    /// <expected version>". The fences of the whole call are locked first,
    /// FOR SHARE and in tree order (lease renewal locks in the same order, so
    /// the two never deadlock); a takeover of a tree then waits for the call.
    /// A refused commit writes nothing: its thread rows (compare-and-set) go
    /// first, and when it has several, all are checked and locked before the
    /// first write.
    static let definition = """
        CREATE OR REPLACE FUNCTION threadwire_commit(batch jsonb) RETURNS text[] LANGUAGE plpgsql AS $fn$
        DECLARE
            c jsonb; op jsonb; r jsonb; outcome text; outcomes text[] := '{}'; held text[];
            found_version bigint; changed bigint;
        BEGIN
            SELECT coalesce(array_agg(l.tree || ' ' || l.epoch), '{}') INTO held FROM (
                SELECT tree, epoch FROM thread_leases
                WHERE tree IN (SELECT e->>'tree' FROM jsonb_array_elements(batch) e WHERE e ? 'tree')
                ORDER BY tree FOR SHARE) l;
            FOR c IN SELECT value FROM jsonb_array_elements(batch) LOOP
                outcome := 'ok';
                IF c->>'tree' IS NOT NULL AND NOT ((c->>'tree') || ' ' || (c->>'epoch') = ANY (held)) THEN
                    outcome := 'lease_lost';
                END IF;
                IF outcome = 'ok' AND (SELECT count(*) FROM jsonb_array_elements(c->'ops') o WHERE o->>'k' = 'thread') > 1 THEN
                    FOR op IN SELECT value FROM jsonb_array_elements(c->'ops') o WHERE o->>'k' = 'thread' LOOP
                        r := op->'r';
                        IF (r->>'version')::bigint > 1 THEN
                            SELECT version INTO found_version FROM threads
                            WHERE id = r->>'id' AND owner = r->>'owner' FOR UPDATE;
                            IF found_version IS DISTINCT FROM (r->>'version')::bigint - 1 THEN
                                outcome := 'conflict ' || (r->>'id') || ' ' || ((r->>'version')::bigint - 1);
                                EXIT;
                            END IF;
                        ELSIF EXISTS (SELECT 1 FROM threads WHERE id = r->>'id') THEN
                            outcome := 'conflict ' || (r->>'id') || ' 0';
                            EXIT;
                        END IF;
                    END LOOP;
                END IF;
                IF outcome = 'ok' THEN
                    FOR op IN SELECT o.value FROM jsonb_array_elements(c->'ops') WITH ORDINALITY AS o(value, ordinal)
                              ORDER BY o.value->>'k' <> 'thread', o.ordinal LOOP
                        CASE op->>'k'
                        WHEN 'thread' THEN
                            r := op->'r';
                            IF (r->>'version')::bigint > 1 THEN
                                UPDATE threads t SET session_id = v.session_id, parent_id = v.parent_id,
                                    forked_from_id = v.forked_from_id, source = v.source, depth = v.depth,
                                    task_name = v.task_name, nickname = v.nickname, preview = v.preview, name = v.name,
                                    created_at = v.created_at, updated_at = v.updated_at, archived = v.archived,
                                    runtime = v.runtime, legacy = v.legacy, selected_mode = v.selected_mode,
                                    model = v.model, cwd = v.cwd, base_instructions = v.base_instructions,
                                    config_overrides = v.config_overrides, version = v.version,
                                    agent_status = v.agent_status, agent_final_message = v.agent_final_message,
                                    agent_closed = v.agent_closed
                                FROM jsonb_populate_record(NULL::threads, r) v
                                WHERE t.id = v.id AND t.owner = v.owner AND t.version = v.version - 1;
                            ELSE
                                INSERT INTO threads SELECT * FROM jsonb_populate_record(NULL::threads, r)
                                ON CONFLICT (id) DO NOTHING;
                            END IF;
                            GET DIAGNOSTICS changed = ROW_COUNT;
                            IF changed = 0 THEN
                                -- Only the commit's first write can get here (see above).
                                outcome := 'conflict ' || (r->>'id') || ' ' || greatest((r->>'version')::bigint - 1, 0);
                                EXIT;
                            END IF;
                        WHEN 'history' THEN
                            INSERT INTO context_items (thread_id, seq, record)
                            SELECT op->>'id', (op->>'first')::integer + i.ordinal - 1, decode(i.item, 'base64')
                            FROM jsonb_array_elements_text(op->'items') WITH ORDINALITY AS i(item, ordinal);
                        WHEN 'turn' THEN
                            INSERT INTO turns (thread_id, turn_id, seq, record, status)
                            VALUES (op->>'id', op->>'turn', (op->>'seq')::integer, decode(op->>'record', 'base64'), op->>'status')
                            ON CONFLICT (thread_id, turn_id) DO UPDATE
                                SET seq = EXCLUDED.seq, record = EXCLUDED.record, status = EXCLUDED.status;
                        WHEN 'mail+' THEN
                            INSERT INTO mailbox (recipient_id, record) VALUES (op->>'id', decode(op->>'record', 'base64'));
                        WHEN 'mail-' THEN
                            DELETE FROM mailbox WHERE recipient_id = op->>'id' AND seq <= (op->>'through')::bigint;
                        END CASE;
                    END LOOP;
                END IF;
                outcomes := outcomes || outcome;
            END LOOP;
            RETURN outcomes;
        END
        $fn$
        """

    /// Migration 4: the same function, writing `tool_settings` too.
    static let definitionV4 = definition.replacingOccurrences(
        of: "agent_closed = v.agent_closed\n", with: "agent_closed = v.agent_closed, tool_settings = v.tool_settings\n")

    /// Migration 6: idempotency keys. A commit with a claim ("key") has its
    /// thread rows checked and locked first (as a commit of several does),
    /// then inserts its key before any other write: a key stored already
    /// (by a repeat that won the race) refuses the commit, "key_taken",
    /// with nothing written; a concurrent insert of the same key waits for
    /// the other transaction and then finds it. "reply" adds a request's
    /// answer to its key (or stores both), keeping an answer already there.
    static let definitionV6 = definitionV4
        .replacingOccurrences(
            of: "WHERE o->>'k' = 'thread') > 1 THEN",
            with: "WHERE o->>'k' = 'thread') > 1 OR c->'ops' @> '[{\"k\": \"key\"}]'::jsonb THEN")
        .replacingOccurrences(
            of: """
                        END LOOP;
                    END IF;
                    IF outcome = 'ok' THEN
            """,
            with: """
                        END LOOP;
                    END IF;
                    IF outcome = 'ok' THEN
                        FOR op IN SELECT value FROM jsonb_array_elements(c->'ops') o WHERE o->>'k' = 'key' LOOP
                            INSERT INTO idempotency_keys (principal, key, method, fingerprint, thread_id, turn_ids, response, created_at)
                            VALUES (op->>'p', op->>'key', op->>'m', decode(op->>'fp', 'base64'), op->>'id', op->>'turns', NULL,
                                    (op->>'at')::bigint)
                            ON CONFLICT (principal, key) DO NOTHING;
                            GET DIAGNOSTICS changed = ROW_COUNT;
                            IF changed = 0 THEN
                                outcome := 'key_taken';
                                EXIT;
                            END IF;
                        END LOOP;
                    END IF;
                    IF outcome = 'ok' THEN
            """)
        .replacingOccurrences(
            of: """
                            WHEN 'mail-' THEN
            """,
            with: """
                            WHEN 'key' THEN
                                NULL;
                            WHEN 'reply' THEN
                                INSERT INTO idempotency_keys (principal, key, method, fingerprint, thread_id, turn_ids, response, created_at)
                                VALUES (op->>'p', op->>'key', op->>'m', decode(op->>'fp', 'base64'), op->>'id', op->>'turns',
                                        decode(op->>'record', 'base64'), (op->>'at')::bigint)
                                ON CONFLICT (principal, key) DO UPDATE SET response = EXCLUDED.response
                                WHERE idempotency_keys.response IS NULL;
                            WHEN 'mail-' THEN
            """)

    /// Migration 7: the same, writing `agent_role`, import records, and
    /// relinking threads imported before their ancestor into its tree.
    static let definitionV7 = definitionV6
        .replacingOccurrences(
            of: "tool_settings = v.tool_settings\n", with: "tool_settings = v.tool_settings, agent_role = v.agent_role\n")
        .replacingOccurrences(
            of: """
                            WHEN 'mail-' THEN
            """,
            with: """
                            WHEN 'import' THEN
                                INSERT INTO thread_imports (thread_id, owner, digest, lines, imported_at)
                                VALUES (op->>'id', op->>'p', decode(op->>'fp', 'base64'), (op->>'lines')::bigint, (op->>'at')::bigint)
                                ON CONFLICT (thread_id) DO UPDATE SET owner = EXCLUDED.owner, digest = EXCLUDED.digest,
                                    lines = EXCLUDED.lines, imported_at = EXCLUDED.imported_at;
                            WHEN 'relink' THEN
                                UPDATE threads SET session_id = op->>'to', version = version + 1
                                WHERE session_id = op->>'id' AND id <> op->>'id';
                            WHEN 'mail-' THEN
            """)

    /// Migration 8: a claim stores the answer its change tells, in the
    /// change's own transaction.
    static let definitionV8 = definitionV7.replacingOccurrences(
        of: "op->>'turns', NULL,", with: "op->>'turns', decode(op->>'record', 'base64'),")
}
