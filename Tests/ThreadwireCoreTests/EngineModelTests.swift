import Testing
import ThreadwireCore
import ThreadwireModels
import ThreadwireTesting

/// SplitMix64: small, seedable, so a failing case is reproduced by its seed.
struct SeededGenerator: RandomNumberGenerator {
    var state: UInt64
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

/// The reference model: what each thread must look like after the
/// acknowledged commands. Each simulated client owns some fields, so its
/// commands, run concurrently with the others', have an exact expected result.
struct ModelThread: Equatable {
    var model = "echo-1"
    var cwd = "/"
    var mode: MultiAgentMode?
    var archived = false
    var turns: [TurnStatus] = []
}

actor ReferenceModel {
    var threads: [ThreadID: ModelThread] = [:]
    func update(_ id: ThreadID, _ change: (inout ModelThread) -> Void) { change(&threads[id, default: ModelThread()]) }
}

/// Random command sequences from four concurrent simulated clients against
/// the engine, compared with the reference model after every phase; between
/// phases the process "crashes" (a new engine on the same store, no shutdown),
/// sometimes in the middle of a turn.
@Suite("thread engine against a reference model (in memory)")
struct EngineModelTests {
    @Test("random concurrent commands with crashes in between never lose or mix up an acknowledged change", arguments: 0..<12)
    func modelBased(seed: UInt64) async throws {
        let store = InMemoryThreadStore()
        var settings = ServerSettings()
        settings.threadDefaults.flags.multiAgentV2 = seed % 2 == 0
        let reference = ReferenceModel()
        var engine = ThreadEngine(store: store, backend: ScriptedEchoBackend(), settings: settings, sink: RecordingSink())
        var ids: [ThreadID] = []
        for _ in 0..<3 {
            let id = try await engine.startThread(.init(), connection: 1).value.record.id
            ids.append(id)
            await reference.update(id) { _ in }
        }
        for phase in 0..<3 {
            let current = engine
            let threadIDs = ids
            try await withThrowingTaskGroup(of: Void.self) { group in
                for client in 0..<4 {
                    group.addTask {
                        var random = SeededGenerator(state: seed &* 1_000_003 &+ UInt64(phase * 16 + client))
                        for step in 0..<20 {
                            let id = threadIDs.randomElement(using: &random)!
                            try await Self.act(client: client, step: step, on: id, engine: current, reference: reference, random: &random)
                        }
                    }
                }
                try await group.waitForAll()
            }
            // Sometimes crash with a turn running: it must come back INTERRUPTED.
            var random = SeededGenerator(state: seed &+ UInt64(phase) &* 7919)
            if Bool.random(using: &random), let id = await Self.unarchived(ids, reference) {
                let held = try await current.startTurn(id, .init(input: ["#hold"]), connection: 1).value.id
                await reference.update(id) { $0.turns.append(.interrupted) }
                // A dead process writes nothing more: crash once the turn is
                // parked in the model call (its request stored), not before.
                for _ in 0..<2_000 {
                    if try await store.loadThread(id)?.turns.first(where: { $0.id == held })?.modelRequests.count == 1 { break }
                    try await Task.sleep(for: .milliseconds(1))
                }
            }
            engine = ThreadEngine(store: store, backend: ScriptedEchoBackend(), settings: settings, sink: RecordingSink())
            _ = try await engine.recoverInterruptedTurns()
            try await Self.check(ids, store: store, engine: engine, reference: reference, context: "seed \(seed) phase \(phase)")
        }
    }

    static func unarchived(_ ids: [ThreadID], _ reference: ReferenceModel) async -> ThreadID? {
        let threads = await reference.threads
        return ids.first { threads[$0]?.archived == false }
    }

    /// Client 0 owns `model`, 1 `cwd`, 2 the selected mode, 3 archiving and turns.
    static func act(
        client: Int, step: Int, on id: ThreadID, engine: ThreadEngine, reference: ReferenceModel, random: inout SeededGenerator
    ) async throws {
        switch client {
        case 0:
            var update = ThreadEngine.SettingsUpdate()
            update.model = "model-\(step)-\(random.next() % 100)"
            _ = try await engine.updateSettings(id, update)
            await reference.update(id) { $0.model = update.model! }
        case 1:
            var update = ThreadEngine.SettingsUpdate()
            update.cwd = "/work/\(step)"
            _ = try await engine.updateSettings(id, update)
            await reference.update(id) { $0.cwd = update.cwd! }
        case 2:
            var update = ThreadEngine.SettingsUpdate()
            let choice = random.next() % 3
            update.mode = choice == 0 ? .clear : .set(choice == 1 ? .proactive : .explicitRequestOnly)
            _ = try await engine.updateSettings(id, update)
            await reference.update(id) { thread in
                switch update.mode {
                case .clear: thread.mode = nil
                case let .set(mode): thread.mode = mode
                case .keep: break
                }
            }
        default:
            let archived = await reference.threads[id]?.archived ?? false
            if random.next() % 3 == 0 {
                _ = try await engine.setArchived(id, archived: !archived)
                await reference.update(id) { $0.archived = !archived }
            } else if archived {
                await #expect(throws: DomainError.self) { _ = try await engine.startTurn(id, .init(input: ["refused"]), connection: 1) }
            } else {
                let turn = try await engine.startTurn(id, .init(input: ["step \(step)"]), connection: 1).value
                await reference.update(id) { $0.turns.append(.completed) }
                // Patient: on a loaded 2-core CI machine a turn can take seconds.
                let deadline = ContinuousClock.now + .seconds(30)
                while ContinuousClock.now < deadline {
                    let stored = try await engine.readThread(id, includeTurns: true, includeModelRequests: false)
                    if stored.turns?.first(where: { $0.id == turn.id })?.status != .inProgress { return }
                    try await Task.sleep(for: .milliseconds(1))
                }
                Issue.record("turn \(turn.id) did not finish")
            }
        }
    }

    static func check(_ ids: [ThreadID], store: InMemoryThreadStore, engine: ThreadEngine, reference: ReferenceModel, context: String) async throws {
        let expected = await reference.threads
        for id in ids {
            let stored = try #require(try await store.loadThread(id))
            let record = stored.record
            let actual = ModelThread(model: record.model, cwd: record.cwd, mode: record.selectedMode, archived: record.archived,
                                     turns: stored.turns.map(\.status))
            #expect(actual == expected[id], "\(context): thread \(id)")
            if !stored.turns.isEmpty { #expect(record.runtime != nil, "\(context): a thread with turns has a pinned runtime") }
            let inputs = stored.history.filter { $0.kind == .userInput }.count
            #expect(inputs == stored.turns.count, "\(context): one input per turn, history append-only")
            let markers = stored.history.filter { $0.kind == .interruptionMarker }.count
            #expect(markers == stored.turns.filter { $0.status == .interrupted }.count, "\(context): a marker per interrupted turn")
            let read = try await engine.readThread(id, includeTurns: true, includeModelRequests: false)
            #expect(read.record == record && read.turns == stored.turns.array, "\(context): what clients read is what is stored")
        }
    }
}
