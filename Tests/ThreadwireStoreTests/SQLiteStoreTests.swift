import Foundation
import Testing
import ThreadwireCore
import ThreadwireStore

@Suite("SQLite store")
struct SQLiteStoreTests {
    func directory() -> String { NSTemporaryDirectory() + "threadwire-store-" + UUID().uuidString }

    func record(_ id: String, created: Millis) -> ThreadRecord {
        ThreadRecord(id: id, sessionID: id, source: .appServer, createdAt: created, model: "m", cwd: "/")
    }

    @Test("concurrent commits are grouped into fewer transactions, and all of them are durable")
    func groupCommit() async throws {
        let dir = directory()
        let store = try SQLiteThreadStore(directory: dir)
        try await withThrowingTaskGroup(of: Void.self) { group in
            for i in 0..<200 {
                group.addTask { try await store.commit([.putThread(self.record("t\(i)", created: Millis(i)))]) }
            }
            try await group.waitForAll()
        }
        let transactions = await store.transactionCount
        #expect(transactions < 200, "200 concurrent commits took \(transactions) transactions")
        let reopened = try SQLiteThreadStore(directory: dir)
        for i in 0..<200 { #expect(try await reopened.threadRecord("t\(i)") != nil) }
    }

    @Test("one failing commit fails alone inside a group")
    func failureIsolation() async throws {
        let store = try SQLiteThreadStore(directory: directory())
        try await store.commit([.putThread(record("a", created: 1)), .appendHistory("a", firstSequence: 0, items: [ContextItem(role: .user, kind: .userInput, text: "x")])])
        let bad = Task { try await store.commit([.appendHistory("a", firstSequence: 0, items: [ContextItem(role: .user, kind: .userInput, text: "dup")])]) }
        let good = Task { try await store.commit([.putThread(self.record("b", created: 2))]) }
        await #expect(throws: (any Error).self) { try await bad.value }
        try await good.value
        #expect(try await store.loadThread("a")?.history.map(\.text) == ["x"])
        #expect(try await store.threadRecord("b") != nil)
    }

    @Test("set-if-unset pins once and touches neither timestamps nor history")
    func setRuntimeIfUnset() async throws {
        let store = try SQLiteThreadStore(directory: directory())
        var legacy = record("l", created: 100)
        legacy.updatedAt = 200
        legacy.legacy = true
        try await store.commit([.putThread(legacy), .appendHistory("l", firstSequence: 0, items: [ContextItem(role: .user, kind: .userInput, text: "old")])])
        try await store.commit([.setRuntimeIfUnset("l", .v1)])
        try await store.commit([.setRuntimeIfUnset("l", .v2)])
        let loaded = try #require(try await store.loadThread("l"))
        #expect(loaded.record.runtime == .v1)
        #expect(loaded.record.createdAt == 100 && loaded.record.updatedAt == 200)
        #expect(loaded.history.map(\.text) == ["old"])
    }

    @Test("turns, items, contexts and model requests round-trip through protobuf records")
    func turnRoundTrip() async throws {
        let store = try SQLiteThreadStore(directory: directory())
        var turn = TurnRecord(id: "u1", threadID: "t", sequence: 0, startedAt: 5,
                              items: [ItemRecord(id: "i1", type: .userMessage, text: "hé ✓")],
                              context: TurnContext(model: "m", runtime: .v2, effectiveMode: .proactive, cwd: "/w"))
        turn.modelRequests = [ModelRequestRecord(model: "m", contextCount: 3, tools: [ToolSpec(name: "spawn_agent", namespace: "collaboration", description: "d")])]
        turn.status = .interrupted
        turn.completedAt = 9
        try await store.commit([.putThread(record("t", created: 1)), .putTurn(turn)])
        #expect(try await store.loadThread("t")?.turns == [turn])
    }

    @Test("list pages with keyset cursors in both directions")
    func listPaging() async throws {
        let store = try SQLiteThreadStore(directory: directory())
        try await store.commit((0..<5).map { .putThread(record("t\($0)", created: Millis($0))) })
        var query = ThreadListQuery()
        query.limit = 2
        var seen: [String] = []
        repeat {
            let page = try await store.listThreads(query)
            seen += page.records.map(\.id)
            query.cursor = page.nextCursor
        } while query.cursor != nil
        #expect(seen == ["t4", "t3", "t2", "t1", "t0"])
        query = ThreadListQuery()
        query.ascending = true
        query.limit = 3
        #expect(try await store.listThreads(query).records.map(\.id) == ["t0", "t1", "t2"])
    }
}
