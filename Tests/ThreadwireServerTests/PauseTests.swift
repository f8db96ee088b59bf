import Foundation
import Testing
import ThreadwireServerTesting
import ThreadwireClient
import ThreadwireWire

/// A thread's pause_after_tools and turn/continue, over the real protocol
/// against the in-process server and its SQLite store.
@Suite("pausing a turn after its tools (real server)", .timeLimit(.minutes(3)))
struct PauseTests {
    /// One tool call (a tool the thread does not have: its output is an
    /// error, which is still a batch of tool calls), then the echo.
    static let oneToolBatch = "#tool nope {}\nplease"

    static func paused(_ client: ThreadwireClient, _ id: String, _ turnID: String) async throws -> Wire.Turn {
        try await waitUntil("turn \(turnID) paused after its tools") { () -> Wire.Turn? in
            let thread = try await client.read(id).thread
            guard thread?.status?.activeFlags == [.pausedAfterTools],
                  let turn = thread?.turns.first(where: { $0.id == turnID }), turn.pausedAfterTools == true else { return nil }
            return turn
        }
    }

    static func continueTurn(_ client: ThreadwireClient, _ id: String, _ turnID: String?) async throws {
        guard case .turnContinue = try await client.result(.turnContinue(Wire.TurnContinueParams(threadId: id, turnId: turnID))) else {
            throw UnexpectedResult(expected: "turn/continue")
        }
    }

    static func outcome(_ body: () async throws -> Void) async -> Result<Void, any Error> {
        do { try await body(); return .success(()) } catch { return .failure(error) }
    }

    @Test("pause_after_tools: the turn pauses after its tool batch with no further model request, reports PAUSED_AFTER_TOOLS, and completes after turn/continue")
    func pausesUntilContinued() async throws {
        let server = try await InProcessServer.launch()
        let client = try await server.client()
        let inbox = Inbox(client)
        let started = try await client.startThread(Wire.ThreadStartParams(pauseAfterTools: true))
        let id = try #require(started.thread?.id)
        #expect(started.settings?.pauseAfterTools == true, "thread/start reports the setting")
        let turnID = try await client.startTurn(id, Self.oneToolBatch)
        let paused = try await Self.paused(client, id, turnID)
        #expect(paused.status == .inProgress)
        #expect(paused.modelRequests.count == 1, "only the request that asked for the tool")
        #expect(paused.items.contains { $0.toolName == "nope" && $0.toolOutput != nil }, "the tool ran and its output is there to read")
        // Still paused a while later: nothing but turn/continue moves it.
        try await Task.sleep(for: .milliseconds(300))
        let still = try #require(try await client.read(id).thread?.turns.first { $0.id == turnID })
        #expect(still.pausedAfterTools == true && still.status == .inProgress && still.modelRequests.count == 1)

        try await Self.continueTurn(client, id, turnID)
        let done = try await client.waitForTurn(id, turnID)
        #expect(done.status == .completed)
        #expect(done.pausedAfterTools == nil, "a finished turn is no longer paused")
        #expect(done.modelRequests.count == 2, "one more model request, after the continue")
        #expect(done.items.last?.text == "echo: please")
        let flags = await inbox.all.compactMap { note -> [Wire.ThreadActiveFlag]? in
            guard case let .threadStatusChanged(change)? = note.payload, change.status?.type == .active else { return nil }
            return change.status?.activeFlags
        }
        #expect(flags == [[], [.pausedAfterTools], []], "running, paused, running again: \(flags)")
    }

    @Test("while paused: steered input reaches the model at the continued request; an interrupt ends the paused turn")
    func steerAndInterruptWhilePaused() async throws {
        let server = try await InProcessServer.launch()
        let client = try await server.client()
        let id = try #require(try await client.startThread(Wire.ThreadStartParams(pauseAfterTools: true)).thread?.id)
        let first = try await client.startTurn(id, Self.oneToolBatch)
        _ = try await Self.paused(client, id, first)
        guard case .turnSteer = try await client.result(.turnSteer(Wire.TurnSteerParams(
            threadId: id, expectedTurnId: first, input: [Wire.UserInput(content: .text("and also this"))]))) else {
            throw UnexpectedResult(expected: "turn/steer")
        }
        try await Self.continueTurn(client, id, first)
        let done = try await client.waitForTurn(id, first)
        #expect(done.status == .completed)
        #expect(done.modelRequests.last?.context.last?.text == "and also this", "the steered input is the newest the model saw")

        let second = try await client.startTurn(id, Self.oneToolBatch)
        _ = try await Self.paused(client, id, second)
        _ = try await client.result(.turnInterrupt(Wire.TurnInterruptParams(threadId: id, turnId: second)))
        let interrupted = try await client.waitForTurn(id, second)
        #expect(interrupted.status == .interrupted)
        #expect(interrupted.pausedAfterTools == nil)
        #expect(interrupted.modelRequests.count == 1)
        #expect(try await client.read(id).thread?.status?.type == .idle)
        await expectStatus(9, mentioning: "has ended") { try await Self.continueTurn(client, id, second) }
    }

    @Test("two clients continue the same pause at once: one is answered OK, the other FAILED_PRECONDITION, and the turn makes one more model request")
    func concurrentContinues() async throws {
        let server = try await InProcessServer.launch()
        let owner = try await server.client()
        let id = try #require(try await owner.startThread(Wire.ThreadStartParams(pauseAfterTools: true)).thread?.id)
        let other = try await server.client()
        for round in 1...5 {
            let turnID = try await owner.startTurn(id, Self.oneToolBatch)
            _ = try await Self.paused(owner, id, turnID)
            async let a = Self.outcome { try await Self.continueTurn(owner, id, turnID) }
            async let b = Self.outcome { try await Self.continueTurn(other, id, turnID) }
            let outcomes = await [a, b]
            let succeeded = outcomes.filter { if case .success = $0 { true } else { false } }.count
            #expect(succeeded == 1, "round \(round): exactly one continue is answered OK")
            for case let .failure(error) in outcomes {
                guard case let ClientError.status(code, message) = error else { Issue.record("round \(round): \(error)"); continue }
                // The loser finds the pause gone: continued, or (when it came
                // late enough) the turn already completed.
                #expect(code == 9 && (message.contains("not paused") || message.contains("has ended")), "round \(round): \(code) \(message)")
            }
            let done = try await owner.waitForTurn(id, turnID)
            #expect(done.status == .completed && done.modelRequests.count == 2, "round \(round)")
        }
    }

    @Test("settings: thread/settings/update switches pausing on for the next batch and off again, and reports it; bad continues are refused naming why")
    func settingsAndRefusals() async throws {
        let server = try await InProcessServer.launch()
        let client = try await server.client()
        let inbox = Inbox(client)
        let id = try #require(try await client.startThread().thread?.id)
        // Off by default: a tool batch goes straight on.
        let plain = try await client.runTurn(id, Self.oneToolBatch)
        #expect(plain.status == .completed && plain.modelRequests.count == 2)

        let on = try await client.updateSettings(Wire.ThreadSettingsUpdateParams(threadId: id, pauseAfterTools: true))
        #expect(on.changed == true && on.settings?.pauseAfterTools == true)
        try await inbox.waitFor("thread/settings/updated with pause_after_tools") {
            if case let .threadSettingsUpdated(update) = $0 { update.settings?.pauseAfterTools == true } else { false }
        }
        let turnID = try await client.startTurn(id, Self.oneToolBatch)
        _ = try await Self.paused(client, id, turnID)
        await expectStatus(3, mentioning: "turn_id is required") { try await Self.continueTurn(client, id, nil) }
        await expectStatus(9, mentioning: "not the active turn") { try await Self.continueTurn(client, id, "no-such-turn") }
        await expectStatus(5, mentioning: "not found") { try await Self.continueTurn(client, "no-such-thread", turnID) }
        // Switching it off does not release a turn paused already.
        let off = try await client.updateSettings(Wire.ThreadSettingsUpdateParams(threadId: id, pauseAfterTools: false))
        #expect(off.changed == true && off.settings?.pauseAfterTools == nil, "absent means off")
        try await Task.sleep(for: .milliseconds(200))
        #expect(try await client.read(id).thread?.turns.last?.pausedAfterTools == true)
        try await Self.continueTurn(client, id, turnID)
        #expect(try await client.waitForTurn(id, turnID).status == .completed)
        await expectStatus(9, mentioning: "has ended") { try await Self.continueTurn(client, id, turnID) }

        // A running turn that is not paused cannot be continued.
        let held = try await client.startTurn(id, "#hold")
        await expectStatus(9, mentioning: "not paused") { try await Self.continueTurn(client, id, held) }
        _ = try await client.result(.turnInterrupt(Wire.TurnInterruptParams(threadId: id, turnId: held)))
        let again = try await client.runTurn(id, Self.oneToolBatch)
        #expect(again.modelRequests.count == 2, "off again: no pause")
    }
}
