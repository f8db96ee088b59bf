import Foundation
import Testing
import ThreadwireServerTesting
import ThreadwireClient
import ThreadwireWire
import ThreadwireTesting

/// The turn queue across kill -9: what was acknowledged as queued runs after
/// the restart, in order, once.
@Suite("a thread's turn queue across kill -9 (real server)", .timeLimit(.minutes(3)))
struct QueueRecoveryTests {
    @Test("kill -9 with a running turn and three queued: after the restart the running one is interrupted and the three run in order, once",
          arguments: ["sqlite", "postgres"])
    func queuedTurnsSurviveKill9(_ store: String) async throws {
        // After kill -9 the restarted instance waits for the dead one's lease
        // to lapse, so it is short; but not 2 s: on a loaded machine a
        // renewal then misses its 1.5-s validity now and then, the instance
        // steps down, and a queued turn it was running ends interrupted
        // (as it should), which is not what this test is about.
        let server = try await ServerProcess.launch(arguments: store == "postgres" ? ["--store", try await PostgresCluster.database(), "--lease-seconds", "5"] : [])
        defer { server.stopInBackground() }
        let client = try await server.client()
        let id = try #require(try await client.startThread().thread?.id)
        guard case .turnStart? = try await client.call(.turnStart(Wire.TurnStartParams(
            threadId: id, input: [Wire.UserInput(content: .text("#hold"))]))).result else { throw UnexpectedResult(expected: "turn/start") }
        for n in 1...3 {
            let response = try await client.call(.turnStart(Wire.TurnStartParams(
                threadId: id, input: [Wire.UserInput(content: .text("after \(n)"))], whenBusy: .enqueue)))
            guard case let .turnStart(result)? = response.result, result.queued != nil else { throw UnexpectedResult(expected: "a queued turn") }
        }
        await server.kill9()
        try await server.start()
        let again = try await server.client()
        let turns = try await waitUntil("the queued turns ran", timeout: .seconds(60)) { () -> [Wire.Turn]? in
            do {
                let turns = try await again.read(id, modelRequests: false).thread?.turns ?? []
                return turns.count == 4 && turns.allSatisfy { $0.status != .inProgress } ? turns : nil
            } catch ClientError.status(code: 14, _) {
                // UNAVAILABLE says "retry": with a short lease on a loaded
                // machine a renewal can miss, and the instance steps down
                // until it holds the tree again.
                return nil
            }
        }
        #expect(turns.map { $0.items.first?.text } == ["#hold", "after 1", "after 2", "after 3"])
        #expect(turns.map(\.status) == [.interrupted, .completed, .completed, .completed],
                "the server's lease events: \(server.stderrLines(containing: "lease", "stepping down"))")
        guard case let .threadQueueList(queue) = try await again.result(.threadQueueList(Wire.ThreadQueueListParams(threadId: id))) else {
            throw UnexpectedResult(expected: "thread/queue/list")
        }
        #expect(queue.data.isEmpty)
        // Nothing runs twice: a second restart starts nothing more.
        await server.kill9()
        try await server.start()
        let third = try await server.client()
        try await Task.sleep(for: .milliseconds(500))
        #expect(try await third.read(id, modelRequests: false).thread?.turns.count == 4)
    }
}
