import Foundation
import Logging
import PostgresNIO
import Testing
import ThreadwireCore
import ThreadwirePostgres
import ThreadwireTesting

/// Migrations that move data: a database as the previous version left it,
/// with rows in it, upgraded by a store that connects.
@Suite("PostgreSQL migrations of a database in use (real PostgreSQL)", .timeLimit(.minutes(3)))
struct PostgresMigrationTests {
    @Test("migration 13 moves the search text out of the thread row: threads stored before it are found after it; after it a rename is found by its new name only, a settings change leaves the text, a deleted thread takes its text with it")
    func searchTextLeavesTheRow() async throws {
        let url = try await PostgresCluster.database()
        var records: [ThreadRecord] = []
        let first = try await PostgresThreadStore.connect(url: url, logger: Logger(label: "migration"))
        for (id, name, preview) in [("m1", "Auth work", "fix the login flow"), ("m2", nil, "release notes for 1.4")] as [(String, String?, String)] {
            var record = ThreadRecord(id: id, sessionID: id, source: .appServer, depth: 0, createdAt: 1000, model: "m", cwd: "/w")
            record.name = name
            record.preview = preview
            try await first.commit([.putThread(record)])
            records.append(record)
        }
        first.close()
        // Back to the schema of migration 12: the text in the row, under its own index.
        let connection = try await PostgresConnection.connect(url: url, label: "migration")
        for statement in [
            "DROP TRIGGER thread_search_insert ON threads", "DROP TRIGGER thread_search_update ON threads",
            "DROP TABLE thread_search", "DROP FUNCTION threadwire_search_keep()",
            "CREATE INDEX threads_search ON threads USING gin ((coalesce(name, '') || E'\\n' || preview) gin_trgm_ops)",
            "DELETE FROM threadwire_schema WHERE version = 13",
        ] {
            try await connection.query(PostgresQuery(unsafeSQL: statement), logger: connection.logger)
        }

        let store = try await PostgresThreadStore.connect(url: url, logger: Logger(label: "migration"))
        defer { store.close() }
        func search(_ term: String) async throws -> [ThreadID] {
            var query = ThreadListQuery()
            query.searchTerm = term
            return try await store.listThreads(query).records.map(\.id).sorted()
        }
        #expect(try await search("auth") == ["m1"])
        #expect(try await search("LOGIN") == ["m1"])
        #expect(try await search("release not") == ["m2"])
        #expect(try await search("1.4") == ["m2"])
        var indexes: [String] = []
        for try await name in try await connection.query("SELECT indexname FROM pg_indexes WHERE tablename = 'threads'",
                                                          logger: connection.logger).decode(String.self) {
            indexes.append(name)
        }
        #expect(!indexes.contains("threads_search"), "the row's own trigram index is dropped: \(indexes)")

        var renamed = records[0]
        renamed.name = "Billing work"
        renamed.version += 1
        try await store.commit([.putThread(renamed)])
        #expect(try await search("auth").isEmpty)
        #expect(try await search("billing") == ["m1"])
        #expect(try await search("login") == ["m1"], "the preview still found")
        var changed = records[1]
        changed.model = "other"
        changed.version += 1
        try await store.commit([.putThread(changed)])
        #expect(try await search("release not") == ["m2"])
        var fresh = ThreadRecord(id: "m3", sessionID: "m3", source: .appServer, depth: 0, createdAt: 2000, model: "m", cwd: "/w")
        fresh.preview = "a release after the migration"
        try await store.commit([.putThread(fresh)])
        #expect(try await search("release") == ["m2", "m3"])
        _ = try await store.deleteTree("m3", fence: nil)
        #expect(try await search("release") == ["m2"])
        var left: [String] = []
        for try await id in try await connection.query("SELECT thread_id FROM thread_search ORDER BY thread_id",
                                                        logger: connection.logger).decode(String.self) {
            left.append(id)
        }
        #expect(left == ["m1", "m2"])
        try await connection.close()
    }
}
