import Foundation
import Testing
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
        server.kill9()
        await stream.value
        let threads = await acknowledged.threads
        let lastModels = await acknowledged.lastModels

        try await server.startOffPool()
        defer { server.stop() }
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
        defer { a.stop(); b.stop() }
        let onA = try await a.client()
        let thread = try #require(try await onA.startThread(Wire.ThreadStartParams(name: "shared")).thread?.id)
        try await onA.runTurn(thread, "written through a")
        let onB = try await b.client()
        let read = try await onB.read(thread)
        #expect(read.thread?.name == "shared")
        #expect(read.thread?.turns.count == 1)
        guard case let .threadList(list) = try await onB.result(.threadList(Wire.ThreadListParams())) else { return }
        #expect(list.data.map(\.id) == [thread])
    }

    @Test("a --store that cannot be reached or parsed stops startup with a message naming it, without the password")
    func badStore() throws {
        for (url, mentions) in [("postgres://nobody:secret-pw@127.0.0.1:1/db", "127.0.0.1:1"), ("mysql://x@y/z", "postgres://")] {
            let process = Process()
            process.executableURL = URL(fileURLWithPath: ServerProcess.binary)
            process.arguments = ["--listen", "127.0.0.1:0", "--store", url]
            let err = Pipe()
            process.standardError = err
            process.standardOutput = Pipe()
            try process.run()
            let text = String(decoding: err.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
            process.waitUntilExit()
            #expect(process.terminationStatus != 0)
            #expect(text.contains(mentions), "\(text)")
            #expect(!text.contains("secret-pw"))
        }
    }
}
