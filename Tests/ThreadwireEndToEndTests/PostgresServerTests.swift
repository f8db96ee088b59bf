import Foundation
import Testing
import ThreadwireServerTesting
import ThreadwireClient
import ThreadwireTesting
import ThreadwireWire

/// The real server on the PostgreSQL store (a throwaway cluster the tests
/// start themselves, see `PostgresCluster`).
@Suite("the server on PostgreSQL (real server, real PostgreSQL)", .timeLimit(.minutes(3)))
struct PostgresServerTests {
    @Test("kill -9 during concurrent writes loses no acknowledged change; a turn left running is recovered as interrupted")
    func killNineOnPostgres() async throws {
        let url = try await PostgresCluster.database()
        let server = try await ServerProcess.launch(arguments: ["--store", url])
        let writers = try await (0..<4).asyncMap { _ in try await server.client() }
        let owned = try await writers.asyncMap { try #require(try await $0.startThread().thread?.id) }
        let held = try #require(try await writers[0].startThread().thread?.id)
        let heldTurn = try await writers[0].startTurn(held, "#hold")
        let acknowledged = Acknowledged()
        let stream = acknowledged.writeUntilFailure(writers, owned: owned)
        while await acknowledged.count < 200 { try await Task.sleep(for: .milliseconds(5)) }
        try await Task.sleep(for: .milliseconds(Int.random(in: 0...150)))
        await server.kill9()
        await stream.value
        let threads = await acknowledged.threads
        let lastModels = await acknowledged.lastModels

        try await server.start()
        defer { server.stopInBackground() }
        let client = try await server.client()
        try await Acknowledged.expectPresent(threads: threads, lastModels: lastModels, owned: owned, client)
        let recovered = try #require(try await client.read(held).thread?.turns.first { $0.id == heldTurn })
        #expect(recovered.status == .interrupted)
        // And the thread takes a new turn.
        #expect(try await client.runTurn(held, "again").status == .completed)
    }

    @Test("two instances starting at once on an empty database both migrate it and serve the same threads")
    func concurrentStartAndSharedThreads() async throws {
        let url = try await PostgresCluster.database()
        let (a, b) = try await withThrowingTaskGroup(of: ServerProcess.self) { group in
            for _ in 0..<2 { group.addTask { try await ServerProcess.launch(arguments: ["--store", url]) } }
            let first = try await group.next()!
            let second = try await group.next()!
            return (first, second)
        }
        defer { a.stopInBackground(); b.stopInBackground() }
        let onA = try await a.client()
        let thread = try #require(try await onA.startThread(Wire.ThreadStartParams(name: "shared")).thread?.id)
        try await onA.runTurn(thread, "written through a")
        let onB = try await b.client()
        let read = try await onB.read(thread)
        #expect(read.thread?.name == "shared")
        #expect(read.thread?.turns.count == 1)
        guard case let .threadList(list) = try await onB.result(.threadList(Wire.ThreadListParams())) else { throw UnexpectedResult(expected: "threadList") }
        #expect(list.data.map(\.id) == [thread])
    }

    @Test("a --store that cannot be reached or parsed stops startup with a message naming it, without the password")
    func badStore() async throws {
        for (url, mentions) in [("postgres://nobody:secret-pw@127.0.0.1:1/db", "127.0.0.1:1"), ("mysql://x@y/z", "postgres://")] {
            let (status, _, text) = try await runBinary(ServerProcess.binary, ["--listen", "127.0.0.1:0", "--store", url])
            #expect(status != 0)
            #expect(text.contains(mentions), "\(text)")
            #expect(!text.contains("secret-pw"))
        }
    }
}

extension PostgresServerTests {
    /// psql against the test cluster, off the test concurrency pool.
    static func psql(_ url: String, _ sql: String) async throws {
        let components = try #require(URLComponents(string: url))
        _ = try await offThread {
            let process = Process()
            process.executableURL = URL(fileURLWithPath: "/usr/bin/psql")
            process.arguments = ["-h", components.host!, "-p", "\(components.port!)", "-U", components.user!, "-d", "postgres",
                                 "-v", "ON_ERROR_STOP=1", "-qc", sql]
            process.standardOutput = FileHandle.nullDevice
            try process.run()
            process.waitForExit()
            guard process.terminationStatus == 0 else { throw TestTimeout(description: "psql failed: \(sql)") }
        }
    }

    @Test("every backend of the server terminated (its lone-update connections too): each settings update after that is acknowledged, and a restarted server reads the last one")
    func updatesAfterBackendsTerminated() async throws {
        let url = try await PostgresCluster.database()
        let database = try #require(url.split(separator: "/").last.map(String.init))
        let server = try await ServerProcess.launch(arguments: ["--store", url])
        defer { server.stopInBackground() }
        let client = try await server.client()
        let thread = try #require(try await client.startThread().thread?.id)
        // Lone updates, one at a time: their connections get made and used.
        for round in 0..<5 {
            _ = try await client.updateSettings(Wire.ThreadSettingsUpdateParams(threadId: thread, model: "before-\(round)"))
            try await Task.sleep(for: .milliseconds(50))
        }
        try await Self.psql(url, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '\(database)'")
        // Time for the server to see its connections closed.
        try await Task.sleep(for: .milliseconds(500))
        for round in 0..<10 {
            _ = try await client.updateSettings(Wire.ThreadSettingsUpdateParams(threadId: thread, model: "after-\(round)"))
            try await Task.sleep(for: .milliseconds(50))
        }
        #expect(await server.stop() == 0)
        try await server.start()
        let again = try await server.client()
        #expect(try await again.read(thread, turns: false).thread?.model == "after-9")
    }

    @Test("/readyz includes the database: 503 naming the store while PostgreSQL refuses the server, ready again when it accepts")
    func readinessFollowsTheDatabase() async throws {
        let url = try await PostgresCluster.database()
        let database = try #require(url.split(separator: "/").last.map(String.init))
        let server = try await ServerProcess.launch(arguments: ["--store", url, "--admin-listen", "127.0.0.1:0"])
        defer { server.stopInBackground() }
        #expect(try await httpGet(port: server.adminPort, path: "/readyz").status == 200)

        try await Self.psql(url, "ALTER DATABASE \(database) WITH ALLOW_CONNECTIONS false")
        try await Self.psql(url, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '\(database)'")
        var readyz = (status: 0, body: "")
        let deadline = ContinuousClock.now + .seconds(30)
        while ContinuousClock.now < deadline {
            readyz = try await httpGet(port: server.adminPort, path: "/readyz")
            if readyz.status == 503 { break }
            try await Task.sleep(for: .milliseconds(200))
        }
        #expect(readyz.status == 503 && readyz.body.contains("store"), "\(readyz)")
        let health = try await server.client(initialize: false)
        guard case let .healthCheck(answer) = try await health.result(.healthCheck(.init())) else { Issue.record("bad result"); return }
        #expect(answer.status == .notServing)

        try await Self.psql(url, "ALTER DATABASE \(database) WITH ALLOW_CONNECTIONS true")
        let recovered = ContinuousClock.now + .seconds(30)
        while ContinuousClock.now < recovered {
            readyz = try await httpGet(port: server.adminPort, path: "/readyz")
            if readyz.status == 200 { break }
            try await Task.sleep(for: .milliseconds(200))
        }
        #expect(readyz.status == 200, "ready again once the database accepts the server: \(readyz)")
        let client = try await server.client()
        _ = try await client.startThread()
    }

    @Test("/metrics on PostgreSQL has the commit latency histogram and batch sizes the SQLite store has, moving with commits")
    func commitMetrics() async throws {
        let url = try await PostgresCluster.database()
        let server = try await ServerProcess.launch(arguments: ["--store", url, "--admin-listen", "127.0.0.1:0"])
        defer { server.stopInBackground() }
        let before = try await httpGet(port: server.adminPort, path: "/metrics").body
        let client = try await server.client()
        // Concurrent commits, so some share a call.
        try await withThrowingTaskGroup(of: Void.self) { group in
            for _ in 0..<20 { group.addTask { _ = try await client.startThread() } }
            try await group.waitForAll()
        }
        let after = try await httpGet(port: server.adminPort, path: "/metrics").body
        let calls = (metricValue(after, "threadwire_store_commit_seconds_count") ?? 0) - (metricValue(before, "threadwire_store_commit_seconds_count") ?? 0)
        #expect(calls >= 1 && calls <= 20, "one observation per call to threadwire_commit: \(calls)")
        #expect(after.contains("threadwire_store_commit_seconds_bucket{le="), "a histogram, with buckets")
        #expect((metricValue(after, "threadwire_store_commit_batch_size_sum") ?? 0) - (metricValue(before, "threadwire_store_commit_batch_size_sum") ?? 0) >= 20,
                "every commit counted in some batch")
        #expect(after.contains("# HELP threadwire_store_commit_seconds "))
    }
}
