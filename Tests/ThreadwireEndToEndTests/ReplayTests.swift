import Foundation
import Testing
import ThreadwireServerTesting
import ThreadwireClient
import ThreadwireWire

@Suite("capture and replay (real server, real CLI)", .timeLimit(.minutes(2)))
struct ReplayTests {
    @Test("a capture recorded from a session replays at 64 connections with zero errors")
    func recordAndReplay() async throws {
        let capture = NSTemporaryDirectory() + "threadwire-capture-" + UUID().uuidString
        defer { try? FileManager.default.removeItem(atPath: capture) }
        let server = try await ServerProcess.launch(arguments: ["--record", capture, "--admin-listen", "127.0.0.1:0"])
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
        // A graceful stop writes out what the recorder buffered and closes
        // the file; the restarted server records anew, so replay a copy.
        #expect(await server.stop() == 0)
        let recorded = capture + ".recorded"
        defer { try? FileManager.default.removeItem(atPath: recorded) }
        try FileManager.default.copyItem(atPath: capture, toPath: recorded)
        try await server.start()
        let (status, output) = try await runCLI(["replay", "--server", "127.0.0.1:\(server.port)", recorded, "--connections", "64", "-o", "json"])
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
        _ = try await waitUntil("the replayed turns ended", timeout: .seconds(30)) { () -> Bool? in
            let metrics = try await httpGet(port: server.adminPort, path: "/metrics").body
            let line = metrics.split(separator: "\n").first { $0.hasPrefix("threadwire_running_turns ") }
            return line.flatMap { Double($0.split(separator: " ").last ?? "") } == 0 ? true : nil
        }
        #expect(await server.stop() == 0, "the server exits cleanly after the replay's connections came and went")
    }
}
