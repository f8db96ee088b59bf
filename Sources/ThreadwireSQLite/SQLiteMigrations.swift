import GRDB

/// The schema: GRDB migrations, applied once each, in order.
extension SQLiteThreadStore {
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
        migrator.registerMigration("v2: versions, agent registry, mailbox, running turns") { db in
            try db.execute(sql: """
                -- Compare-and-set version of each thread row (see StoreOperation.putThread).
                ALTER TABLE threads ADD COLUMN version INTEGER NOT NULL DEFAULT 1;
                -- The agent registry entry of a spawned child.
                ALTER TABLE threads ADD COLUMN agent_status TEXT;
                ALTER TABLE threads ADD COLUMN agent_final_message TEXT;
                ALTER TABLE threads ADD COLUMN agent_closed INTEGER NOT NULL DEFAULT 0;
                CREATE INDEX threads_session ON threads(session_id) WHERE parent_id IS NOT NULL;
                -- A turn's status, so startup finds turns a dead process left running.
                ALTER TABLE turns ADD COLUMN status TEXT;
                CREATE INDEX turns_running ON turns(thread_id) WHERE status = 'inProgress';
                -- Items queued for a thread by its children; each row a threadwire.v1.ContextItem.
                CREATE TABLE mailbox (
                    seq INTEGER PRIMARY KEY AUTOINCREMENT,
                    recipient_id TEXT NOT NULL,
                    record BLOB NOT NULL
                );
                CREATE INDEX mailbox_recipient ON mailbox(recipient_id, seq);
                """)
        }
        migrator.registerMigration("v3: turn pages, health probe") { db in
            try db.execute(sql: """
                -- thread/turns/list pages by sequence.
                CREATE INDEX turns_sequence ON turns(thread_id, seq);
                -- One row rewritten by the health probe to prove commits work.
                CREATE TABLE health_probe (id INTEGER PRIMARY KEY CHECK (id = 1), at INTEGER NOT NULL);
                """)
        }
        migrator.registerMigration("v4: owning principal") { db in
            try db.execute(sql: """
                -- The principal a thread belongs to (set at creation, never changed).
                -- Threads from before authentication belong to 'default'.
                ALTER TABLE threads ADD COLUMN owner TEXT NOT NULL DEFAULT 'default';
                -- thread/list of one principal pages by these.
                CREATE INDEX threads_owner_created ON threads(owner, archived, created_at, id);
                CREATE INDEX threads_owner_updated ON threads(owner, archived, updated_at, id);
                """)
        }
        migrator.registerMigration("v5: tool settings") { db in
            try db.execute(sql: """
                -- JSON: the thread's client tools (see ThreadRow.ToolSettings).
                ALTER TABLE threads ADD COLUMN tool_settings TEXT NOT NULL DEFAULT '{}';
                """)
        }
        migrator.registerMigration("v6: thread search") { db in
            try db.execute(sql: """
                -- thread/list search_term: a trigram full-text index over names
                -- and previews (substring matches, ignoring case), kept by triggers.
                CREATE VIRTUAL TABLE thread_search USING fts5(name, preview, tokenize = 'trigram case_sensitive 0');
                INSERT INTO thread_search (rowid, name, preview) SELECT rowid, coalesce(name, ''), preview FROM threads;
                CREATE TRIGGER thread_search_insert AFTER INSERT ON threads BEGIN
                    INSERT INTO thread_search (rowid, name, preview) VALUES (new.rowid, coalesce(new.name, ''), new.preview);
                END;
                CREATE TRIGGER thread_search_update AFTER UPDATE OF name, preview ON threads
                WHEN old.name IS NOT new.name OR old.preview IS NOT new.preview BEGIN
                    DELETE FROM thread_search WHERE rowid = old.rowid;
                    INSERT INTO thread_search (rowid, name, preview) VALUES (new.rowid, coalesce(new.name, ''), new.preview);
                END;
                CREATE TRIGGER thread_search_delete AFTER DELETE ON threads BEGIN
                    DELETE FROM thread_search WHERE rowid = old.rowid;
                END;
                """)
        }
        migrator.registerMigration("v7: idempotency keys") { db in
            try db.execute(sql: """
                -- Keyed changes and their answers (Request.idempotency_key); the
                -- claim is written in the change's transaction, the answer after.
                CREATE TABLE idempotency_keys (
                    principal TEXT NOT NULL,
                    key TEXT NOT NULL,
                    method TEXT NOT NULL,
                    fingerprint BLOB NOT NULL,
                    thread_id TEXT,
                    turn_ids TEXT NOT NULL,
                    response BLOB,
                    created_at INTEGER NOT NULL,
                    PRIMARY KEY (principal, key)
                ) WITHOUT ROWID;
                CREATE INDEX idempotency_keys_created ON idempotency_keys(created_at);
                """)
        }
        migrator.registerMigration("v8: imports") { db in
            try db.execute(sql: """
                -- A child's role as an imported rollout recorded it.
                ALTER TABLE threads ADD COLUMN agent_role TEXT;
                -- Which content each imported thread came from (thread/import is idempotent).
                CREATE TABLE thread_imports (
                    thread_id TEXT PRIMARY KEY NOT NULL,
                    owner TEXT NOT NULL,
                    digest BLOB NOT NULL,
                    lines INTEGER NOT NULL,
                    imported_at INTEGER NOT NULL
                ) WITHOUT ROWID;
                """)
        }
        migrator.registerMigration("v9: thread events") { db in
            try db.execute(sql: """
                -- The number of each thread's newest kept event (Notification.thread_sequence).
                ALTER TABLE threads ADD COLUMN event_sequence INTEGER NOT NULL DEFAULT 0;
                -- Each thread's kept events, numbered in the change's transaction;
                -- each row the notification without its per-connection fields.
                CREATE TABLE thread_events (
                    thread_id TEXT NOT NULL,
                    seq INTEGER NOT NULL,
                    created_at INTEGER NOT NULL,
                    record BLOB NOT NULL,
                    PRIMARY KEY (thread_id, seq)
                ) WITHOUT ROWID;
                """)
        }
        migrator.registerMigration("v10: thread events appended") { db in
            // Clustered by thread (v9), a group commit's events landed in a
            // leaf page per thread, and rows of a few hundred bytes split
            // those pages every few inserts. Appended in commit order, one
            // commit's events share the table's last pages, and the index
            // that finds a thread's events holds small entries that rarely
            // split: half the WAL frames in Benchmarks/events_layout_sqlite.py.
            try rebuild(db, "thread_events", as: """
                thread_id TEXT NOT NULL,
                seq INTEGER NOT NULL,
                created_at INTEGER NOT NULL,
                record BLOB NOT NULL
                """, columns: "thread_id, seq, created_at, record", order: "created_at, thread_id, seq")
            // Unique: a number stored again refuses the whole commit.
            try db.execute(sql: "CREATE UNIQUE INDEX thread_events_by_thread ON thread_events (thread_id, seq)")
        }
        migrator.registerMigration("v11: turns in their thread's order") { db in
            // Keyed by (thread, turn id), turns needed a second index
            // (turns_sequence) to be read in order, and every commit of a
            // turn wrote one of its pages per thread: 14-22 % of the WAL
            // frames of 16 connections running turns. Keyed by (thread,
            // number), a thread's turns are in order without it. A thread's
            // numbers are unique: each is its turn count when the turn
            // starts, under the thread row's compare-and-set.
            try rebuild(db, "turns", as: """
                thread_id TEXT NOT NULL,
                seq INTEGER NOT NULL,
                turn_id TEXT NOT NULL,
                record BLOB NOT NULL,
                status TEXT,
                PRIMARY KEY (thread_id, seq)
                """, withoutRowID: true, columns: "thread_id, seq, turn_id, record, status", order: "thread_id, seq")
            try db.execute(sql: "CREATE INDEX turns_running ON turns(thread_id) WHERE status = 'inProgress'")
        }
        migrator.registerMigration("v12: new events apart") { db in
            // thread_events' index on (thread, number) took a page write per
            // thread in every group commit: 55 % of the WAL frames of 16
            // connections updating settings, 2.7 times the frames without
            // events. New events are appended here (no index: a group
            // commit's events share a page or two) and moved to
            // thread_events in bulk, every `CommitQueue.recentEventsToMove`
            // rows and before each retention pass, one index page per thread
            // for many events. Every row here is newer than its thread's
            // rows there. Numbers stay unique: each is its thread's next
            // under the thread row's compare-and-set, and the move meets
            // thread_events' unique index.
            try db.execute(sql: """
                CREATE TABLE thread_events_recent (
                    thread_id TEXT NOT NULL,
                    seq INTEGER NOT NULL,
                    created_at INTEGER NOT NULL,
                    record BLOB NOT NULL
                )
                """)
        }
        return migrator
    }

    /// SQLite cannot change a table's key or layout in place: a new table
    /// takes the rows in `order`, then the old one's name (its indexes go
    /// with the old table; the caller makes the new ones).
    private static func rebuild(_ db: Database, _ table: String, as columnDefinitions: String, withoutRowID: Bool = false,
                                columns: String, order: String) throws {
        try db.execute(sql: """
            CREATE TABLE \(table)_rebuilt (\(columnDefinitions))\(withoutRowID ? " WITHOUT ROWID" : "");
            INSERT INTO \(table)_rebuilt (\(columns)) SELECT \(columns) FROM \(table) ORDER BY \(order);
            DROP TABLE \(table);
            ALTER TABLE \(table)_rebuilt RENAME TO \(table);
            """)
    }
}
