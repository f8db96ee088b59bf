import Foundation
import Logging
import PostgresNIO
import Synchronization
import ThreadwireCore
import ThreadwireStorage

/// The PL/pgSQL function every commit goes through, and its input.
enum CommitFunction {
    /// One commit as JSON: its fence and its operations. The records its
    /// operations store (history items, turns, mail, answers, events) travel
    /// beside the JSON, in the call's `bytea[]` parameter: inside the JSON
    /// they were base64 that PostgreSQL lexed again at every `->` and then
    /// decoded, which took a fifth of its CPU in a group of settings changes.
    struct Commit: Encodable, Sendable {
        var tree: String?
        var epoch: Int64?
        /// Where this commit's records start among the call's (0-based; set
        /// by `CommitFunction.based`), so an operation's `ri` is its own.
        var recordBase = 0
        var ops: [Operation]
        /// The records of `ops`, in the order their `ri` count (not in the JSON).
        var records: [ByteBuffer] = []
        /// The key its claim stores (not sent: named when it is refused).
        var claimedKey: IdempotencyKey?
        /// The thread whose row is this commit's only change, on top of an
        /// earlier version (not sent: such commits can go as one UPDATE).
        var updatedThread: String?

        init(_ operations: [StoreOperation], fence: LeaseFence?) throws {
            tree = fence?.tree
            epoch = fence?.epoch
            var records: [ByteBuffer] = []
            ops = try operations.map { try Operation($0, records: &records) }
            self.records = records
            for case let .claimIdempotencyKey(claim, _) in operations { claimedKey = claim.key }
            updatedThread = Self.updatedThread(operations)
        }

        /// The thread whose row replacement (on top of an earlier version),
        /// with its events, is all `operations` do.
        static func updatedThread(_ operations: [StoreOperation]) -> String? {
            guard case let .putThread(record) = operations.first, record.version > 1 else { return nil }
            switch operations.count {
            case 1: return record.id
            case 2:
                guard case let .appendEvents(thread, _) = operations[1], thread == record.id else { return nil }
                return record.id
            default: return nil
            }
        }

        enum CodingKeys: String, CodingKey { case tree, epoch, recordBase = "rb", ops }
    }

    /// `commits` as one call sends them: each commit's `recordBase` set,
    /// and all their records in order, for the call's second parameter.
    static func based(_ commits: [Commit]) -> (commits: [Commit], records: [ByteBuffer]) {
        var based = commits
        var records: [ByteBuffer] = []
        for index in based.indices {
            based[index].recordBase = records.count
            records += based[index].records
        }
        return (based, records)
    }

    /// `k` names the kind; the other keys are the kind's. `ri` is the
    /// 0-based index of the operation's first record among its commit's
    /// `records`, and `n` how many it has when it may have several.
    struct Operation: Encodable, Sendable {
        var k: String
        var r: ThreadRow?
        var id: String?
        var first: Int?
        var ri: Int?
        var n: Int?
        var seq: Int?
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

        /// Appends the operation's records to `records`.
        init(_ operation: StoreOperation, records: inout [ByteBuffer]) throws {
            func keep(_ bytes: [UInt8]) {
                if ri == nil { ri = records.count }
                records.append(ByteBuffer(bytes: bytes))
            }
            k = ""
            switch operation {
            case let .putThread(record):
                k = "thread"
                r = try ThreadRow(record)
            case let .appendHistory(thread, first, items):
                k = "history"
                id = thread
                self.first = first
                ri = records.count
                n = items.count
                for item in items { keep(StoredRecords.encode(item)) }
            case let .putTurn(turn):
                k = "turn"
                id = turn.threadID
                turnID = turn.id
                seq = turn.sequence
                keep(StoredRecords.encode(turn))
                status = turn.status.rawValue
            case let .enqueueMailbox(recipient, item):
                k = "mail+"
                id = recipient
                keep(StoredRecords.encode(item))
            case let .removeMailbox(recipient, through):
                k = "mail-"
                id = recipient
                self.through = through
            case let .claimIdempotencyKey(claim, response):
                k = "key"
                setKey(claim)
                if let response { keep(response) }
            case let .recordIdempotentResponse(claim, response):
                k = "reply"
                setKey(claim)
                keep(response)
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
            case let .appendEvents(thread, events):
                // Numbered consecutively from `first`, committed at one time.
                k = "events"
                id = thread
                first = Int(events.first?.sequence ?? 0)
                at = events.first?.createdAt
                ri = records.count
                n = events.count
                for event in events { keep(event.bytes) }
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
            case k, r, id, first, ri, n, seq, status, through, turnID = "turn", p, key, m, fp, turns, at, lines, to
        }
    }

    struct Call: PostgresPreparedStatement {
        typealias Row = [String]
        static let name = "threadwire_commit_call"
        static let sql = "SELECT threadwire_commit($1::jsonb, $2::bytea[])"
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

    /// Migration 10: each thread's kept events (numbered consecutively from
    /// `first` in the change's transaction; a number stored already fails the
    /// commit on the primary key) and the row's newest number.
    static let definitionV10 = definitionV8
        .replacingOccurrences(
            of: "agent_role = v.agent_role\n", with: "agent_role = v.agent_role, event_sequence = v.event_sequence\n")
        .replacingOccurrences(
            of: """
                            WHEN 'mail-' THEN
            """,
            with: """
                            WHEN 'events' THEN
                                INSERT INTO thread_events (thread_id, seq, created_at, record)
                                SELECT op->>'id', (op->>'first')::bigint + i.ordinal - 1, (op->>'at')::bigint, decode(i.item, 'base64')
                                FROM jsonb_array_elements_text(op->'items') WITH ORDINALITY AS i(item, ordinal);
                            WHEN 'mail-' THEN
            """)

    /// Migration 11: the records of a call (`Commit.records`) come as a
    /// second parameter, `bytea[]`, instead of base64 inside the JSON; an
    /// operation names its first by `ri` within its commit's, from the
    /// commit's `rb`. Its statements use generic plans: a custom plan (which
    /// PL/pgSQL makes while it finds one cheaper) copies every parameter into
    /// the plan as a constant, all of `records` for each statement, which
    /// cost a turn's commit 13 % more of PostgreSQL's CPU than base64 did.
    /// The one-parameter function stays for instances not yet upgraded.
    static let definitionV11: String = {
        let replacements = [
            ("CREATE OR REPLACE FUNCTION threadwire_commit(batch jsonb) RETURNS text[] LANGUAGE plpgsql AS",
             "CREATE OR REPLACE FUNCTION threadwire_commit(batch jsonb, records bytea[]) RETURNS text[] LANGUAGE plpgsql\n"
                + "    SET plan_cache_mode = force_generic_plan AS"),
            ("decode(op->>'record', 'base64')", "records[(c->>'rb')::integer + (op->>'ri')::integer + 1]"),
            ("decode(i.item, 'base64')", "records[(c->>'rb')::integer + (op->>'ri')::integer + i.ordinal]"),
            ("jsonb_array_elements_text(op->'items') WITH ORDINALITY AS i(item, ordinal)",
             "generate_series(1, (op->>'n')::integer) AS i(ordinal)"),
        ]
        var definition = definitionV10
        for (old, new) in replacements {
            precondition(definition.contains(old), "threadwire_commit v10 no longer contains \(old)")
            definition = definition.replacingOccurrences(of: old, with: new)
        }
        return definition
    }()

    /// Migration 12: a call's kept events go in one INSERT after its last
    /// commit, not one per commit. Each statement a PL/pgSQL function runs
    /// starts an executor (15 % of PostgreSQL's CPU in a group of turns'
    /// commits), and most commits keep an event or two; the numbers and
    /// record indexes are gathered in arrays by simple expressions, which
    /// need none. Only a commit that went through gathers its events (a
    /// refused one has written nothing when it is refused), and a number
    /// stored already still fails the whole call on the primary key.
    static let definitionV12: String = {
        let replacements = [
            ("found_version bigint; changed bigint;",
             "found_version bigint; changed bigint;\n"
                + "    kept_threads text[] := '{}'; kept_seqs bigint[] := '{}'; kept_ats bigint[] := '{}'; kept_records integer[] := '{}';\n"
                + "    kept_first bigint; kept_base integer; kept_index integer;"),
            ("""
                                INSERT INTO thread_events (thread_id, seq, created_at, record)
                                SELECT op->>'id', (op->>'first')::bigint + i.ordinal - 1, (op->>'at')::bigint, \
            records[(c->>'rb')::integer + (op->>'ri')::integer + i.ordinal]
                                FROM generate_series(1, (op->>'n')::integer) AS i(ordinal);
            """,
             """
                                kept_first := (op->>'first')::bigint;
                                kept_base := (c->>'rb')::integer + (op->>'ri')::integer;
                                FOR kept_index IN 1..(op->>'n')::integer LOOP
                                    kept_threads := kept_threads || (op->>'id');
                                    kept_seqs := kept_seqs || (kept_first + kept_index - 1);
                                    kept_ats := kept_ats || (op->>'at')::bigint;
                                    kept_records := kept_records || (kept_base + kept_index);
                                END LOOP;
            """),
            ("\n    RETURN outcomes;",
             """

                IF cardinality(kept_seqs) > 0 THEN
                    INSERT INTO thread_events (thread_id, seq, created_at, record)
                    SELECT k.thread_id, k.seq, k.created_at, records[k.record]
                    FROM unnest(kept_threads, kept_seqs, kept_ats, kept_records) AS k(thread_id, seq, created_at, record);
                END IF;
                RETURN outcomes;
            """),
        ]
        var definition = definitionV11
        for (old, new) in replacements {
            precondition(definition.contains(old), "threadwire_commit v11 no longer contains \(old)")
            definition = definition.replacingOccurrences(of: old, with: new)
        }
        return definition
    }()
}
