import Foundation
import Logging
import ThreadwirePostgres
#if canImport(Glibc)
import Glibc
#endif

/// A throwaway PostgreSQL cluster for the tests: Debian's `initdb` into a
/// temporary directory (as the `postgres` user when running as root: initdb
/// refuses root), `pg_ctl start` on a free port, stopped and deleted when the
/// test process exits, also when tests fail. `THREADWIRE_TEST_POSTGRES`
/// (`postgres://user@host:port`) uses a running server instead.
public final class PostgresCluster: @unchecked Sendable {
    public static let shared: Result<PostgresCluster, any Error> = Result { try PostgresCluster() }

    /// `postgres://user@127.0.0.1:port` (no database).
    public let base: String
    private let directory: String?
    private let binaries: String
    private let owner: String?
    private let counter = NSLock()
    private var databases = 0

    private init() throws {
        let found = (try? FileManager.default.contentsOfDirectory(atPath: "/usr/lib/postgresql")) ?? []
        guard let version = found.compactMap(Int.init).max() else {
            throw ClusterError("PostgreSQL is not installed (make test installs Debian's postgresql package)")
        }
        binaries = "/usr/lib/postgresql/\(version)/bin"
        if let external = ProcessInfo.processInfo.environment["THREADWIRE_TEST_POSTGRES"] {
            base = external
            directory = nil
            owner = nil
            return
        }
        let dir = NSTemporaryDirectory() + "threadwire-pg-" + UUID().uuidString
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        owner = getuid() == 0 ? "postgres" : nil
        if let owner { try Self.run("/bin/chown", [owner, dir]) }
        directory = dir
        let port = try Self.freePort()
        try Self.run(binaries + "/initdb", ["-D", dir + "/data", "-U", "threadwire", "--auth=trust", "--no-sync"], as: owner)
        // fsync off: the cluster is thrown away with the test process and no
        // test crashes it (they crash threadwire's servers), so flushing its
        // files to disk would only take time from the tests.
        try Self.run(binaries + "/pg_ctl", [
            "-D", dir + "/data", "-l", dir + "/server.log", "-w", "-t", "60",
            "-o", "-p \(port) -k \(dir) -c listen_addresses=127.0.0.1 -c max_connections=300 -c fsync=off -c full_page_writes=off", "start",
        ], as: owner)
        base = "postgres://threadwire@127.0.0.1:\(port)"
        PostgresCluster.stopAtExit = { [binaries, owner] in
            try? Self.run(binaries + "/pg_ctl", ["-D", dir + "/data", "-m", "immediate", "-w", "stop"], as: owner)
            try? FileManager.default.removeItem(atPath: dir)
        }
        atexit { PostgresCluster.stopAtExit?() }
    }

    nonisolated(unsafe) static var stopAtExit: (() -> Void)?

    /// A new database of the shared cluster (started on first use), with
    /// threadwire's schema already in it; its URL.
    ///
    /// Each is a copy of one template migrated once per test process: a
    /// migration is dozens of DDL statements, a PL/pgSQL function and a
    /// trigram index, and a full `swift test` opens stores on dozens of
    /// databases, up to fifteen at once. Migrated each on its own, those runs
    /// of DDL held the 2-core machine long enough for stores to miss their
    /// start-up limit. A copy is PostgreSQL copying the template's few
    /// pages. The store's own migration still runs on open and finds nothing
    /// left to apply.
    /// The blocking work (initdb, pg_ctl, createdb) runs on threads of its
    /// own, never on the test's concurrency pool, which it would starve.
    public static func database() async throws -> String {
        let template = try await migratedTemplate.value
        return try await onThread { try shared.get().makeDatabase(template: template) }
    }

    /// The template's name, once it is migrated and closed to connections
    /// (`CREATE DATABASE … TEMPLATE` refuses a template anyone is connected to).
    private static let migratedTemplate = Task<String, any Error> {
        let cluster = try await onThread { try shared.get() }
        let name = "tw_template_\(getpid())"
        try await onThread { try cluster.createDatabase(name) }
        let store = try await PostgresThreadStore.connect(url: cluster.base + "/" + name,
                                                          logger: Logger(label: "threadwire-test-template"),
                                                          startupTimeout: .seconds(120))
        store.close()
        try await onThread {
            try cluster.sql("ALTER DATABASE \(name) WITH ALLOW_CONNECTIONS false")
            try cluster.sql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '\(name)'")
        }
        return name
    }

    private static func onThread<T: Sendable>(_ work: @escaping @Sendable () throws -> T) async throws -> T {
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<T, any Error>) in
            Thread.detachNewThread { continuation.resume(with: Result { try work() }) }
        }
    }

    /// A new database, a copy of `template` (PostgreSQL's `template1` when
    /// nil); its URL.
    public func makeDatabase(template: String? = nil) throws -> String {
        let name = counter.withLock { () -> String in
            databases += 1
            return "tw_\(getpid())_\(databases)"
        }
        try createDatabase(name, template: template)
        return base + "/" + name
    }

    private func createDatabase(_ name: String, template: String? = nil) throws {
        let components = URLComponents(string: base)!
        try Self.run(binaries + "/createdb", [
            "-h", components.host!, "-p", "\(components.port ?? 5432)", "-U", components.user!,
        ] + (template.map { ["-T", $0] } ?? []) + [name])
    }

    /// One statement through psql, on the `postgres` database.
    private func sql(_ statement: String) throws {
        let components = URLComponents(string: base)!
        try Self.run(binaries + "/psql", [
            "-h", components.host!, "-p", "\(components.port ?? 5432)", "-U", components.user!, "-d", "postgres",
            "-v", "ON_ERROR_STOP=1", "-c", statement,
        ])
    }

    /// posix_spawn and waitpid: Foundation's Process.waitUntilExit can hang
    /// on a test's thread (it waits on a run loop that is not running).
    private static func run(_ path: String, _ arguments: [String], as user: String? = nil) throws {
        let argv = user.map { ["/usr/sbin/runuser", "-u", $0, "--", path] } ?? [path]
        let all = argv + arguments
        // A file, not a pipe: the server pg_ctl starts inherits it and never closes it.
        let log = NSTemporaryDirectory() + "threadwire-pg-output-" + UUID().uuidString
        defer { unlink(log) }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 1, log, O_WRONLY | O_CREAT | O_TRUNC, 0o666)
        posix_spawn_file_actions_adddup2(&actions, 1, 2)
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        // Nothing else of the test process: pg_ctl's postmaster outlives the
        // call, and a pipe it inherited (a test server's stdout being set up
        // on another thread at that moment) would never reach end of file.
        // (glibc 2.34's posix_spawn_file_actions_addclosefrom_np, which
        // Swift's Glibc module does not declare.)
        if let closeFrom = Self.closeFrom { _ = closeFrom(&actions, 3) }
        var pid: pid_t = 0
        let cArguments = all.map { strdup($0) } + [nil]
        defer { cArguments.forEach { free($0) } }
        let spawned = posix_spawn(&pid, all[0], &actions, nil, cArguments, environ)
        guard spawned == 0 else { throw ClusterError("cannot start \(all[0]): \(String(cString: strerror(spawned)))") }
        var status: Int32 = 0
        while waitpid(pid, &status, 0) == -1 && errno == EINTR {}
        let exitCode = (status & 0x7f) == 0 ? (status >> 8) & 0xff : 128 + (status & 0x7f)
        guard exitCode == 0 else {
            let text = (try? String(contentsOfFile: log, encoding: .utf8)) ?? ""
            throw ClusterError("\((path as NSString).lastPathComponent) failed (\(exitCode)): \(text)")
        }
    }

    private static let closeFrom: (@convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, Int32) -> Int32)? = {
        guard let symbol = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "posix_spawn_file_actions_addclosefrom_np") else { return nil }
        return unsafeBitCast(symbol, to: (@convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, Int32) -> Int32).self)
    }()

    public static func freePort() throws -> Int {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(fd) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) == 0 && getsockname(fd, $0, &length) == 0 }
        }
        guard bound else { throw ClusterError("no free port") }
        return Int(UInt16(bigEndian: address.sin_port))
    }
}

public struct ClusterError: Error, CustomStringConvertible {
    public let description: String
    init(_ description: String) { self.description = description }
}
