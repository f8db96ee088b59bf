import Testing
@testable import ThreadwireCore
import ThreadwireTesting

/// A queued turn is an acknowledged change: when the commit that starts it
/// fails on the store (PostgreSQL restarting, a connection lost mid-commit)
/// it must stay queued and start later, never leave the queue unstarted.
@Suite("the turn queue when the store fails (in memory)")
struct QueueStoreFailureTests {
    static func startsQueued(_ operations: [StoreOperation]) -> Bool {
        operations.contains { operation in
            guard case let .appendHistory(_, _, items) = operation else { return false }
            return items.contains { $0.kind == .userInput && $0.text == "queued" }
        }
    }

    @Test("a queued turn whose start commit fails (store unavailable, or its outcome unknown) stays queued and starts once the store answers",
          arguments: [StoreError.unavailable("the database is restarting"), .outcomeUnknown("the connection dropped mid-commit")])
    func queuedTurnOutlivesFailedStart(_ failure: StoreError) async throws {
        let store = UnfencedStore()
        let backend = EngineTests.GatedBackend()
        let engine = ThreadEngine(store: store, backend: backend, settings: ServerSettings(), sink: RecordingSink())
        let id = try await engine.startThread(.init(), connection: 1).value.record.id
        try await engine.startTurn(id, .init(input: ["first"]), connection: 1).publish()
        let enqueued = try await engine.startOrQueueTurn(id, .init(input: ["queued"]), whenBusy: .enqueue, connection: 1)
        enqueued.publish()
        guard case let .queued(entry) = enqueued.value else { throw UnexpectedOutcome(description: "expected queued, got \(enqueued.value)") }
        #expect(try await store.threadRecord(id)?.queue.map(\.id) == [entry.id])

        // The first turn ends; the two commits that would start the queued one fail.
        store.failCommits(2, with: failure, where: Self.startsQueued)
        backend.open()
        let turns = try await Self.waitForTurns(engine, id, count: 2)
        #expect(store.failedCommits == 2, "the fault was hit \(store.failedCommits) times")
        #expect(turns.allSatisfy { $0.status == .completed }, "\(turns.map(\.status))")
        let stored = try #require(try await store.loadThread(id))
        #expect(stored.record.queue.isEmpty, "left queued: \(stored.record.queue.map(\.input))")
        #expect(stored.history.filter { $0.kind == .userInput }.map(\.text) == ["first", "queued"])
    }

    static func waitForTurns(_ engine: ThreadEngine, _ id: ThreadID, count: Int) async throws -> [TurnRecord] {
        var turns: [TurnRecord] = []
        // A try every second after each failure: 2 failures take about 2 s.
        for _ in 0..<1_000 {
            turns = try await engine.readThread(id, includeTurns: true, includeModelRequests: false).turns ?? []
            if turns.count == count, turns.allSatisfy({ $0.status != .inProgress }) { return turns }
            try await Task.sleep(for: .milliseconds(20))
        }
        throw UnexpectedOutcome(description: "\(count) finished turns expected, got \(turns.map(\.status)) after 20 s")
    }

    struct UnexpectedOutcome: Error, CustomStringConvertible {
        var description: String
    }
}
