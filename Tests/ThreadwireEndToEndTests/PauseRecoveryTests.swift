import Foundation
import Testing
import ThreadwireServerTesting
import ThreadwireClient
import ThreadwireWire
import ThreadwireTesting

/// A turn paused after its tools across kill -9: the pause is stored with
/// the turn, like a pending approval, so the restarted server keeps it
/// paused (not interrupted as a turn that was running) until turn/continue.
@Suite("a paused turn across kill -9 (real server)", .timeLimit(.minutes(3)))
struct PauseRecoveryTests {
    @Test("kill -9 while a turn is paused after its tools: after the restart it is still paused, makes no model request, and completes after turn/continue",
          arguments: ["sqlite", "postgres"])
    func pauseSurvivesKill9(_ store: String) async throws {
        // A short lease: after kill -9 the restarted instance waits for the
        // dead one's to lapse. Not 2 s: a renewal on a loaded machine can miss
        // its 1.5-s validity, and the step-down interrupts the continued turn.
        let server = try await ServerProcess.launch(arguments: store == "postgres" ? ["--store", try await PostgresCluster.database(), "--lease-seconds", "5"] : [])
        defer { server.stopInBackground() }
        let client = try await server.client()
        let id = try #require(try await client.startThread(Wire.ThreadStartParams(pauseAfterTools: true)).thread?.id)
        let turnID = try await client.startTurn(id, "#tool nope {}\nafter the restart")
        _ = try await waitUntil("the turn paused") { () -> Bool? in
            try await client.read(id).thread?.turns.last?.pausedAfterTools == true ? true : nil
        }
        await server.kill9()
        try await server.start()
        let again = try await server.client()
        // Recovery at startup has run once the server answers; give a wrongly
        // spawned runner time to make its request.
        try await Task.sleep(for: .milliseconds(500))
        let read = try await again.read(id)
        let turn = try #require(read.thread?.turns.last)
        #expect(turn.id == turnID)
        #expect(turn.status == .inProgress, "not interrupted by recovery")
        #expect(turn.pausedAfterTools == true)
        #expect(turn.modelRequests.count == 1, "no model request while paused")
        #expect(read.thread?.status?.activeFlags == [.pausedAfterTools])
        guard case .turnContinue = try await again.result(.turnContinue(Wire.TurnContinueParams(threadId: id, turnId: turnID))) else {
            throw UnexpectedResult(expected: "turn/continue")
        }
        let done = try await again.waitForTurn(id, turnID)
        #expect(done.status == .completed)
        #expect(done.modelRequests.count == 2)
        #expect(done.items.last?.text == "echo: after the restart")
    }
}
