import Foundation
public import Logging
import NIOCore
import NIOPosix
import PostgresNIO
public import ThreadwireCore
import ThreadwireStorage

/// `postgres://user[:password]@host[:port]/database`.
struct PostgresURL {
    var user: String
    var password: String?
    var host: String
    var port: Int
    var database: String

    init(_ text: String) throws {
        guard let components = URLComponents(string: text), ["postgres", "postgresql"].contains(components.scheme ?? ""),
              let host = components.host, !host.isEmpty, let user = components.user, !user.isEmpty else {
            throw StoreError.misconfigured("--store must be postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE, got '\(Self.redact(text))'")
        }
        let database = String(components.path.drop { $0 == "/" })
        guard !database.isEmpty else { throw StoreError.misconfigured("--store \(Self.redact(text)) names no database (…/DATABASE)") }
        self.user = user
        password = components.password
        self.host = host
        port = components.port ?? 5432
        self.database = database
    }

    var redacted: String { "postgres://\(user)@\(host):\(port)/\(database)" }

    static func redact(_ text: String) -> String {
        guard var components = URLComponents(string: text), components.password != nil else { return text }
        components.password = "***"
        return components.string ?? "(unparseable)"
    }
}

/// `PostgresThreadStore.updateThread`'s statement: every changeable column,
/// on top of the version replaced, under the fence's lease row.
struct ThreadUpdate: PostgresPreparedStatement {
    typealias Row = Int
    static let name = "threadwire_thread_update"
    static let sql: String = {
        let columns = ThreadRow.changeableColumns
        let assignments = columns.enumerated().map { "\($0.element) = $\($0.offset + 1)" }.joined(separator: ", ")
        let n = columns.count
        return """
            WITH updated AS (
                UPDATE threads SET \(assignments)
                WHERE id = $\(n + 1) AND version = $\(n + 2) AND owner = $\(n + 3)
                  AND ($\(n + 4)::text IS NULL OR EXISTS (
                    SELECT 1 FROM thread_leases WHERE tree = $\(n + 4)::text AND epoch = $\(n + 5)::bigint FOR SHARE))
                RETURNING id),
            kept AS (
                INSERT INTO thread_events (thread_id, seq, created_at, record)
                SELECT id, $\(n + 6)::bigint, $\(n + 7)::bigint, $\(n + 8)::bytea FROM updated WHERE $\(n + 6)::bigint IS NOT NULL)
            SELECT 1 FROM updated
            """
    }()

    let row: ThreadRow
    let previousVersion: Int64
    let fence: LeaseFence?
    /// The one event kept with the change, if any.
    let event: StoredEvent?

    func makeBindings() throws -> PostgresBindings {
        var binds = PostgresBindings()
        for value in row.changeableValues {
            switch value {
            case let .text(text): binds.append(text)
            case let .integer(number): binds.append(number)
            case let .boolean(flag): binds.append(flag)
            }
        }
        binds.append(row.id)
        binds.append(previousVersion)
        binds.append(row.owner)
        binds.append(fence?.tree)
        binds.append(fence?.epoch)
        binds.append(event?.sequence)
        binds.append(event?.createdAt)
        binds.append(event.map { ByteBuffer(bytes: $0.bytes) })
        return binds
    }

    func decodeRow(_ row: PostgresRow) throws -> Int { try row.decode(Int.self) }
}
