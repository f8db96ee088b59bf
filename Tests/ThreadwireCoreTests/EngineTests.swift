import Synchronization
import Testing
@testable import ThreadwireCore
import ThreadwireModels
import ThreadwireTesting

/// The engine with an in-memory store and a recording sink: no sockets, no disk.
@Suite("thread engine (in memory)")
struct EngineTests {
    func engine(_ configure: (inout ServerSettings) -> Void = { _ in }) -> (ThreadEngine, InMemoryThreadStore, RecordingSink) {
        var settings = ServerSettings()
        configure(&settings)
        let store = InMemoryThreadStore()
        let sink = RecordingSink()
        return (ThreadEngine(store: store, backend: ScriptedEchoBackend(), settings: settings, sink: sink), store, sink)
    }

    func runTurn(_ engine: ThreadEngine, _ id: ThreadID, _ text: String) async throws -> TurnRecord {
        let outcome = try await engine.startTurn(id, .init(input: [text]), connection: 1)
        outcome.publish()
        // Patient: on a loaded 2-core CI machine a turn can take seconds.
        let deadline = ContinuousClock.now + .seconds(30)
        while ContinuousClock.now < deadline {
            if let turn = try await engine.readThread(id, includeTurns: true, includeModelRequests: false).turns?.last,
               turn.status != .inProgress { return turn }
            try await Task.sleep(for: .milliseconds(5))
        }
        throw DomainError.internal("turn did not finish")
    }

    @Test("a call without a session (a unary gRPC call) subscribes nobody: its thread's events reach only real subscribers")
    func sessionlessCallsSubscribeNobody() async throws {
        let (engine, _, sink) = engine()
        let id = try await engine.startThread(.init(), connection: Subscriber.nobody).value.record.id
        let outcome = try await engine.startTurn(id, .init(input: ["hi"]), connection: Subscriber.nobody)
        outcome.publish()
        #expect(!engine.isSubscribed(Subscriber.nobody))
        for _ in 0..<2_000 where try await engine.readThread(id, includeTurns: true, includeModelRequests: false).turns?.last?.status == .inProgress {
            try await Task.sleep(for: .milliseconds(5))
        }
        // A connection that resumes the thread hears its next turn; nobody never does.
        try await engine.resumeThread(id, model: nil, excludeTurns: true, connection: 7).publish()
        _ = try await runTurn(engine, id, "again")
        let recipients = Set(sink.deliveries.flatMap(\.recipients))
        #expect(recipients.contains(7))
        #expect(!recipients.contains(Subscriber.nobody))
    }

    @Test("the first turn pins the runtime from flags; later flag changes cannot reach it")
    func pinsAtFirstTurn() async throws {
        let (engine, store, _) = engine { $0.threadDefaults.flags.multiAgentV2 = true }
        let id = try await engine.startThread(.init(), connection: 1).value.record.id
        #expect(try await store.threadRecord(id)?.runtime == nil)
        let turn = try await runTurn(engine, id, "hi")
        #expect(turn.context.runtime == .v2)
        #expect(try await store.threadRecord(id)?.runtime == .v2)
    }

    @Test("an agent tree's gate is kept only while spawns hold or wait for it; the cap holds meanwhile")
    func treeGatesArePruned() async throws {
        let (engine, _, _) = engine { $0.threadDefaults.flags.multiAgentV2 = true }
        var parents: [ThreadID] = []
        for _ in 0..<4 {
            let id = try await engine.startThread(.init(), connection: 1).value.record.id
            _ = try await runTurn(engine, id, "hi")
            parents.append(id)
        }
        // 8 concurrent spawns on each of 4 trees.
        let successes = await withTaskGroup(of: (Int, Bool).self) { group in
            for (tree, parent) in parents.enumerated() {
                for _ in 0..<8 {
                    group.addTask { (tree, (try? await engine.spawnAgent(parentID: parent, .init(), connection: 1)) != nil) }
                }
            }
            var counts = [Int](repeating: 0, count: parents.count)
            for await (tree, ok) in group where ok { counts[tree] += 1 }
            return counts
        }
        let cap = ThreadConfig().childAgentCap(for: .v2).limit
        #expect(successes.allSatisfy { $0 == cap }, "spawns that succeeded per tree: \(successes), cap \(cap)")
        #expect(engine.treeGatesInUse == 0)
    }

    /// Answers once the test opens it.
    final class GatedBackend: ModelBackend, Sendable {
        private let state = Mutex<(open: Bool, waiters: [CheckedContinuation<Void, Never>])>((false, []))
        func open() {
            let waiters = state.withLock { state in
                state.open = true
                defer { state.waiters = [] }
                return state.waiters
            }
            for waiter in waiters { waiter.resume() }
        }
        func respond(to request: ModelRequest, stream: ModelStream) async throws -> ModelResponse {
            await withCheckedContinuation { continuation in
                let now = state.withLock { state -> Bool in
                    if state.open { return true }
                    state.waiters.append(continuation)
                    return false
                }
                if now { continuation.resume() }
            }
            return ModelResponse(outputs: [.message("done")])
        }
    }

    // The grace is 2 minutes and the limit 1: a shutdown that did not wake at
    // the turn's end would sleep out the grace and fail the test.
    @Test("shutdown waits for a running turn that ends within the grace, which then completes rather than being interrupted",
          .timeLimit(.minutes(1)))
    func shutdownWaitsForTurnWithinGrace() async throws {
        var settings = ServerSettings()
        settings.shutdownTurnGraceMs = 120_000
        let backend = GatedBackend()
        let store = InMemoryThreadStore()
        let engine = ThreadEngine(store: store, backend: backend, settings: settings, sink: RecordingSink())
        let id = try await engine.startThread(.init(), connection: 1).value.record.id
        let started = try await engine.startTurn(id, .init(input: ["hi"]), connection: 1)
        started.publish()
        let shutdown = Task { await engine.shutdown() }
        while !engine.directory.isWaitingForTurns { await Task.yield() }
        backend.open()
        await shutdown.value
        let turn = try #require(try await store.loadThread(id)?.turns.last)
        #expect(turn.status == .completed)
    }

    @Test("a legacy thread is pinned to v1 on load, timestamps and history kept")
    func legacyLoad() async throws {
        let (engine, store, _) = engine { $0.threadDefaults.flags.multiAgentV2 = true }
        var record = ThreadRecord(id: "legacy", sessionID: "legacy", source: .imported, createdAt: 10, model: "m", cwd: "/")
        record.updatedAt = 20
        record.legacy = true
        await store.seed(StoredThread(record: record, history: [], turns: []))
        let view = try await engine.resumeThread("legacy", model: nil, excludeTurns: true, connection: 1).value
        #expect(view.record.runtime == .v1)
        let stored = try #require(try await store.threadRecord("legacy"))
        #expect(stored.runtime == .v1 && stored.createdAt == 10 && stored.updatedAt == 20)
    }

    @Test("settings updates notify only on change and never add history")
    func settingsNotifyOnChange() async throws {
        let (engine, store, sink) = engine()
        let id = try await engine.startThread(.init(), connection: 1).value.record.id
        var update = ThreadEngine.SettingsUpdate()
        update.mode = .set(.proactive)
        let first = try await engine.updateSettings(id, update)
        let second = try await engine.updateSettings(id, update)
        #expect(first.value.1 && !second.value.1)
        #expect(first.deliveries.count == 1 && second.deliveries.isEmpty)
        #expect(try await store.loadThread(id)?.history.isEmpty == true)
        #expect(!sink.deliveries.contains { if case .settingsUpdated = $0.event { true } else { false } },
                "deliveries are returned to the caller, not sent behind its back")
        first.publish()
        #expect(sink.deliveries.filter { if case .settingsUpdated = $0.event { true } else { false } }.count == 1)
    }

    @Test("a model or cwd of only white space (any Unicode white space) is refused by name; one with text around spaces is kept as sent")
    func blankModelRefused() async throws {
        let (engine, _, _) = engine()
        for blank in ["", " ", "\t\n\r", "\u{3000}\u{2028}\u{00A0}\u{85}"] {
            await #expect(throws: DomainError.invalidArgument("model must not be empty")) {
                var start = ThreadEngine.StartRequest()
                start.model = blank
                _ = try await engine.startThread(start, connection: 1)
            }
        }
        let id = try await engine.startThread(.init(), connection: 1).value.record.id
        var update = ThreadEngine.SettingsUpdate()
        update.cwd = "\u{2003} "
        await #expect(throws: DomainError.invalidArgument("cwd must not be empty")) { _ = try await engine.updateSettings(id, update) }
        update.cwd = nil
        update.model = " gpt x\u{3000}"
        _ = try await engine.updateSettings(id, update)
        #expect(try await engine.readThread(id, includeTurns: false, includeModelRequests: false).record.model == " gpt x\u{3000}")
    }

    @Test("an update to an unloaded thread goes through the loaded copy, so later operations see it")
    func unloadedUpdateIsSeen() async throws {
        let (engine, store, _) = engine()
        let record = ThreadRecord(id: "cold", sessionID: "cold", source: .appServer, createdAt: 1, model: "m", cwd: "/")
        await store.seed(StoredThread(record: record, history: [], turns: []))
        var update = ThreadEngine.SettingsUpdate()
        update.mode = .set(.proactive)
        _ = try await engine.updateSettings("cold", update)
        #expect(try await store.threadRecord("cold")?.selectedMode == .proactive)
        let turn = try await runTurn(engine, "cold", "hi")
        #expect(turn.status == .completed)
        #expect(try await store.threadRecord("cold")?.selectedMode == .proactive, "the turn's write kept the update")
        #expect(try await engine.resumeThread("cold", model: nil, excludeTurns: true, connection: 2).value.record.selectedMode == .proactive)
    }

    @Test("deliveries come back with the outcome so the response goes first")
    func outcomeOrdering() async throws {
        let (engine, _, _) = engine()
        let outcome = try await engine.startThread(.init(), connection: 7)
        #expect(outcome.deliveries.map(\.recipients) == [[7]])
        if case .threadStarted = outcome.deliveries.first?.event {} else { Issue.record("expected thread/started") }
    }
}
