import Foundation
import Testing
import ThreadwireServerTesting
import ThreadwireClient
import ThreadwireWire
import ThreadwireTesting

/// thread/fork at a turn and thread/revert to a boundary, over the real
/// protocol against the in-process server and its SQLite store.
@Suite("branching and reverting (real server)", .timeLimit(.minutes(3)))
struct BranchTests {
    static let v2 = [Wire.KeyValue(key: "features.multi_agent_v2", value: "true")]

    enum Store: String, CaseIterable, CustomStringConvertible, Sendable {
        case sqlite, postgres
        var description: String { rawValue }

        func launch(config: String? = nil) async throws -> InProcessServer {
            switch self {
            case .sqlite: return try await InProcessServer.launch(config: config)
            case .postgres: return try await InProcessServer.launch(config: config, arguments: ["--store", try await PostgresCluster.database()])
            }
        }
    }

    func forked(_ client: ThreadwireClient, _ id: String, _ position: Wire.ThreadForkParams.Position) async throws -> Wire.ThreadLifecycleResult {
        guard case let .threadFork(result) = try await client.result(.threadFork(Wire.ThreadForkParams(threadId: id, position: position))) else {
            throw UnexpectedResult(expected: "thread/fork")
        }
        return result
    }

    func reverted(_ client: ThreadwireClient, _ id: String, _ boundary: Wire.ThreadRevertParams.Boundary) async throws -> [String] {
        guard case let .threadRevert(result) = try await client.result(.threadRevert(Wire.ThreadRevertParams(threadId: id, boundary: boundary))) else {
            throw UnexpectedResult(expected: "thread/revert")
        }
        return result.turnIds
    }

    /// The user inputs the model is shown at a turn's last request.
    func inputs(_ turn: Wire.Turn) -> [String] {
        turn.lastContext.filter { $0.kind == .userInput }.compactMap(\.text)
    }

    @Test("a fork at every position of a 5-turn thread holds the turns up to it and the model sees exactly that history; runtime and selected mode kept",
          arguments: Store.allCases)
    func forkAtEveryPosition(_ store: Store) async throws {
        let server = try await store.launch()
        let client = try await server.client()
        let source = try #require(try await client.startThread(Wire.ThreadStartParams(config: Self.v2, multiAgentMode: .proactive)).thread?.id)
        var turnIDs: [String] = []
        for n in 1...5 { turnIDs.append(try #require(try await client.runTurn(source, "message \(n)").id)) }

        for (index, turnID) in turnIDs.enumerated() {
            for position in [Wire.ThreadForkParams.Position.atTurnId(turnID), .beforeTurnId(turnID)] {
                let kept = if case .atTurnId = position { index + 1 } else { index }
                let fork = try await forked(client, source, position)
                let forkID = try #require(fork.thread?.id)
                #expect(fork.thread?.forkedFromId == source)
                #expect(fork.thread?.forkedAtTurnId == (kept > 0 ? turnIDs[kept - 1] : nil), "\(position): the newest source turn it holds")
                #expect(fork.multiAgentRuntime == .v2, "the runtime stays pinned")
                #expect(fork.multiAgentMode == .proactive, "the selected mode is kept")
                let read = try #require(try await client.read(forkID).thread)
                #expect(read.turns.map(\.id) == Array(turnIDs.prefix(kept)), "\(position): the turns up to the position")
                #expect(read.forkedAtTurnId == fork.thread?.forkedAtTurnId)
                let next = try await client.runTurn(forkID, "branch")
                #expect(inputs(next) == (1...max(1, kept)).prefix(kept).map { "message \($0)" } + ["branch"],
                        "\(position): the model sees the history as it stood there, then the new input")
                #expect(next.context?.multiAgentRuntime == .v2)
            }
        }
        let source5 = try #require(try await client.read(source).thread)
        #expect(source5.turns.count == 5, "the source is unchanged")
        await expectStatus(5, mentioning: "not a turn of thread") {
            _ = try await forked(client, source, .atTurnId("no-such-turn"))
        }
    }

    @Test("revert before or after a turn takes the later turns out of the context, emits thread/reverted, and a new turn follows the boundary",
          arguments: Store.allCases)
    func revertToABoundary(_ store: Store) async throws {
        let server = try await store.launch()
        let client = try await server.client()
        let inbox = Inbox(client)
        let id = try #require(try await client.startThread().thread?.id)
        var turnIDs: [String] = []
        for n in 1...4 { turnIDs.append(try #require(try await client.runTurn(id, "message \(n)").id)) }

        #expect(try await reverted(client, id, .afterTurnId(turnIDs[2])) == [turnIDs[3]])
        let notice = try await inbox.waitFor("thread/reverted") { if case .threadReverted = $0 { true } else { false } }
        guard case let .threadReverted(notified)? = notice.payload else { throw UnexpectedResult(expected: "thread/reverted") }
        #expect(notified.threadId == id && notified.turnIds == [turnIDs[3]])
        #expect(notice.threadSequence != nil, "kept and numbered like every change")

        #expect(try await reverted(client, id, .beforeTurnId(turnIDs[1])) == [turnIDs[1], turnIDs[2]])
        let next = try await client.runTurn(id, "after the revert")
        #expect(inputs(next) == ["message 1", "after the revert"])
        let all = try #require(try await client.result(.threadRead(Wire.ThreadReadParams(threadId: id, includeTurns: true, includeRolledBack: true))))
        guard case let .threadRead(read) = all else { throw UnexpectedResult(expected: "thread/read") }
        #expect(read.thread?.turns.map { $0.rolledBack ?? false } == [false, true, true, true, false], "reverted turns stay readable")

        // Nothing after the boundary: nothing changes.
        let newest = try #require(next.id)
        #expect(try await reverted(client, id, .afterTurnId(newest)) == [])
        await expectStatus(9, mentioning: "already rolled back") { _ = try await reverted(client, id, .beforeTurnId(turnIDs[2])) }
        await expectStatus(5, mentioning: "not a turn of thread") { _ = try await reverted(client, id, .afterTurnId("nope")) }
        await expectStatus(3, mentioning: "before_turn_id or after_turn_id") {
            _ = try await client.result(.threadRevert(Wire.ThreadRevertParams(threadId: id)))
        }
        let running = try await client.startTurn(id, "#hold")
        await expectStatus(9, mentioning: "running turn") { _ = try await reverted(client, id, .beforeTurnId(newest)) }
        _ = try await client.result(.turnInterrupt(Wire.TurnInterruptParams(threadId: id, turnId: running)))
    }

    @Test("the mode fragment follows the seed rules across a fork at a turn and a revert: given again only where the effective mode changes")
    func modeRulesAcrossBranches() async throws {
        let server = try await InProcessServer.launch(config: #"{"features": {"multi_agent_v2": true, "multi_agent_mode": true}}"#)
        let client = try await server.client()
        let id = try #require(try await client.startThread(Wire.ThreadStartParams(multiAgentMode: .proactive)).thread?.id)
        let first = try await client.runTurn(id, "one")
        #expect(modeFragments(first.lastContext) == ["proactive"])
        let second = try await client.runTurn(id, "two", mode: .multiAgentMode(.explicitRequestOnly))
        #expect(modeFragments(second.lastContext) == ["proactive", "explicitRequestOnly"])

        // Branched after the first turn: the baseline is that turn's proactive;
        // the fork's selection (explicit, copied) differs, so a fragment is given.
        let firstID = try #require(first.id)
        let fork = try #require(try await forked(client, id, .atTurnId(firstID)).thread?.id)
        let branched = try await client.runTurn(fork, "three")
        #expect(modeFragments(branched.lastContext) == ["proactive", "explicitRequestOnly"])

        // Reverting the second turn makes the first the baseline again.
        let secondID = try #require(second.id)
        _ = try await reverted(client, id, .beforeTurnId(secondID))
        let again = try await client.runTurn(id, "four", mode: .multiAgentMode(.proactive))
        #expect(modeFragments(again.lastContext) == ["proactive"], "proactive as the baseline: no new fragment")
    }

    @Test("thread/delete takes a root with its tree: subscribers hear thread/deleted, every later call is NOT_FOUND, a reader racing it sees all or nothing; a child or a running tree is refused unless force",
          arguments: Store.allCases)
    func deleteATree(_ store: Store) async throws {
        let server = try await store.launch()
        let client = try await server.client()
        let watcher = try await server.client()
        let inbox = Inbox(watcher)
        let root = try #require(try await client.startThread(Wire.ThreadStartParams(config: Self.v2)).thread?.id)
        try await client.runTurn(root, "hello")
        let child = try #require(try await client.spawn(root, message: "work").thread?.id)
        _ = try await client.waitForThread(child) { $0.turns.last.map { $0.status != .inProgress } ?? false }
        _ = try await watcher.resume(root)
        func delete(_ id: String, force: Bool? = nil) async throws -> [String] {
            guard case let .threadDelete(result) = try await client.result(.threadDelete(Wire.ThreadDeleteParams(threadId: id, force: force))) else {
                throw UnexpectedResult(expected: "thread/delete")
            }
            return result.threadIds
        }
        await expectStatus(9, mentioning: "child agent") { _ = try await delete(child) }
        let held = try await client.startTurn(root, "#hold")
        await expectStatus(9, mentioning: "is running") { _ = try await delete(root) }

        // A reader races the deletion: each read is the whole tree or NOT_FOUND.
        let reader = try await server.client()
        let reads = Task { () -> [Bool] in
            var seen: [Bool] = []
            let deadline = ContinuousClock.now + .seconds(20)
            while ContinuousClock.now < deadline {
                let response = try await reader.call(.threadRead(Wire.ThreadReadParams(threadId: root, includeTurns: true)))
                if response.code == 5 { seen.append(false); break }
                guard case let .threadRead(read)? = response.result else { throw UnexpectedResult(expected: "thread/read") }
                #expect(read.thread?.turns.count == 2, "a read before the deletion sees the whole thread")
                seen.append(true)
            }
            return seen
        }
        #expect(try await delete(root, force: true) == [root, child])
        #expect(try await reads.value.last == false, "reads end in NOT_FOUND")
        _ = held
        try await inbox.waitFor("thread/deleted") { if case let .threadDeleted(n) = $0 { n.threadId == root } else { false } }
        for id in [root, child] {
            await expectStatus(5, mentioning: "not found") { _ = try await client.read(id) }
        }
        await expectStatus(5, mentioning: "not found") { _ = try await client.resume(root) }
        await expectStatus(5, mentioning: "not found") { _ = try await delete(root) }
        guard case let .threadList(listed) = try await client.result(.threadList(Wire.ThreadListParams(limit: 100))) else {
            throw UnexpectedResult(expected: "thread/list")
        }
        #expect(!listed.data.contains { $0.id == root || $0.id == child })
    }
}
