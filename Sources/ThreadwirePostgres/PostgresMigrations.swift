import Logging
import PostgresNIO
import ThreadwireCore

/// The schema: versioned migrations, applied once each.
extension PostgresThreadStore {
    /// Versioned migrations, each applied once, under an advisory lock so
    /// instances starting together do not race.
    static let migrations: [(version: Int, statements: [String])] = [
        (1, [
            """
            CREATE TABLE threads (
                id TEXT PRIMARY KEY, session_id TEXT NOT NULL, parent_id TEXT, forked_from_id TEXT,
                source TEXT NOT NULL, depth INTEGER NOT NULL, task_name TEXT, nickname TEXT, preview TEXT NOT NULL,
                name TEXT, created_at BIGINT NOT NULL, updated_at BIGINT NOT NULL, archived BOOLEAN NOT NULL,
                runtime TEXT, legacy BOOLEAN NOT NULL, selected_mode TEXT, model TEXT NOT NULL, cwd TEXT NOT NULL,
                base_instructions TEXT, config_overrides TEXT NOT NULL, version BIGINT NOT NULL,
                agent_status TEXT, agent_final_message TEXT, agent_closed BOOLEAN NOT NULL, owner TEXT NOT NULL)
            """,
            "CREATE INDEX threads_created ON threads (archived, created_at, id)",
            "CREATE INDEX threads_updated ON threads (archived, updated_at, id)",
            "CREATE INDEX threads_owner_created ON threads (owner, archived, created_at, id)",
            "CREATE INDEX threads_owner_updated ON threads (owner, archived, updated_at, id)",
            "CREATE INDEX threads_parent ON threads (parent_id)",
            "CREATE INDEX threads_session ON threads (session_id) WHERE parent_id IS NOT NULL",
            // Model-visible history, append-only; each row a threadwire.v1.ContextItem.
            "CREATE TABLE context_items (thread_id TEXT NOT NULL, seq INTEGER NOT NULL, record BYTEA NOT NULL, PRIMARY KEY (thread_id, seq))",
            // Each row a threadwire.v1.Turn; status finds turns a dead process left running.
            """
            CREATE TABLE turns (thread_id TEXT NOT NULL, turn_id TEXT NOT NULL, seq INTEGER NOT NULL,
                record BYTEA NOT NULL, status TEXT, PRIMARY KEY (thread_id, turn_id))
            """,
            "CREATE INDEX turns_sequence ON turns (thread_id, seq)",
            "CREATE INDEX turns_running ON turns (thread_id) WHERE status = 'inProgress'",
            "CREATE TABLE mailbox (seq BIGSERIAL PRIMARY KEY, recipient_id TEXT NOT NULL, record BYTEA NOT NULL)",
            "CREATE INDEX mailbox_recipient ON mailbox (recipient_id, seq)",
            "CREATE TABLE health_probe (id INTEGER PRIMARY KEY CHECK (id = 1), at BIGINT NOT NULL)",
        ]),
        (2, [
            // One row per agent tree (its root's session id) ever owned: the
            // epoch only grows, so a fence of a former owner never matches again.
            """
            CREATE TABLE thread_leases (tree TEXT PRIMARY KEY, instance_id TEXT NOT NULL, address TEXT NOT NULL,
                epoch BIGINT NOT NULL, expires_at TIMESTAMPTZ NOT NULL)
            """,
            "CREATE INDEX thread_leases_instance ON thread_leases (instance_id)",
            "CREATE INDEX threads_session_all ON threads (session_id)",
        ]),
        // The commit function. A later change to it is a new migration with
        // the new definition (CREATE OR REPLACE), never an edit of this one.
        (3, [CommitFunction.definition]),
        // The thread's client tools (JSON, see ThreadRow.ToolSettings); the
        // commit function writes the new column.
        (4, ["ALTER TABLE threads ADD COLUMN tool_settings TEXT NOT NULL DEFAULT '{}'", CommitFunction.definitionV4]),
        // thread/list search_term: a trigram index over names and previews
        // (pg_trgm is a trusted extension: the database's owner may create it).
        (5, [
            "CREATE EXTENSION IF NOT EXISTS pg_trgm",
            "CREATE INDEX threads_search ON threads USING gin ((coalesce(name, '') || E'\\n' || preview) gin_trgm_ops)",
        ]),
        // Keyed changes and their answers (Request.idempotency_key): the
        // commit function writes a claim with its change, and the answer after.
        (6, [
            """
            CREATE TABLE idempotency_keys (principal TEXT NOT NULL, key TEXT NOT NULL, method TEXT NOT NULL,
                fingerprint BYTEA NOT NULL, thread_id TEXT, turn_ids TEXT NOT NULL, response BYTEA,
                created_at BIGINT NOT NULL, PRIMARY KEY (principal, key))
            """,
            "CREATE INDEX idempotency_keys_created ON idempotency_keys (created_at)",
            CommitFunction.definitionV6,
        ]),
        // thread/import: a child's role, which content each imported thread
        // came from, and the commit function writing both (and relinking).
        (7, [
            "ALTER TABLE threads ADD COLUMN agent_role TEXT",
            """
            CREATE TABLE thread_imports (thread_id TEXT PRIMARY KEY, owner TEXT NOT NULL, digest BYTEA NOT NULL,
                lines BIGINT NOT NULL, imported_at BIGINT NOT NULL)
            """,
            CommitFunction.definitionV7,
        ]),
        // A keyed change's answer stored in its own transaction.
        (8, [CommitFunction.definitionV8]),
        // Per-principal budgets that every instance shares (PostgresQuotaLedger).
        (9, PostgresQuotaLedger.schema),
        // Each thread's kept events (Notification.thread_sequence) and the
        // number of its newest; the commit function writes and trims them.
        (10, [
            "ALTER TABLE threads ADD COLUMN event_sequence BIGINT NOT NULL DEFAULT 0",
            """
            CREATE TABLE thread_events (thread_id TEXT NOT NULL, seq BIGINT NOT NULL, created_at BIGINT NOT NULL,
                record BYTEA NOT NULL, PRIMARY KEY (thread_id, seq))
            """,
            CommitFunction.definitionV10,
        ]),
        // A call's records as bytea[] beside its JSON, not base64 inside it.
        (11, [CommitFunction.definitionV11]),
        // A call's kept events in one INSERT after its commits.
        (12, [CommitFunction.definitionV12]),
        // The search text apart from the thread row, kept by triggers when a
        // name or preview changes. Indexed in the row, every update of a
        // thread (each settings change, each commit of a turn) inserted all
        // the trigrams of its name and preview into the GIN index again,
        // since `updated_at` is indexed too and no update can be HOT: about
        // 40 % of a row update's time in PostgreSQL with a 200-character
        // preview. Instances not yet upgraded still find the same threads
        // (their search reads the row's columns, without an index).
        (13, [
            """
            CREATE TABLE thread_search (thread_id TEXT PRIMARY KEY REFERENCES threads (id) ON DELETE CASCADE,
                doc TEXT NOT NULL)
            """,
            "INSERT INTO thread_search (thread_id, doc) SELECT id, coalesce(name, '') || E'\\n' || preview FROM threads",
            "CREATE INDEX thread_search_doc ON thread_search USING gin (doc gin_trgm_ops)",
            """
            CREATE OR REPLACE FUNCTION threadwire_search_keep() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                INSERT INTO thread_search (thread_id, doc) VALUES (NEW.id, coalesce(NEW.name, '') || E'\\n' || NEW.preview)
                ON CONFLICT (thread_id) DO UPDATE SET doc = excluded.doc;
                RETURN NULL;
            END $$
            """,
            "CREATE TRIGGER thread_search_insert AFTER INSERT ON threads FOR EACH ROW EXECUTE FUNCTION threadwire_search_keep()",
            """
            CREATE TRIGGER thread_search_update AFTER UPDATE OF name, preview ON threads FOR EACH ROW
            WHEN (OLD.name IS DISTINCT FROM NEW.name OR OLD.preview IS DISTINCT FROM NEW.preview)
            EXECUTE FUNCTION threadwire_search_keep()
            """,
            "DROP INDEX threads_search",
        ]),
    ]

    /// The advisory lock key of migrations ("twmigr" in ASCII).
    static let migrationLock: Int64 = 0x74_77_6D_69_67_72

    func migrate() async throws {
        try await client.withTransaction(logger: logger) { connection in
            try await connection.query("SELECT pg_advisory_xact_lock(\(Self.migrationLock))", logger: logger)
            try await connection.query("CREATE TABLE IF NOT EXISTS threadwire_schema (version INTEGER PRIMARY KEY)", logger: logger)
            var applied: Set<Int> = []
            for try await version in try await connection.query("SELECT version FROM threadwire_schema", logger: logger).decode(Int.self) {
                applied.insert(version)
            }
            for migration in Self.migrations where !applied.contains(migration.version) {
                for statement in migration.statements {
                    try await connection.query(PostgresQuery(unsafeSQL: statement), logger: logger)
                }
                try await connection.query("INSERT INTO threadwire_schema (version) VALUES (\(migration.version))", logger: logger)
                logger.info("applied PostgreSQL migration", metadata: ["tw.migration": "\(migration.version)"])
            }
        }
    }
}
