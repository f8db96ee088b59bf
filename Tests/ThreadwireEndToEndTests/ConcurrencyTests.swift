import Foundation
import Testing
import ThreadwireServerTesting
import ThreadwireClient
import ThreadwireWire

/// Releases everyone who arrives at once, when the last of `count` arrives.
actor Barrier {
    private let count: Int
    private var waiting: [CheckedContinuation<Void, Never>] = []
    init(_ count: Int) { self.count = count }

    func arrive() async {
        await withCheckedContinuation { continuation in
            waiting.append(continuation)
            if waiting.count == count {
                for waiter in waiting { waiter.resume() }
                waiting = []
            }
        }
    }
}

/// Runs both calls from their own connections, released together at a barrier.
func race<A: Sendable, B: Sendable>(
    _ a: @escaping @Sendable () async throws -> A, _ b: @escaping @Sendable () async throws -> B
) async -> (Result<A, any Error>, Result<B, any Error>) {
    let barrier = Barrier(2)
    async let first = Task { () async -> Result<A, any Error> in
        await barrier.arrive()
        do { return .success(try await a()) } catch { return .failure(error) }
    }.value
    async let second = Task { () async -> Result<B, any Error> in
        await barrier.arrive()
        do { return .success(try await b()) } catch { return .failure(error) }
    }.value
    return await (first, second)
}

func statusCode(_ error: any Error) -> UInt32? {
    if case let ClientError.status(code, _) = error { return code }
    return nil
}

/// Two or more clients acting on the same thread at the same moment, many
/// rounds each, against the real server binary; then kill -9, restart, and
/// compare what is stored with everything that was acknowledged.
@Suite("concurrent clients on one thread (real server)", .timeLimit(.minutes(5)))
struct ConcurrencyTests {
    static let rounds = 30

    func v2Config() -> [Wire.KeyValue] { [Wire.KeyValue(key: "features.multi_agent_v2", value: "true")] }

    @Test("settings/update racing settings/update on different fields: both acknowledged changes are kept, also after kill -9")
    func settingsVersusSettings() async throws {
        let server = try await ServerProcess.launch()
        let a = try await server.client()
        let b = try await server.client()
        let thread = try #require(try await a.startThread().thread?.id)
        var lastModel = ""
        var lastMode: Wire.MultiAgentMode = .unspecified
        for round in 0..<Self.rounds {
            let model = "model-\(round)"
            let mode: Wire.MultiAgentMode = round % 2 == 0 ? .proactive : .explicitRequestOnly
            let (x, y) = await race(
                { try await a.updateSettings(Wire.ThreadSettingsUpdateParams(threadId: thread, model: model)) },
                { try await b.updateSettings(Wire.ThreadSettingsUpdateParams(threadId: thread, multiAgentModeUpdate: .multiAgentMode(mode))) })
            _ = try x.get()
            _ = try y.get()
            lastModel = model
            lastMode = mode
            let stored = try #require(try await a.read(thread, turns: false).thread)
            #expect(stored.model == model && stored.multiAgentMode == mode, "round \(round): \(stored.model ?? "") / \(String(describing: stored.multiAgentMode))")
        }
        await server.kill9()
        try await server.start()
        let after = try #require(try await server.client().read(thread, turns: false).thread)
        #expect(after.model == lastModel && after.multiAgentMode == lastMode)
    }

    @Test("two clients changing one thread's settings at once, more kept events than one bulk move of the SQLite store: after kill -9 a subscriber from the start hears each acknowledged change once, in order")
    func keptEventsOfRacingChangesSurviveKill9() async throws {
        let server = try await ServerProcess.launch()
        let a = try await server.client()
        let b = try await server.client()
        let thread = try #require(try await a.startThread().thread?.id)
        // 2 × 600 changes and thread/started: past the store's move of new
        // events every 1,024 (migration v12), with some left unmoved.
        func change(_ client: ThreadwireClient, _ name: String) async throws -> [String] {
            var acknowledged: [String] = []
            for round in 0..<600 {
                let model = "\(name)-\(round)"
                _ = try await client.updateSettings(Wire.ThreadSettingsUpdateParams(threadId: thread, model: model))
                acknowledged.append(model)
            }
            return acknowledged
        }
        async let fromA = change(a, "a")
        async let fromB = change(b, "b")
        let (changesA, changesB) = try await (fromA, fromB)
        await server.kill9()
        try await server.start()

        let watcher = try await server.client()
        let head = try #require(try await watcher.read(thread, turns: false).thread?.threadSequence)
        #expect(head == 1_201, "thread/started and 1,200 changes")
        let inbox = Inbox(watcher)
        _ = try await watcher.result(Joining.subscribe.request(thread, after: 0))
        let events = try await inbox.kept(of: thread, through: head)
        #expect(events.map(\.number) == Array(1...head), "every number once, in order")
        let models = events.compactMap { event -> String? in
            if case let .threadSettingsUpdated(update) = event.payload { update.settings?.model } else { nil }
        }
        #expect(models.filter { $0.hasPrefix("a-") } == changesA, "a's changes, each once, in the order acknowledged")
        #expect(models.filter { $0.hasPrefix("b-") } == changesB, "b's changes, each once, in the order acknowledged")
    }

    @Test("thread/read, answered from the snapshot's kept encoding, always shows the last acknowledged change while other readers hammer it")
    func readsFollowAcknowledgedWrites() async throws {
        let server = try await InProcessServer.launch()
        let writer = try await server.client()
        let reader = try await server.client()
        let hammer = try await server.client()
        let thread = try #require(try await writer.startThread().thread?.id)
        // Keeps the snapshot's encoding in use (and re-made after each commit) from another connection.
        let hammering = Task {
            var reads = 0
            while !Task.isCancelled, (try? await hammer.read(thread, turns: false)) != nil { reads += 1 }
            return reads
        }
        for round in 0..<100 {
            _ = try await writer.updateSettings(Wire.ThreadSettingsUpdateParams(threadId: thread, model: "model-\(round)"))
            let seen = try #require(try await reader.read(thread, turns: false).thread)
            #expect(seen.model == "model-\(round)", "round \(round) read \(seen.model ?? "nil")")
        }
        hammering.cancel()
        #expect(await hammering.value > 0)
    }

    @Test("archive racing settings/update: both acknowledged changes are kept")
    func archiveVersusSettings() async throws {
        let server = try await ServerProcess.launch()
        let a = try await server.client()
        let b = try await server.client()
        let thread = try #require(try await a.startThread().thread?.id)
        for round in 0..<Self.rounds {
            let archive = round % 2 == 0
            let model = "m\(round)"
            let (x, y) = await race(
                { try await a.result(archive ? .threadArchive(Wire.ThreadArchiveParams(threadId: thread))
                                             : .threadUnarchive(Wire.ThreadUnarchiveParams(threadId: thread))) },
                { try await b.updateSettings(Wire.ThreadSettingsUpdateParams(threadId: thread, model: model)) })
            _ = try x.get()
            _ = try y.get()
            let stored = try #require(try await a.read(thread, turns: false).thread)
            #expect(stored.archived == archive && stored.model == model, "round \(round)")
        }
        await server.kill9()
        try await server.start()
        let after = try #require(try await server.client().read(thread, turns: false).thread)
        #expect(after.archived == ((Self.rounds - 1) % 2 == 0) && after.model == "m\(Self.rounds - 1)")
    }

    @Test("settings/update racing turn/start: every acknowledged selection survives, and the first turn always pins the runtime")
    func settingsVersusTurn() async throws {
        let server = try await ServerProcess.launch()
        let a = try await server.client()
        let b = try await server.client()
        var expectations: [(thread: String, mode: Wire.MultiAgentMode, model: String)] = []
        for round in 0..<Self.rounds {
            // A new thread each round, so the race is always with its first turn.
            let thread = try #require(try await a.startThread(Wire.ThreadStartParams(config: v2Config())).thread?.id)
            let mode: Wire.MultiAgentMode = round % 2 == 0 ? .proactive : .explicitRequestOnly
            let model = "turn-model-\(round)"
            let (x, y) = await race(
                { try await a.updateSettings(Wire.ThreadSettingsUpdateParams(threadId: thread, multiAgentModeUpdate: .multiAgentMode(mode))) },
                { try await b.startTurn(thread, "hello", model: model) })
            _ = try x.get()
            let turnID = try y.get()
            let turn = try await b.waitForTurn(thread, turnID)
            #expect(turn.context?.multiAgentRuntime == .v2, "round \(round): the first turn pins the runtime")
            let stored = try #require(try await a.read(thread, turns: false).thread)
            #expect(stored.multiAgentRuntime == .v2, "round \(round): runtime stored")
            #expect(stored.multiAgentMode == mode && stored.model == model, "round \(round)")
            expectations.append((thread, mode, model))
        }
        await server.kill9()
        try await server.start()
        let client = try await server.client()
        for expected in expectations {
            let after = try #require(try await client.read(expected.thread, turns: false).thread)
            #expect(after.multiAgentMode == expected.mode && after.model == expected.model && after.multiAgentRuntime == .v2)
        }
    }

    @Test("archive racing turn/start: never an archived thread with a running turn")
    func archiveVersusTurn() async throws {
        let server = try await ServerProcess.launch()
        let a = try await server.client()
        let b = try await server.client()
        let thread = try #require(try await a.startThread().thread?.id)
        var archivedWins = 0
        var turnWins = 0
        for round in 0..<Self.rounds {
            // A held turn stays running, so the loser of the race must be refused.
            let (x, y) = await race(
                { try await a.result(.threadArchive(Wire.ThreadArchiveParams(threadId: thread))) },
                { try await b.startTurn(thread, "#hold") })
            let stored = try #require(try await a.read(thread).thread)
            let running = stored.turns.contains { $0.status == .inProgress }
            #expect(!(stored.archived == true && running), "round \(round): archived with a running turn")
            switch (x, y) {
            case (.success, .failure(let error)):
                archivedWins += 1
                #expect(statusCode(error) == 9, "round \(round): turn/start on an archived thread")
                _ = try await a.result(.threadUnarchive(Wire.ThreadUnarchiveParams(threadId: thread)))
            case (.failure(let error), .success(let turnID)):
                turnWins += 1
                #expect(statusCode(error) == 9, "round \(round): archive with a running turn")
                _ = try await b.result(.turnInterrupt(Wire.TurnInterruptParams(threadId: thread, turnId: turnID)))
            default:
                Issue.record("round \(round): exactly one of archive and a held turn/start must win, got \(x) and \(y)")
            }
        }
        #expect(archivedWins + turnWins == Self.rounds)
        await server.kill9()
        try await server.start()
        let after = try #require(try await server.client().read(thread).thread)
        #expect(!after.turns.contains { $0.status == .inProgress })
        #expect(after.turns.count == turnWins, "every acknowledged turn is stored, no other")
    }

    @Test("fork racing a running turn: the fork is a consistent copy, never a partial unmarked turn")
    func forkVersusTurn() async throws {
        let server = try await InProcessServer.launch()
        let a = try await server.client()
        let b = try await server.client()
        let source = try #require(try await a.startThread().thread?.id)
        for round in 0..<Self.rounds {
            let (x, y) = await race(
                { try await a.runTurn(source, "round \(round)") },
                { try await b.fork(source) })
            _ = try x.get()
            let forkID = try #require(try y.get().thread?.id)
            let fork = try #require(try await b.read(forkID).thread)
            for turn in fork.turns {
                #expect(turn.status == .completed || turn.status == .interrupted, "round \(round): fork has turn \(String(describing: turn.status))")
            }
            // A copied mid-turn source turn must carry its interruption marker in the fork's history.
            let interrupted = fork.turns.filter { $0.status == .interrupted }.count
            let probe = try await b.runTurn(forkID, "probe")
            #expect(probe.lastContext.of(.interruptionMarker).count == interrupted,
                    "round \(round): \(interrupted) interrupted turns need as many markers")
            #expect(fork.turns.count == round || fork.turns.count == round + 1, "round \(round): \(fork.turns.count) turns")
        }
        let stored = try #require(try await a.read(source).thread)
        #expect(stored.turns.count == Self.rounds && stored.turns.allSatisfy { $0.status == .completed })
    }

    @Test("16 concurrent agent/spawn on one parent never pass the cap (v1 and v2), v2 task names stay unique, and the cap holds after kill -9")
    func spawnVersusSpawn() async throws {
        let server = try await ServerProcess.launch()
        let owner = try await server.client()
        let clients = try await (0..<16).asyncMap { _ in try await server.client() }
        var fullParents: [(parent: String, limitName: String)] = []
        for (runtime, config, cap, limitName) in [("v2", v2Config(), 3, "max_concurrent_threads_per_session"), ("v1", [Wire.KeyValue](), 6, "agents.max_threads")] {
            for round in 0..<5 {
                let parent = try #require(try await owner.startThread(Wire.ThreadStartParams(config: config)).thread?.id)
                try await owner.runTurn(parent, "hi")
                let barrier = Barrier(clients.count)
                let results = await withTaskGroup(of: Result<Wire.ThreadLifecycleResult, any Error>.self) { group in
                    for client in clients {
                        group.addTask {
                            await barrier.arrive()
                            do { return .success(try await client.spawn(parent)) } catch { return .failure(error) }
                        }
                    }
                    var all: [Result<Wire.ThreadLifecycleResult, any Error>] = []
                    for await result in group { all.append(result) }
                    return all
                }
                let accepted = results.compactMap { try? $0.get() }
                #expect(accepted.count == cap, "\(runtime) round \(round): \(accepted.count) spawns accepted, cap \(cap)")
                for case let .failure(error) in results {
                    #expect(statusCode(error) == 8, "\(runtime): refused spawns are RESOURCE_EXHAUSTED, got \(error)")
                }
                if runtime == "v2" {
                    let names = accepted.compactMap { $0.thread?.source?.taskName }
                    #expect(Set(names).count == names.count && names.count == cap, "v2 task names unique: \(names)")
                }
                guard case let .threadList(children) = try await owner.result(.threadList(Wire.ThreadListParams(parentThreadId: parent))) else { throw UnexpectedResult(expected: "threadList") }
                #expect(children.data.count == cap, "stored children match the acknowledged ones")
                fullParents.append((parent, limitName))
            }
        }
        // The caps are counted from the stored registry, not from memory.
        await server.kill9()
        try await server.start()
        let again = try await server.client()
        for (parent, limitName) in fullParents {
            await expectStatus(8, mentioning: limitName) { _ = try await again.spawn(parent) }
        }
    }

    @Test("commands on one thread do not wait for another thread's held turn or slow commands")
    func otherThreadsAreNotDelayed() async throws {
        let server = try await InProcessServer.launch()
        let client = try await server.client()
        let busy = try #require(try await client.startThread().thread?.id)
        let held = try await client.startTurn(busy, "#hold")
        let other = try #require(try await client.startThread().thread?.id)
        // The busy thread's own reads and settings work while its turn runs.
        _ = try await client.updateSettings(Wire.ThreadSettingsUpdateParams(threadId: busy, model: "while-held"))
        #expect(try await client.read(busy).thread?.status?.type == .active)
        for i in 0..<20 { try await client.runTurn(other, "turn \(i)") }
        _ = try await client.result(.turnInterrupt(Wire.TurnInterruptParams(threadId: busy, turnId: held)))
        #expect(try await client.waitForTurn(busy, held).status == .interrupted)
    }
}
