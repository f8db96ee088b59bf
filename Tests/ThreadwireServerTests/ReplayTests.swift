import Foundation
import Testing
import ThreadwireClient
import ThreadwireWire

@Suite("capture and replay (real server, real CLI)", .timeLimit(.minutes(2)))
struct ReplayTests {
    @Test("a capture recorded from a session replays at 64 connections with zero errors")
    func recordAndReplay() async throws {
        let capture = NSTemporaryDirectory() + "threadwire-capture-" + UUID().uuidString
        defer { try? FileManager.default.removeItem(atPath: capture) }
        let server = try await ServerProcess.launch(arguments: ["--record", capture])
        for _ in 0..<2 {
            let client = try await server.client()
            let thread = try #require(try await client.startThread(Wire.ThreadStartParams(multiAgentMode: .proactive)).thread?.id)
            try await client.runTurn(thread, "hello")
            _ = try await client.updateSettings(Wire.ThreadSettingsUpdateParams(threadId: thread, model: "m2"))
            let fork = try #require(try await client.fork(thread).thread?.id)
            try await client.runTurn(fork, "in the fork")
            _ = try await client.spawn(thread, message: "child")
            _ = try await client.read(fork)
            await client.close()
        }
        try await Task.sleep(for: .milliseconds(200))  // the recorder writes its buffer every 20 ms
        let (status, output) = try await runCLI(["replay", "--server", "127.0.0.1:\(server.port)", capture, "--connections", "64", "--json"])
        let report = try JSONValue.parse(output)
        #expect(status == 0)
        #expect(report["errors"] == .int(0))
        // 64 connections x at least 8 recorded requests per session (initialize is
        // not replayed; the turn waits add thread/read polls).
        guard case let .int(requests)? = report["requests"] else { Issue.record("no request count"); return }
        #expect(requests >= 64 * 8)
        // Replayed turns still run while their 64 connections close: notifying
        // a connection whose peer is gone once crashed the server here (a write
        // on the event loop closed the channel under the connection's lock).
        try await Task.sleep(for: .milliseconds(500))
        #expect(await server.stop() == 0, "the server exits cleanly after the replay's connections came and went")
    }
}
