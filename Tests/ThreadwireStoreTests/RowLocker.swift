import Foundation
import Logging
import PostgresNIO
import ThreadwireCore

/// Another client holding a thread's row locked (FOR UPDATE in an open
/// transaction) until `release`: updates of that row wait in PostgreSQL
/// meanwhile, as behind a slow writer.
struct RowLocker {
    let connection: PostgresConnection

    static func lock(_ thread: ThreadID, url: String) async throws -> RowLocker {
        let connection = try await PostgresConnection.connect(url: url, label: "locker")
        try await connection.query("BEGIN", logger: connection.logger)
        try await connection.query("SELECT 1 FROM threads WHERE id = \(thread) FOR UPDATE", logger: connection.logger)
        return RowLocker(connection: connection)
    }

    /// Rolls back (the row is free) and closes.
    func release() async throws {
        try await connection.query("ROLLBACK", logger: connection.logger)
        try await connection.close()
    }
}

extension PostgresConnection {
    /// A connection of its own to the database at `url`, beside the store's pool.
    static func connect(url: String, label: String) async throws -> PostgresConnection {
        guard let components = URLComponents(string: url) else { throw StoreError.misconfigured("not a URL: \(url)") }
        return try await PostgresConnection.connect(
            configuration: .init(host: components.host ?? "127.0.0.1", port: components.port ?? 5432, username: components.user ?? "",
                                 password: components.password, database: String(components.path.dropFirst()), tls: .disable),
            id: 1, logger: Logger(label: label))
    }
}
