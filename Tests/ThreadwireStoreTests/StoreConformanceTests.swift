// Over 400 lines on purpose: this is the one list of what every ThreadStore
// must do, run against every backend; split, a backend could miss a part.
import Foundation
import Logging
import NIOCore
import NIOPosix
import PostgresNIO
import Testing
import ThreadwireCore
import ThreadwirePostgres
import ThreadwireSQLite
import ThreadwireStorage
import ThreadwireTesting

/// Every ThreadStore backend, fresh and empty.
enum Backend: String, CaseIterable, CustomStringConvertible, Sendable {
    case memory, sqlite, postgres

    var description: String { rawValue }

    func make() async throws -> any ThreadStore {
        switch self {
        case .memory:
            return InMemoryThreadStore()
        case .sqlite:
            return try SQLiteThreadStore(directory: NSTemporaryDirectory() + "threadwire-conformance-" + UUID().uuidString)
        case .postgres:
            let url = try await PostgresCluster.database()
            // A long operation timeout: these tests are about what lands, and
            // in a full run on 2 cores a grouped commit has taken over the
            // default 5 s; the tests about the timeout make their own store.
            return try await PostgresThreadStore.connect(url: url, logger: Logger(label: "conformance"), operationTimeout: .seconds(60))
        }
    }
}

private func thread(_ id: String, created: Millis, owner: Principal = .standalone, parent: ThreadID? = nil,
                    session: ThreadID? = nil) -> ThreadRecord {
    var record = ThreadRecord(id: id, sessionID: session ?? id, source: parent == nil ? .appServer : .threadSpawn,
                              depth: parent == nil ? 0 : 1, createdAt: created, model: "m", cwd: "/w")
    record.parentID = parent
    record.principal = owner
    record.updatedAt = created + 1000 - (created % 7)   // another order than created_at
    return record
}

private func turn(_ threadID: ThreadID, _ sequence: Int, status: TurnStatus = .completed) -> TurnRecord {
    var turn = TurnRecord(id: "\(threadID)-turn-\(sequence)", threadID: threadID, sequence: sequence, startedAt: 1000 + Int64(sequence),
                          items: [ItemRecord(type: .userMessage, text: "input \(sequence)")],
                          context: TurnContext(model: "m", runtime: .v2, effectiveMode: nil, cwd: "/w"))
    turn.status = status
    return turn
}

/// The commit must be refused with exactly `refusal`: any other error (a
/// store that is down, a driver's error no store error names) fails the test.
private func expectRefused(_ store: any ThreadStore, _ operations: [StoreOperation], as refusal: StoreError,
                           sourceLocation: SourceLocation = #_sourceLocation) async {
    do {
        try await store.commit(operations)
        Issue.record("expected the commit to be refused: \(refusal)", sourceLocation: sourceLocation)
    } catch {
        #expect(error as? StoreError == refusal, "\(String(reflecting: error))", sourceLocation: sourceLocation)
    }
}

/// Refused as a stale version of `thread` (its stored version is not `version`).
private func expectConflict(_ store: any ThreadStore, _ operations: [StoreOperation], on thread: ThreadID, expecting version: Int64,
                            sourceLocation: SourceLocation = #_sourceLocation) async {
    await expectRefused(store, operations, as: .conflict(threadID: thread, expectedVersion: version), sourceLocation: sourceLocation)
}

@Suite("ThreadStore conformance: in-memory, SQLite and PostgreSQL", .timeLimit(.minutes(3)))
struct StoreConformanceTests {
    @Test("a thread is inserted once; an update lands only on the version it replaces, and never changes the owner", arguments: Backend.allCases)
    func compareAndSet(_ backend: Backend) async throws {
        let store = try await backend.make()
        var record = thread("t1", created: 100, owner: "alice")
        try await store.commit([.putThread(record)])
        await expectConflict(store, [.putThread(record)], on: "t1", expecting: 0)                   // a second insert
        var next = record
        next.version = 2
        next.model = "second"
        try await store.commit([.putThread(next)])
        var stale = record
        stale.version = 2
        stale.model = "stale"
        await expectConflict(store, [.putThread(stale)], on: "t1", expecting: 1)                   // on top of version 1 again
        var skipping = next
        skipping.version = 4
        await expectConflict(store, [.putThread(skipping)], on: "t1", expecting: 3)
        var stolen = next
        stolen.version = 3
        stolen.principal = "mallory"
        await expectConflict(store, [.putThread(stolen)], on: "t1", expecting: 2)
        let stored = try #require(try await store.threadRecord("t1"))
        #expect(stored == next)
        #expect(stored.principal == "alice")
        record = stored
        record.version = 3
        record.archived = true
        record.agentStatus = .running
        record.configOverrides = [KeyValuePair(key: "agents.max_threads", value: "2")]
        try await store.commit([.putThread(record)])
        #expect(try await store.threadRecord("t1") == record)
    }

    @Test("a thread's events are kept with its row's change, numbered once each (a number stored again refuses the whole commit), read in order after a position, and trimmed for every thread by count and age but never a thread's newest", arguments: Backend.allCases)
    func keptEvents(_ backend: Backend) async throws {
        let store = try await backend.make()
        func event(_ n: Int64, at: Millis = 5_000) -> StoredEvent { StoredEvent(sequence: n, createdAt: at, bytes: Array("event \(n)".utf8) + [0, 255]) }
        var record = thread("ev", created: 100)
        record.eventSequence = 1
        try await store.commit([.putThread(record), .appendEvents("ev", [event(1, at: 1_000)])])
        // A row replacement with its events alone (PostgreSQL's set-based path), two threads at once.
        var other = thread("ev-other", created: 200)
        try await store.commit([.putThread(other)])
        record.version = 2
        record.eventSequence = 3
        other.version = 2
        other.eventSequence = 1
        let firstCommit: [StoreOperation] = [.putThread(record), .appendEvents("ev", [event(2), event(3)])]
        let secondCommit: [StoreOperation] = [.putThread(other), .appendEvents("ev-other", [event(1)])]
        async let first: Void = store.commit(firstCommit)
        async let second: Void = store.commit(secondCommit)
        _ = try await (first, second)
        #expect(try await store.events("ev", after: 0, limit: 10) == [event(1, at: 1_000), event(2), event(3)])
        #expect(try await store.events("ev", after: 1, limit: 1) == [event(2)])
        #expect(try await store.events("ev", after: 3, limit: 10).isEmpty)
        #expect(try await store.events("ev-other", after: 0, limit: 10) == [event(1)])
        #expect(try await store.threadRecord("ev")?.eventSequence == 3)

        var retaken = record
        retaken.version = 3
        retaken.eventSequence = 4
        await expectRefused(store, [.putThread(retaken), .appendEvents("ev", [event(3), event(4)])],
                            as: .historySequenceTaken(threadID: "ev", sequence: 3))
        #expect(try await store.threadRecord("ev")?.version == 2, "the refused commit wrote nothing")
        #expect(try await store.events("ev", after: 3, limit: 10).isEmpty)

        record.version = 3
        record.eventSequence = 5
        try await store.commit([.putThread(record), .appendEvents("ev", [event(4), event(5)])])
        // Retention: keep 3 → 3, 4, 5 of ev; ev-other keeps its only (newest) one.
        #expect(try await store.trimEvents(keep: 3, createdBefore: 0) == 2)
        #expect(try await store.events("ev", after: 0, limit: 10).map(\.sequence) == [3, 4, 5], "numbered 3 or more below the newest: gone")
        #expect(try await store.trimEvents(keep: 100, createdBefore: 1_000_000) == 2)
        #expect(try await store.events("ev", after: 0, limit: 10).map(\.sequence) == [5], "all older than the age gone, the newest kept")
        #expect(try await store.events("ev-other", after: 0, limit: 10).count == 1, "another thread's events untouched")
    }

    @Test("a retention pass over more threads than one statement or write takes trims every one of them, keeping each one's newest", arguments: Backend.allCases)
    func trimsEveryThread(_ backend: Backend) async throws {
        let store = try await backend.make()
        let threads = 40
        for n in 0..<threads {
            var record = thread("many-\(n)", created: Millis(100 + n))
            record.eventSequence = 3
            try await store.commit([.putThread(record),
                                    .appendEvents("many-\(n)", (1...3).map { StoredEvent(sequence: $0, createdAt: 5_000, bytes: [UInt8($0)]) })])
        }
        #expect(try await store.trimEvents(keep: 1, createdBefore: 0) == 2 * threads)
        for n in 0..<threads {
            #expect(try await store.events("many-\(n)", after: 0, limit: 10).map(\.sequence) == [3], "thread \(n)")
        }
        #expect(try await store.trimEvents(keep: 1, createdBefore: 0) == 0, "nothing left to forget")
    }

    @Test("a commit is all or nothing: one failing operation leaves no trace of the others", arguments: Backend.allCases)
    func atomicCommits(_ backend: Backend) async throws {
        let store = try await backend.make()
        try await store.commit([.putThread(thread("a", created: 1))])
        let stale = thread("a", created: 1)
        await expectConflict(store, [
            .putThread(thread("b", created: 2)), .appendHistory("b", firstSequence: 0, items: [ContextItem(role: .user, kind: .userInput, text: "x")]),
            .putTurn(turn("b", 0)), .enqueueMailbox(recipient: "a", item: ContextItem(role: .developer, kind: .mailbox, text: "m")),
            .putThread(stale),
        ], on: "a", expecting: 0)
        #expect(try await store.threadRecord("b") == nil)
        #expect(try await store.loadThread("b") == nil)
        #expect(try await store.pendingMailbox("a").isEmpty)
        // A history item stored twice fails the same way.
        let item = ContextItem(role: .user, kind: .userInput, text: "once")
        try await store.commit([.appendHistory("a", firstSequence: 0, items: [item])])
        await expectRefused(store, [.putThread(thread("c", created: 3)), .appendHistory("a", firstSequence: 0, items: [item])],
                            as: .historySequenceTaken(threadID: "a", sequence: 0))
        #expect(try await store.threadRecord("c") == nil)
        #expect(try await store.loadThread("a")?.history == [item])
    }

    @Test("an idempotency key is stored with its change (and the answer the change tells), once: a second claim refuses its whole commit; a later answer never replaces one stored", arguments: Backend.allCases)
    func idempotencyKeys(_ backend: Backend) async throws {
        let store = try await backend.make()
        let key = IdempotencyKey(principal: "alice", key: "k-1")
        let claim = IdempotencyClaim(key: key, method: "thread/settings/update", fingerprint: [1, 2, 3], threadID: "t1",
                                     turnIDs: ["u1", "u2"], createdAtMillis: 1_000)
        try await store.commit([.claimIdempotencyKey(claim, response: [9, 9]), .putThread(thread("t1", created: 1, owner: "alice"))])
        #expect(try await store.idempotencyRecord(key) == IdempotencyRecord(claim: claim, response: [9, 9]))
        // The repeat that lost the race: nothing of its commit is written.
        do {
            try await store.commit([.claimIdempotencyKey(claim, response: nil), .putThread(thread("t2", created: 2))])
            Issue.record("a second claim of the same key committed")
        } catch StoreError.idempotencyKeyTaken(let taken) {
            #expect(taken == key)
        }
        #expect(try await store.threadRecord("t2") == nil)
        try await store.commit([.recordIdempotentResponse(claim, response: [7])])
        #expect(try await store.idempotencyRecord(key)?.response == [9, 9], "a later answer replaced the one stored with the change")
        // A claim without an answer gets one added; a key that changed nothing stores both.
        let bare = IdempotencyClaim(key: IdempotencyKey(principal: "alice", key: "k-2"), method: "turn/start", fingerprint: [4],
                                    threadID: "t1", createdAtMillis: 2_000)
        try await store.commit([.claimIdempotencyKey(bare, response: nil)])
        #expect(try await store.idempotencyRecord(bare.key)?.response == nil)
        try await store.commit([.recordIdempotentResponse(bare, response: [5])])
        #expect(try await store.idempotencyRecord(bare.key) == IdempotencyRecord(claim: bare, response: [5]))
        let refusal = IdempotencyClaim(key: IdempotencyKey(principal: "bob", key: "k-1"), method: "thread/rollback", fingerprint: [6],
                                       createdAtMillis: 3_000)
        try await store.commit([.recordIdempotentResponse(refusal, response: [3])])
        #expect(try await store.idempotencyRecord(refusal.key) == IdempotencyRecord(claim: refusal, response: [3]), "keys are per principal")
        #expect(try await store.purgeIdempotencyRecords(createdBefore: 2_500) == 2)
        #expect(try await store.idempotencyRecord(key) == nil)
        #expect(try await store.idempotencyRecord(refusal.key) != nil)
    }

    @Test("load returns the record, history in sequence order and turns (replaced in place) in sequence order", arguments: Backend.allCases)
    func loadThread(_ backend: Backend) async throws {
        let store = try await backend.make()
        let record = thread("t", created: 5)
        let items = (0..<5).map { ContextItem(role: .user, kind: .userInput, text: "item \($0)") }
        try await store.commit([.putThread(record), .appendHistory("t", firstSequence: 0, items: Array(items.prefix(2))), .putTurn(turn("t", 1))])
        try await store.commit([.appendHistory("t", firstSequence: 2, items: Array(items.suffix(3))), .putTurn(turn("t", 0))])
        var replaced = turn("t", 1)
        replaced.items.append(ItemRecord(type: .agentMessage, text: "answer"))
        replaced.status = .interrupted
        try await store.commit([.putTurn(replaced)])
        let loaded = try #require(try await store.loadThread("t"))
        #expect(loaded.record == record)
        #expect(loaded.history.array == items)
        #expect(loaded.turns.map(\.id) == ["t-turn-0", "t-turn-1"])
        #expect(loaded.turns[1] == replaced)
        #expect(try await store.loadThread("missing") == nil)
    }

    @Test("thread lists page by keyset cursor in both directions and both sorts, filtered by archived, parent and owner", arguments: Backend.allCases)
    func listPages(_ backend: Backend) async throws {
        let store = try await backend.make()
        var records = (0..<9).map { thread("t\($0)", created: 100 + Int64($0) * 10, owner: $0 % 3 == 0 ? "bob" : "alice") }
        records[4].archived = true
        records[5].parentID = "t1"
        records[6].parentID = "t1"
        try await store.commit(records.map { .putThread($0) })
        let live = records.filter { !$0.archived }
        for sortKey in [ThreadListQuery.SortKey.createdAt, .updatedAt] {
            for ascending in [true, false] {
                for owner in [nil, "alice"] as [Principal?] {
                    var query = ThreadListQuery()
                    query.sortKey = sortKey
                    query.ascending = ascending
                    query.limit = 2
                    query.principal = owner
                    var seen: [ThreadID] = []
                    while true {
                        let page = try await store.listThreads(query)
                        #expect(page.records.count <= 2)
                        seen += page.records.map(\.id)
                        guard let next = page.nextCursor else { break }
                        query.cursor = next
                    }
                    let key: (ThreadRecord) -> Millis = sortKey == .createdAt ? { $0.createdAt } : { $0.updatedAt }
                    let expected = live.filter { owner == nil || $0.principal == owner }
                        .sorted { ascending ? (key($0), $0.id) < (key($1), $1.id) : (key($0), $0.id) > (key($1), $1.id) }
                    #expect(seen == expected.map(\.id), "\(sortKey) ascending \(ascending) owner \(owner ?? "any")")
                }
            }
        }
        var archived = ThreadListQuery()
        archived.archived = true
        #expect(try await store.listThreads(archived).records.map(\.id) == ["t4"])
        var children = ThreadListQuery()
        children.parentID = "t1"
        children.ascending = true
        #expect(try await store.listThreads(children).records.map(\.id) == ["t5", "t6"])
        var bad = ThreadListQuery()
        bad.cursor = "not a cursor"
        await #expect(throws: (any Error).self) { _ = try await store.listThreads(bad) }
    }

    @Test("turn pages in both directions after a sequence; nil for a thread that does not exist", arguments: Backend.allCases)
    func turnPages(_ backend: Backend) async throws {
        let store = try await backend.make()
        try await store.commit([.putThread(thread("t", created: 1))] + (0..<7).map { .putTurn(turn("t", $0)) })
        #expect(try await store.turnsPage("t", afterSequence: nil, limit: 3, descending: false)?.map(\.sequence) == [0, 1, 2])
        #expect(try await store.turnsPage("t", afterSequence: 2, limit: 3, descending: false)?.map(\.sequence) == [3, 4, 5])
        #expect(try await store.turnsPage("t", afterSequence: nil, limit: 3, descending: true)?.map(\.sequence) == [6, 5, 4])
        #expect(try await store.turnsPage("t", afterSequence: 4, limit: 10, descending: true)?.map(\.sequence) == [3, 2, 1, 0])
        #expect(try await store.turnsPage("t", afterSequence: 6, limit: 3, descending: false)?.isEmpty == true)
        #expect(try await store.turnsPage("missing", afterSequence: nil, limit: 3, descending: false) == nil)
    }

    @Test("agent trees, the mailbox (in order, removed through a sequence) and threads with running turns", arguments: Backend.allCases)
    func treesMailboxRunning(_ backend: Backend) async throws {
        let store = try await backend.make()
        let root = thread("root", created: 1)
        let first = thread("c1", created: 2, parent: "root", session: "root")
        let second = thread("c2", created: 3, parent: "c1", session: "root")
        let other = thread("other", created: 4)
        try await store.commit([.putThread(root), .putThread(second), .putThread(first), .putThread(other)])
        #expect(try await store.agentTree("root").map(\.id) == ["c1", "c2"])
        #expect(try await store.agentTree("other").isEmpty)

        let items = (0..<3).map { ContextItem(role: .developer, kind: .mailbox, text: "report \($0)") }
        for item in items { try await store.commit([.enqueueMailbox(recipient: "root", item: item)]) }
        try await store.commit([.enqueueMailbox(recipient: "other", item: items[0])])
        let pending = try await store.pendingMailbox("root")
        #expect(pending.map(\.item) == items)
        #expect(pending.map(\.sequence) == pending.map(\.sequence).sorted())
        try await store.commit([.removeMailbox(recipient: "root", throughSequence: pending[1].sequence)])
        #expect(try await store.pendingMailbox("root").map(\.item) == [items[2]])
        #expect(try await store.pendingMailbox("other").map(\.item) == [items[0]])

        try await store.commit([.putTurn(turn("c1", 0, status: .inProgress)), .putTurn(turn("root", 0)), .putTurn(turn("c2", 0, status: .inProgress))])
        #expect(try await store.threadsWithRunningTurns() == ["c1", "c2"])
        try await store.commit([.putTurn(turn("c1", 0, status: .interrupted))])
        #expect(try await store.threadsWithRunningTurns() == ["c2"])
    }

    @Test("a tree's deletion takes the root and every thread of its session with their history, turns, events, mailbox, import records and keys, and nothing of other trees; threads with queued turns are found", arguments: Backend.allCases)
    func treeDeletion(_ backend: Backend) async throws {
        let store = try await backend.make()
        var root = thread("root", created: 1, owner: "alice")
        root.eventSequence = 1
        let child = thread("kid", created: 2, owner: "alice", parent: "root", session: "root")
        var other = thread("other", created: 3, owner: "alice")
        other.queue = [QueuedTurn(id: "q1", input: ["later"], model: nil, createdAt: 5)]
        let item = ContextItem(role: .user, kind: .userInput, text: "hi")
        let claim = IdempotencyClaim(key: IdempotencyKey(principal: "alice", key: "k"), method: "thread/settings/update",
                                     fingerprint: [1], threadID: "kid", turnIDs: [], createdAtMillis: 1)
        try await store.commit([.putThread(root), .appendHistory("root", firstSequence: 0, items: [item]), .putTurn(turn("root", 0)),
                                .appendEvents("root", [StoredEvent(sequence: 1, createdAt: 1, bytes: [1])])])
        try await store.commit([.putThread(child), .appendHistory("kid", firstSequence: 0, items: [item]), .putTurn(turn("kid", 0)),
                                .claimIdempotencyKey(claim, response: [7])])
        try await store.commit([.putThread(other), .appendHistory("other", firstSequence: 0, items: [item]), .putTurn(turn("other", 0))])
        try await store.commit([.enqueueMailbox(recipient: "root", item: item), .enqueueMailbox(recipient: "other", item: item)])
        #expect(try await store.threadsWithQueuedTurns() == ["other"])

        #expect(try await store.deleteTree("root", fence: nil) == ["root", "kid"])
        for id in ["root", "kid"] {
            #expect(try await store.threadRecord(id) == nil)
            #expect(try await store.loadThread(id) == nil)
            #expect(try await store.turnsPage(id, afterSequence: nil, limit: 10, descending: false) == nil)
            #expect(try await store.events(id, after: 0, limit: 10).isEmpty)
            #expect(try await store.pendingMailbox(id).isEmpty)
        }
        #expect(try await store.idempotencyRecord(claim.key) == nil)
        #expect(try await store.agentTree("root").isEmpty)
        // The other tree is untouched; deleting again deletes nothing.
        #expect(try await store.loadThread("other")?.turns.count == 1)
        #expect(try await store.pendingMailbox("other").count == 1)
        #expect(try await store.deleteTree("root", fence: nil) == [])
        // A child's id is not a root: nothing goes.
        #expect(try await store.deleteTree("nope", fence: nil) == [])
    }

    @Test("stored bytes of a principal are the bytes of its turns and history as stored: they grow with each, a replaced turn counts once, and another principal's count apart", arguments: Backend.allCases)
    func storedBytesPerPrincipal(_ backend: Backend) async throws {
        let store = try await backend.make()
        try await store.commit([.putThread(thread("a1", created: 1, owner: "alice")), .putThread(thread("a2", created: 2, owner: "alice")),
                                .putThread(thread("b1", created: 3, owner: "bob"))])
        #expect(try await store.storedBytes(of: "alice") == 0)
        let running = turn("a1", 0, status: .inProgress)
        try await store.commit([.putTurn(running)])
        let oneTurn = Int64(StoredRecords.encode(running).count)
        #expect(try await store.storedBytes(of: "alice") == oneTurn)
        // Replaced in place: counted as the new record, once.
        let finished = turn("a1", 0)
        try await store.commit([.putTurn(finished)])
        #expect(try await store.storedBytes(of: "alice") == Int64(StoredRecords.encode(finished).count))
        let items = (0..<3).map { ContextItem(role: .user, kind: .userInput, text: String(repeating: "x", count: 100 * ($0 + 1))) }
        try await store.commit([.appendHistory("a2", firstSequence: 0, items: items), .putTurn(turn("b1", 0))])
        let expected = Int64(StoredRecords.encode(finished).count + items.reduce(0) { $0 + StoredRecords.encode($1).count })
        #expect(try await store.storedBytes(of: "alice") == expected)
        #expect(try await store.storedBytes(of: "bob") == Int64(StoredRecords.encode(turn("b1", 0)).count))
        #expect(try await store.storedBytes(of: "carol") == 0)
    }

    @Test("concurrent commits on different threads all land, and each thread's compare-and-set admits exactly one writer per version", arguments: Backend.allCases)
    func concurrentCommits(_ backend: Backend) async throws {
        let store = try await backend.make()
        try await store.commit((0..<8).map { .putThread(thread("t\($0)", created: Int64($0))) })
        // 8 threads x 4 writers racing for version 2 of each.
        let winners = await withTaskGroup(of: String?.self) { group in
            for index in 0..<32 {
                group.addTask {
                    var record = thread("t\(index % 8)", created: Int64(index % 8))
                    record.version = 2
                    record.model = "writer \(index)"
                    do {
                        try await store.commit([.putThread(record)])
                        return record.model
                    } catch {
                        return nil
                    }
                }
            }
            var all: [String] = []
            for await winner in group { if let winner { all.append(winner) } }
            return all
        }
        #expect(winners.count == 8)
        for index in 0..<8 {
            let stored = try #require(try await store.threadRecord("t\(index)"))
            #expect(stored.version == 2)
            #expect(winners.contains(stored.model))
        }
    }
}

extension StoreConformanceTests {
    @Test("concurrent commits that are refused (stale version) or fail (history sequence taken) write nothing, and the others all land", arguments: Backend.allCases)
    func refusedCommitsAmongConcurrentOnes(_ backend: Backend) async throws {
        let store = try await backend.make()
        try await store.commit((0..<8).map { .putThread(thread("t\($0)", created: Int64($0))) })
        try await store.commit((0..<8).map { .appendHistory("t\($0)", firstSequence: 0, items: [ContextItem(role: .user, kind: .userInput, text: "first")]) })
        enum Kind: CaseIterable { case good, stale, taken }
        // Launched together, so the PostgreSQL store groups them into shared calls.
        let outcomes = await withTaskGroup(of: (Int, Kind, Bool, String).self) { group in
            for index in 0..<8 {
                for kind in Kind.allCases {
                    group.addTask {
                        let id = "t\(index)"
                        var record = thread(id, created: Int64(index))
                        var operations: [StoreOperation] = []
                        switch kind {
                        case .good:
                            record.version = 2
                            record.model = "good"
                            operations = [.appendHistory(id, firstSequence: 1, items: [ContextItem(role: .user, kind: .userInput, text: "good")]),
                                          .putTurn(turn(id, 0)), .putThread(record)]
                        case .stale:
                            record.version = 7
                            record.model = "stale"
                            operations = [.appendHistory(id, firstSequence: 5, items: [ContextItem(role: .user, kind: .userInput, text: "stale")]),
                                          .putTurn(turn("stale-\(id)", 0)), .putThread(record),
                                          .enqueueMailbox(recipient: id, item: ContextItem(role: .user, kind: .userInput, text: "stale"))]
                        case .taken:
                            operations = [.enqueueMailbox(recipient: id, item: ContextItem(role: .user, kind: .userInput, text: "taken")),
                                          .appendHistory(id, firstSequence: 0, items: [ContextItem(role: .user, kind: .userInput, text: "taken")])]
                        }
                        do {
                            try await store.commit(operations)
                            return (index, kind, true, "")
                        } catch {
                            return (index, kind, false, "\(error)")
                        }
                    }
                }
            }
            var all: [(Int, Kind, Bool, String)] = []
            for await outcome in group { all.append(outcome) }
            return all
        }
        #expect(outcomes.count == 24)
        for (index, kind, landed, error) in outcomes {
            #expect(landed == (kind == .good), "t\(index) \(kind): \(error)")
        }
        for index in 0..<8 {
            let stored = try #require(try await store.loadThread("t\(index)"))
            #expect(stored.record.model == "good")
            #expect(stored.record.version == 2)
            #expect(stored.history.map(\.text) == ["first", "good"])
            #expect(stored.turns.map(\.id) == ["t\(index)-turn-0"])
            #expect(try await store.pendingMailbox("t\(index)").isEmpty)
        }
        #expect(try await store.loadThread("stale-t0") == nil)
    }
}

struct LeaseCheckFailed: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}

/// The leases behind several instances on one PostgreSQL store, driven
/// directly: two coordinators stand for two instances.
@Suite("PostgreSQL agent-tree leases and fenced commits", .timeLimit(.minutes(2)))
struct PostgresLeaseTests {
    @Test("one holder at a time; a takeover after expiry raises the epoch; a commit fenced with the old epoch fails and writes nothing")
    func fencedCommitAfterTakeover() async throws {
        let url = try await PostgresCluster.database()
        let store = try await PostgresThreadStore.connect(url: url, logger: Logger(label: "leases"))
        defer { store.close() }
        // The checks below need the first lease live; the takeover then
        // waits for its expiry. A full run on 2 cores once took over 5 s for
        // these four queries, so an attempt slower than the lease is not
        // judged (its lease may have run out, which is what is tested next)
        // but done again on a fresh tree.
        let lease = Duration.seconds(5)
        let first = PostgresLeaseCoordinator(store: store, address: "127.0.0.1:1", leaseDuration: lease)
        let second = PostgresLeaseCoordinator(store: store, address: "127.0.0.1:2", leaseDuration: .seconds(1))
        var record = thread("tree", created: 100)
        var checked: (oldFence: LeaseFence, taken: LeaseClaim, otherHolder: String?, ownHolder: String?, renewed: Set<LeaseFence>)?
        for attempt in 1...3 where checked == nil {
            record = thread("tree-\(attempt)", created: 100)
            let began = ContinuousClock.now
            guard case let .held(oldFence) = try await first.acquire(record.id) else { throw LeaseCheckFailed("a free tree is granted") }
            try await store.commit([.putThread(record)], fence: oldFence)
            let taken = try await second.acquire(record.id)
            let otherHolder = try await second.holder(record.id)
            let ownHolder = try await first.holder(record.id)
            let renewed = try await first.renew([oldFence])
            if ContinuousClock.now - began < lease - .milliseconds(500) {
                checked = (oldFence, taken, otherHolder, ownHolder, renewed)
            }
        }
        let live = try #require(checked, "three attempts each took longer than the \(lease) lease")
        let oldFence = live.oldFence
        let tree = record.id
        #expect(live.taken == .elsewhere(address: "127.0.0.1:1"), "a live lease is not taken")
        #expect(live.otherHolder == "127.0.0.1:1")
        #expect(live.ownHolder == nil, "an instance is not its own other holder")
        #expect(live.renewed == [oldFence])

        // The first instance stops renewing: the second takes over once the lease expired.
        var claim = try await second.acquire(tree)
        let deadline = ContinuousClock.now + .seconds(30)
        while case .elsewhere = claim, ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(200))
            claim = try await second.acquire(tree)
        }
        guard case let .held(newFence) = claim else { throw LeaseCheckFailed("an expired lease is taken over") }
        #expect(newFence.epoch > oldFence.epoch)
        #expect(try await first.renew([oldFence]).isEmpty, "the former holder learns it lost the tree")

        record.model = "late write of the former owner"
        record.version = 2
        do {
            try await store.commit([.putThread(record)], fence: oldFence)
            Issue.record("a commit with a superseded fence must fail")
        } catch StoreError.leaseLost {}
        #expect(try await store.threadRecord(tree)?.model == "m", "nothing of the refused commit landed")
        record.model = "the new owner's write"
        try await store.commit([.putThread(record)], fence: newFence)
        #expect(try await store.threadRecord(tree)?.model == "the new owner's write")
        // With a valid fence, a stale version is still a conflict, not a lost lease.
        do {
            try await store.commit([.putThread(record)], fence: newFence)
            Issue.record("a second write of version 2 must conflict")
        } catch StoreError.conflict {}

        // A tree's deletion is fenced too: the former owner's deletes nothing.
        do {
            _ = try await store.deleteTree(tree, fence: oldFence)
            Issue.record("a deletion with a superseded fence must fail")
        } catch StoreError.leaseLost {}
        #expect(try await store.threadRecord(tree) != nil, "nothing of the refused deletion happened")

        // A released lease is free at once, and the epoch keeps growing.
        await second.release([newFence])
        guard case let .held(again) = try await first.acquire(tree) else { throw LeaseCheckFailed("a released tree is granted at once") }
        #expect(again.epoch > newFence.epoch)
    }

    @Test("a lone update PostgreSQL does not answer (its row locked elsewhere) fails as outcome unknown within the operation timeout, on its own connection; the next updates land")
    func loneUpdateDeadline() async throws {
        let url = try await PostgresCluster.database()
        // 5 s, not less: every other statement here must complete within it,
        // and in a full run on 2 cores (dozens of databases busy at once) a
        // plain commit or read has taken over a second (CI of bb2ab2d).
        let store = try await PostgresThreadStore.connect(url: url, logger: Logger(label: "lone"), operationTimeout: .seconds(5))
        defer { store.close() }
        // Lone updates are for callers on an event loop (the server runs its tasks on them).
        let onLoop = LoopTaskExecutor(MultiThreadedEventLoopGroup.singleton.next())
        var record = thread("t1", created: 100)
        try await store.commit([.putThread(record)])
        // The first update finds no lone-update connection and goes through
        // the group commit; the connection is made meanwhile. How long that
        // takes depends on the machine's load (a fresh-clone CI run needed
        // more than 300 ms), so updates go on until one takes it.
        var viaGroupCommit: [Bool] = []
        let giveUp = ContinuousClock.now + .seconds(30)
        while viaGroupCommit.last != false, ContinuousClock.now < giveUp {
            record.version += 1
            let before = store.commitStatistics.commits
            try await withTaskExecutorPreference(onLoop) { [record] in try await store.commit([.putThread(record)]) }
            viaGroupCommit.append(store.commitStatistics.commits > before)
            try await Task.sleep(for: .milliseconds(50))
        }
        #expect(viaGroupCommit.first == true, "the first update, with no lone-update connection yet, went through the group commit")
        #expect(viaGroupCommit.last == false, "a later update ran on the lone-update connection: \(viaGroupCommit)")
        #expect(try await store.threadRecord("t1") == record)
        // Off the loops, the same update goes through the group commit.
        record.version += 1
        let offLoop = store.commitStatistics.commits
        try await store.commit([.putThread(record)])
        #expect(store.commitStatistics.commits == offLoop + 1)

        let locker = try await RowLocker.lock("t1", url: url)
        record.version += 1
        record.model = "written while the row is locked"
        let before = store.commitStatistics.commits
        let started = ContinuousClock.now
        do {
            try await withTaskExecutorPreference(onLoop) { [record] in try await store.commit([.putThread(record)]) }
            Issue.record("the update cannot complete while the row is locked")
        } catch let StoreError.outcomeUnknown(message) {
            #expect(message.contains("did not complete a commit within"), "\(message)")
        }
        let waited = ContinuousClock.now - started
        #expect(waited >= .seconds(5) && waited < .seconds(15), "gave up at the operation timeout: \(waited)")
        #expect(store.commitStatistics.commits == before, "it was a lone update")
        // Released: the abandoned statement may still land (its outcome was unknown).
        try await locker.release()

        // PostgreSQL runs the abandoned statement once the lock is free (its
        // backend notices the closed connection only after): landing between
        // a read and the next update, it makes that update stale (seen under
        // load). Such an update is made again on the version it left.
        var landed = 0
        var staleOnce = false
        while landed < 3 {
            let stored = try #require(try await store.threadRecord("t1"))
            record.version = stored.version + 1
            record.model = "after the lock, version \(record.version)"
            do {
                try await withTaskExecutorPreference(onLoop) { [record] in try await store.commit([.putThread(record)]) }
            } catch StoreError.conflict where !staleOnce && stored.model != "written while the row is locked" {
                staleOnce = true
                #expect(try await store.threadRecord("t1")?.model == "written while the row is locked", "stale only behind the abandoned update")
                continue
            }
            #expect(try await store.threadRecord("t1") == record)
            landed += 1
            try await Task.sleep(for: .milliseconds(100))
        }
    }

    /// `count` trees, each with its root thread committed under its lease;
    /// trees 0-3 then released and taken again. The fences first granted,
    /// and the current ones.
    static func leasedTrees(_ count: Int, store: PostgresThreadStore) async throws -> (first: [String: LeaseFence], current: [String: LeaseFence]) {
        let instance = PostgresLeaseCoordinator(store: store, address: "127.0.0.1:4", leaseDuration: .seconds(30))
        var first: [String: LeaseFence] = [:]
        for index in 0..<count {
            let tree = "tree\(index)"
            let fence = try #require(try await instance.acquire(tree).heldFence, "\(tree) granted")
            try await store.commit([.putThread(thread(tree, created: Int64(index)))], fence: fence)
            first[tree] = fence
        }
        var current = first
        for index in 0..<4 {
            let tree = "tree\(index)"
            await instance.release([first[tree]!])
            let again = try #require(try await instance.acquire(tree).heldFence, "\(tree) granted again")
            current[tree] = again
        }
        return (first, current)
    }

    @Test("commits grouped into one call each keep their own fence: those of a lost lease write nothing, the others land")
    func groupedFencedCommits() async throws {
        let url = try await PostgresCluster.database()
        let store = try await PostgresThreadStore.connect(url: url, logger: Logger(label: "leases"))
        defer { store.close() }
        // Trees 0-3 are released and taken again: their first fences are stale.
        let (first, latest) = try await Self.leasedTrees(8, store: store)
        let before = store.commitStatistics
        let outcomes = await withTaskGroup(of: (String, Bool, Bool).self) { group in
            for index in 0..<8 {
                for stale in [false, true] {
                    group.addTask {
                        let tree = "tree\(index)"
                        var record = thread(tree, created: Int64(index))
                        record.version = 2
                        record.model = stale ? "written with the first fence" : "written with the current fence"
                        do {
                            try await store.commit([.putTurn(turn(tree, stale ? 1 : 0)), .putThread(record)],
                                                   fence: stale ? first[tree]! : latest[tree]!)
                            return (tree, stale, true)
                        } catch StoreError.leaseLost {
                            return (tree, stale, false)
                        } catch {
                            return (tree, stale, false)
                        }
                    }
                }
            }
            var all: [(String, Bool, Bool)] = []
            for await outcome in group { all.append(outcome) }
            return all
        }
        let after = store.commitStatistics
        #expect(after.commits - before.commits == 16)
        #expect(after.calls - before.calls < 16, "concurrent commits were grouped into shared calls")
        for index in 0..<8 {
            let tree = "tree\(index)"
            let stored = try #require(try await store.loadThread(tree))
            let landed = outcomes.filter { $0.0 == tree && $0.2 }
            if index < 4 {
                // The first fence is stale: only the current one's commit lands.
                #expect(landed.map(\.1) == [false], "\(tree)")
                #expect(stored.record.model == "written with the current fence")
                #expect(stored.turns.map(\.id) == ["\(tree)-turn-0"])
            } else {
                // Both fences are current: exactly one of the two racing version-2 writes lands.
                #expect(landed.count == 1, "\(tree)")
                #expect(stored.turns.count == 1)
            }
        }
    }

    @Test("row replacements of distinct threads grouped into one UPDATE keep each commit's fence and version: a stale fence gets leaseLost, a stale version a conflict, both write nothing; the others land")
    func groupedRowReplacements() async throws {
        let url = try await PostgresCluster.database()
        let store = try await PostgresThreadStore.connect(url: url, logger: Logger(label: "leases"))
        defer { store.close() }
        // Trees 0-3 are released and taken again: their first fences are stale.
        let (first, latest) = try await Self.leasedTrees(16, store: store)
        enum Outcome: Equatable { case landed, leaseLost, conflict(String, Int64), other(String) }
        var byTree: [String: Outcome] = [:]
        var grouped = 0
        // Rounds until some call went as one UPDATE (commits launched together group, but a round may go one by one).
        for round in 0..<20 where grouped == 0 {
            let before = store.commitStatistics.rowUpdateCalls
            let outcomes = await withTaskGroup(of: (String, Outcome).self) { group in
                for index in 0..<16 {
                    group.addTask {
                        let tree = "tree\(index)"
                        var record = thread(tree, created: Int64(index))
                        // Trees 4-7 write on top of a version they do not have; 0-3 stay at version 1.
                        record.version = switch index { case 0..<4: 2; case 4..<8: Int64(100 + round); default: Int64(2 + round) }
                        record.model = "round \(round)"
                        // Landing rows carry NULLs beside text that needs escaping in JSON, and keep an event.
                        var operations: [StoreOperation] = [.putThread(record)]
                        if index >= 8 {
                            record.name = index % 2 == 0 ? "quote \" backslash \\ newline \n é 漢字 🧵 \u{1F}" : nil
                            record.nickname = index % 2 == 0 ? nil : "nick \(round)"
                            record.eventSequence = Int64(round + 1)
                            operations = [.putThread(record),
                                          .appendEvents(tree, [StoredEvent(sequence: Int64(round + 1), createdAt: 7, bytes: [UInt8(index), 0, 255])])]
                        }
                        do {
                            try await store.commit(operations, fence: index < 4 ? first[tree]! : latest[tree]!)
                            return (tree, .landed)
                        } catch StoreError.leaseLost {
                            return (tree, .leaseLost)
                        } catch let StoreError.conflict(threadID, expected) {
                            return (tree, .conflict(threadID, expected))
                        } catch {
                            return (tree, .other("\(error)"))
                        }
                    }
                }
                var all: [(String, Outcome)] = []
                for await outcome in group { all.append(outcome) }
                return all
            }
            byTree = Dictionary(uniqueKeysWithValues: outcomes)
            grouped = store.commitStatistics.rowUpdateCalls - before
            for index in 0..<16 {
                let tree = "tree\(index)"
                let stored = try #require(try await store.loadThread(tree))
                switch index {
                case 0..<4:
                    #expect(byTree[tree] == .leaseLost, "\(tree): \(String(describing: byTree[tree]))")
                    #expect(stored.record.version == 1, "a stale fence wrote nothing")
                case 4..<8:
                    #expect(byTree[tree] == .conflict(tree, Int64(99 + round)), "\(tree): \(String(describing: byTree[tree]))")
                    #expect(stored.record.version == 1, "a stale version wrote nothing")
                default:
                    #expect(byTree[tree] == .landed, "\(tree): \(String(describing: byTree[tree]))")
                    #expect(stored.record.version == Int64(2 + round) && stored.record.model == "round \(round)")
                    #expect(stored.record.name == (index % 2 == 0 ? "quote \" backslash \\ newline \n é 漢字 🧵 \u{1F}" : nil), "\(tree)")
                    #expect(stored.record.nickname == (index % 2 == 0 ? nil : "nick \(round)"), "\(tree)")
                    #expect(stored.record.eventSequence == Int64(round + 1))
                    #expect(try await store.events(tree, after: Int64(round), limit: 10)
                        == [StoredEvent(sequence: Int64(round + 1), createdAt: 7, bytes: [UInt8(index), 0, 255])], "\(tree)")
                }
            }
        }
        #expect(grouped > 0, "commits went as one set-based UPDATE")
    }

    @Test("threads with a running turn count as orphaned only while no live lease covers their tree")
    func orphanedRunningThreads() async throws {
        let url = try await PostgresCluster.database()
        let store = try await PostgresThreadStore.connect(url: url, logger: Logger(label: "leases"))
        defer { store.close() }
        let instance = PostgresLeaseCoordinator(store: store, address: "127.0.0.1:3", leaseDuration: .seconds(30))
        try await store.commit([.putThread(thread("root", created: 1)), .putTurn(turn("root", 0, status: .inProgress))])
        try await store.commit([.putThread(thread("child", created: 2, parent: "root", session: "root")),
                                .putTurn(turn("child", 0, status: .inProgress))])
        #expect(try await instance.orphanedRunningThreads() == ["child", "root"])
        guard case let .held(fence) = try await instance.acquire("root") else { Issue.record("granted"); return }
        #expect(try await instance.orphanedRunningThreads().isEmpty, "a live lease on the tree covers the child too")
        await instance.release([fence])
        #expect(try await instance.orphanedRunningThreads() == ["child", "root"])
    }
}

extension LeaseClaim {
    var heldFence: LeaseFence? {
        if case let .held(fence) = self { fence } else { nil }
    }
}

/// Runs a task's nonisolated code on one event loop, as the server's tasks
/// run (it installs NIO's loops as Swift Concurrency's global executor).
final class LoopTaskExecutor: TaskExecutor {
    let loop: any EventLoop

    init(_ loop: any EventLoop) { self.loop = loop }

    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        loop.execute { job.runSynchronously(on: self.asUnownedTaskExecutor()) }
    }
}
