import Foundation
import Testing
import ThreadwireCore
import ThreadwireSQLite

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

    @Test("the connection that commits syncs the WAL on every commit (synchronous = FULL), also after a reopen")
    func commitsAreSynced() async throws {
        // GRDB's pool sets synchronous = NORMAL on its writer after opening it;
        // NORMAL would lose acknowledged commits on power loss.
        let dir = directory()
        #expect(try SQLiteThreadStore(directory: dir).synchronousLevel == 2)
        #expect(try SQLiteThreadStore(directory: dir).synchronousLevel == 2)
    }

    @Test("the committing connection keeps savepoints' page copies in memory (temp_store = MEMORY), also after a reopen")
    func savepointJournalsInMemory() async throws {
        // Each commit of a group runs in a savepoint; past 64 KiB SQLite
        // spills its page copies to a temporary file, two writes per page.
        let dir = directory()
        #expect(try SQLiteThreadStore(directory: dir).tempStoreLevel == 2)
        #expect(try SQLiteThreadStore(directory: dir).tempStoreLevel == 2)
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

    @Test("a group with a failing commit is written again commit by commit: the others land whole, the failing one writes nothing")
    func groupReplayedAfterFailure() async throws {
        let dir = directory()
        let store = try SQLiteThreadStore(directory: dir)
        let item = ContextItem(role: .user, kind: .userInput, text: "x")
        try await store.commit([.putThread(record("a", created: 1)), .appendHistory("a", firstSequence: 0, items: [item])])
        // Alone in its transaction, the failing commit is rolled back whole
        // (its first operation would otherwise have written thread "lone").
        await #expect(throws: StoreError.historySequenceTaken(threadID: "a", sequence: 0)) {
            try await store.commit([.putThread(self.record("lone", created: 2)), .appendHistory("a", firstSequence: 0, items: [item])])
        }
        #expect(try await store.threadRecord("lone") == nil)
        // A long commit holds the writer while the failing commit and good
        // ones queue behind it, so they are written as one group.
        var replayed = false
        var attempts = 0
        while !replayed && attempts < 5 {
            let attempt = attempts
            attempts += 1
            let replayedBefore = await store.replayedTransactionCount
            let long = Task {
                try await store.commit([.putThread(self.record("long\(attempt)", created: 3)),
                                        .appendHistory("long\(attempt)", firstSequence: 0,
                                                       items: Array(repeating: item, count: 3_000))])
            }
            try await Task.sleep(for: .milliseconds(5))
            let bad = Task {
                try await store.commit([.putThread(self.record("bad\(attempt)", created: 4)),
                                        .appendHistory("a", firstSequence: 0, items: [item])])
            }
            let good = (0..<8).map { index in
                Task { try await store.commit([.putThread(self.record("good\(attempt)-\(index)", created: 5)),
                                               .appendHistory("good\(attempt)-\(index)", firstSequence: 0, items: [item])]) }
            }
            try await long.value
            await #expect(throws: StoreError.historySequenceTaken(threadID: "a", sequence: 0)) { try await bad.value }
            for task in good { try await task.value }
            #expect(try await store.threadRecord("bad\(attempt)") == nil, "the failing commit's first operation was rolled back")
            replayed = await store.replayedTransactionCount > replayedBefore
        }
        #expect(replayed, "the failing commit never shared a transaction in 5 attempts")
        let reopened = try SQLiteThreadStore(directory: dir)
        for attempt in 0..<attempts {
            for index in 0..<8 {
                let stored = try await reopened.loadThread("good\(attempt)-\(index)")
                #expect(stored?.history.map(\.text) == ["x"], "good\(attempt)-\(index) landed whole")
            }
            #expect(try await reopened.threadRecord("bad\(attempt)") == nil)
        }
        #expect(try await reopened.loadThread("a")?.history.map(\.text) == ["x"])
    }

    @Test("new events are appended apart and moved in bulk: read in order across both tables, after a reopen too, numbers never stored twice, deleted with their tree")
    func eventsMovedInBulk() async throws {
        let dir = directory()
        let store = try SQLiteThreadStore(directory: dir)
        func event(_ n: Int64) -> StoredEvent { StoredEvent(sequence: n, createdAt: 5_000 + n, bytes: Array("event \(n)".utf8)) }
        var busy = record("busy", created: 1)
        var quiet = record("quiet", created: 2)
        try await store.commit([.putThread(busy), .putThread(quiet)])
        // 1,500 events of one thread in commits of 10 from 4 writers at once,
        // and one event of another thread every 100: past one move, not two.
        try await withThrowingTaskGroup(of: Void.self) { group in
            for writer in 0..<4 {
                group.addTask {
                    var mine = self.record("w\(writer)", created: 3)
                    try await store.commit([.putThread(mine)])
                    for _ in 0..<3 {
                        mine.version += 1
                        mine.eventSequence += 1
                        try await store.commit([.putThread(mine), .appendEvents(mine.id, [event(mine.eventSequence)])])
                    }
                }
            }
            for commit in 0..<150 {
                busy.version += 1
                busy.eventSequence += 10
                try await store.commit([.putThread(busy), .appendEvents("busy", (busy.eventSequence - 9...busy.eventSequence).map(event))])
                if commit % 10 == 9 {
                    quiet.version += 1
                    quiet.eventSequence += 1
                    try await store.commit([.putThread(quiet), .appendEvents("quiet", [event(quiet.eventSequence)])])
                }
            }
            try await group.waitForAll()
        }
        let notMoved = try await store.eventsNotYetMoved
        #expect(notMoved > 0 && notMoved < 1_527, "\(notMoved) of 1,527 events not moved: both tables hold some")
        func readAll(_ store: SQLiteThreadStore, _ thread: ThreadID, page: Int) async throws -> [Int64] {
            var numbers: [Int64] = []
            while true {
                let events = try await store.events(thread, after: numbers.last ?? 0, limit: page)
                #expect(events == events.map { event($0.sequence) }, "records and times as stored")
                numbers += events.map(\.sequence)
                if events.count < page { return numbers }
            }
        }
        #expect(try await readAll(store, "busy", page: 97) == Array(1...1_500))
        #expect(try await readAll(store, "quiet", page: 4) == Array(1...15))
        #expect(try await readAll(store, "w0", page: 2) == [1, 2, 3])
        // A number stored again is refused, with the row's change or alone.
        var retaken = busy
        retaken.version += 1
        retaken.eventSequence += 1
        await #expect(throws: StoreError.historySequenceTaken(threadID: "busy", sequence: 1_500)) {
            try await store.commit([.putThread(retaken), .appendEvents("busy", [event(1_500), event(1_501)])])
        }
        await #expect(throws: StoreError.historySequenceTaken(threadID: "busy", sequence: 1_499)) {
            try await store.commit([.appendEvents("busy", [event(1_499)])])
        }
        #expect(try await store.threadRecord("busy")?.version == busy.version, "the refused commit wrote nothing")
        // Stale versions are still conflicts, not taken numbers.
        var stale = busy
        stale.eventSequence += 1
        await #expect(throws: StoreError.conflict(threadID: "busy", expectedVersion: busy.version - 1)) {
            try await store.commit([.putThread(stale), .appendEvents("busy", [event(1_501)])])
        }
        let reopened = try SQLiteThreadStore(directory: dir)
        #expect(try await readAll(reopened, "busy", page: 500) == Array(1...1_500))
        #expect(try await reopened.trimEvents(keep: 10, createdBefore: 0) == 1_490 + 5)
        #expect(try await reopened.eventsNotYetMoved == 0, "a retention pass moves every new event first")
        #expect(try await readAll(reopened, "busy", page: 100) == Array(1_491...1_500))
        #expect(try await reopened.deleteTree("busy", fence: nil) == ["busy"])
        #expect(try await reopened.events("busy", after: 0, limit: 10).isEmpty)
        #expect(try await readAll(reopened, "quiet", page: 100) == Array(6...15))
    }

    @Test("a versioned write succeeds only on top of the version it replaces; a stale one fails loudly and changes nothing")
    func compareAndSet() async throws {
        let store = try SQLiteThreadStore(directory: directory())
        var base = record("v", created: 1)
        try await store.commit([.putThread(base)])
        await #expect(throws: StoreError.conflict(threadID: base.id, expectedVersion: 0), "a second insert of the same id") { try await store.commit([.putThread(base)]) }
        base.model = "first"
        base.version = 2
        try await store.commit([.putThread(base)])
        var stale = record("v", created: 1)
        stale.model = "stale"
        stale.version = 2  // also written on top of version 1: lost the race
        await #expect(throws: StoreError.conflict(threadID: "v", expectedVersion: 1)) {
            try await store.commit([.putThread(stale), .appendHistory("v", firstSequence: 0, items: [ContextItem(role: .user, kind: .userInput, text: "x")])])
        }
        let stored = try #require(try await store.loadThread("v"))
        #expect(stored.record.model == "first" && stored.record.version == 2)
        #expect(stored.history.isEmpty, "the failed commit's other operations were rolled back with it")
    }

    @Test("the agent registry, mailbox and running turns survive a reopen")
    func registryMailboxRecovery() async throws {
        let dir = directory()
        let store = try SQLiteThreadStore(directory: dir)
        var child = ThreadRecord(id: "c", sessionID: "root", source: .threadSpawn, depth: 1, createdAt: 2, model: "child-model", cwd: "/")
        child.parentID = "root"
        child.taskName = "/root/a"
        child.agentStatus = .completed
        child.agentFinalMessage = "done"
        let turn = TurnRecord(id: "u", threadID: "c", sequence: 0, startedAt: 3, items: [],
                              context: TurnContext(model: "child-model", runtime: .v2, effectiveMode: nil, cwd: "/"))
        try await store.commit([
            .putThread(record("root", created: 1)), .putThread(child), .putTurn(turn),
            .enqueueMailbox(recipient: "root", item: ContextItem(role: .user, kind: .mailbox, text: "one")),
            .enqueueMailbox(recipient: "root", item: ContextItem(role: .user, kind: .mailbox, text: "two")),
        ])
        let reopened = try SQLiteThreadStore(directory: dir)
        let tree = try await reopened.agentTree("root")
        #expect(tree.map(\.id) == ["c"])
        #expect(tree.first?.agentStatus == .completed && tree.first?.agentFinalMessage == "done" && tree.first?.model == "child-model")
        #expect(try await reopened.threadsWithRunningTurns() == ["c"])
        let mailbox = try await reopened.pendingMailbox("root")
        #expect(mailbox.map(\.item.text) == ["one", "two"])
        try await reopened.commit([.removeMailbox(recipient: "root", throughSequence: mailbox[0].sequence)])
        #expect(try await reopened.pendingMailbox("root").map(\.item.text) == ["two"])
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
