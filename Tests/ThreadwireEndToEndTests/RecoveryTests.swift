import Foundation
import Testing
import ThreadwireServerTesting
import ThreadwireClient
import ThreadwireWire

/// Crash recovery and durable agent trees, against the real server binary:
/// kill -9 and SIGTERM in the middle of turns and of running children.
@Suite("crash recovery and durable agent trees (real server)", .timeLimit(.minutes(3)))
struct RecoveryTests {
    static let v2: [Wire.KeyValue] = [Wire.KeyValue(key: "features.multi_agent_v2", value: "true")]

    /// The JSON output of the turn's first tool call named `tool`.
    func toolOutput(_ turn: Wire.Turn, _ tool: String) throws -> [String: Any] {
        let text = try #require(turn.items.first { $0.toolName == tool }?.toolOutput, "no \(tool) call in the turn")
        return try #require(try JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any], "not JSON: \(text)")
    }

    @Test("kill -9 during a running turn: after restart it is INTERRUPTED with its marker and reason, and turn/start works")
    func killDuringTurn() async throws {
        let server = try await ServerProcess.launch()
        let client = try await server.client()
        let thread = try #require(try await client.startThread().thread?.id)
        try await client.runTurn(thread, "first")
        let held = try await client.startTurn(thread, "#hold")
        await server.kill9()
        try await server.start()
        let after = try await server.client()
        let stored = try #require(try await after.read(thread).thread)
        #expect(stored.status?.type != .active, "no thread is ACTIVE with a turn nobody runs")
        let turn = try #require(stored.turns.first { $0.id == held })
        #expect(turn.status == .interrupted)
        #expect(turn.error?.contains("server stopped") == true, "reason recorded: \(turn.error ?? "none")")
        let next = try await after.runTurn(thread, "after the crash")
        #expect(next.status == .completed)
        let context = next.lastContext
        let marker = try #require(context.lastIndex { $0.kind == .interruptionMarker }, "the v1 marker is in the history")
        #expect(context[marker].text?.contains("turn_aborted") == true)
        #expect(context.filter { $0.kind == .userInput }.compactMap(\.text) == ["first", "#hold", "after the crash"], "history append-only")
    }

    @Test("SIGTERM during a running turn: after the grace period it is interrupted and recorded; the next process recovers nothing")
    func sigtermDuringTurn() async throws {
        let server = try await ServerProcess.launch(arguments: ["--turn-grace-seconds", "0.2"])
        let client = try await server.client()
        let thread = try #require(try await client.startThread().thread?.id)
        let held = try await client.startTurn(thread, "#hold")
        #expect(await server.stop() == 0, "graceful exit")
        try await server.start()
        let stored = try #require(try await server.client().read(thread).thread)
        let turn = try #require(stored.turns.first { $0.id == held })
        #expect(turn.status == .interrupted)
        #expect(turn.error?.contains("shut down") == true, "reason: \(turn.error ?? "none")")
    }

    @Test("kill -9 with running children (v2): children are recovered, the parent hears through its mailbox, list_agents, wait_agent and caps work")
    func killDuringChildren() async throws {
        let server = try await ServerProcess.launch()
        let client = try await server.client()
        let parent = try #require(try await client.startThread(Wire.ThreadStartParams(config: Self.v2)).thread?.id)
        try await client.runTurn(parent, "hi")
        let first = try #require(try await client.spawn(parent, message: "#hold").thread?.id)
        let second = try #require(try await client.spawn(parent, message: "quick work").thread?.id)
        let third = try #require(try await client.spawn(parent, message: "#hold").thread?.id)
        _ = try await client.waitForThread(second) { $0.turns.last?.status == .completed }
        await server.kill9()
        try await server.start()
        let after = try await server.client()
        for child in [first, third] {
            let stored = try #require(try await after.read(child).thread)
            #expect(stored.turns.last?.status == .interrupted && stored.status?.type != .active)
        }
        await expectStatus(8, mentioning: "agent limit reached") { _ = try await after.spawn(parent) }

        let turn = try await after.runTurn(parent, "#tool list_agents {}\n#tool wait_agent {\"timeout_ms\": 60000}")
        let agents = try #require(try toolOutput(turn, "list_agents")["agents"] as? [[String: String]])
        #expect(Dictionary(uniqueKeysWithValues: agents.map { ($0["thread_id"] ?? "", $0["status"] ?? "") })
                == [first: "interrupted", second: "completed", third: "interrupted"])
        let waited = try toolOutput(turn, "wait_agent")
        #expect(waited["timed_out"] as? Bool == false, "every child already has a final status")
        #expect((waited["messages"] as? [String: String])?["/root/task2"] == "echo: quick work")
        let reports = turn.lastContext.of(.mailbox).compactMap(\.text)
        #expect(reports.filter { $0.contains("\"status\":\"interrupted\"") }.count == 2, "mailbox: \(reports)")
        #expect(reports.contains { $0.contains("\"status\":\"completed\"") })

        // Closing a child frees its slot, durably.
        let closed = try await after.runTurn(parent, "#tool close_agent {\"target\": \"task1\"}")
        #expect(try toolOutput(closed, "close_agent")["status"] as? String == "shutdown")
        await server.kill9()
        try await server.start()
        let third2 = try await server.client()
        _ = try await third2.spawn(parent)
        await expectStatus(8, mentioning: "agent limit reached") { _ = try await third2.spawn(parent) }
    }

    @Test("a v2 tree survives a restart: wait_agent returns the final message at once, followup_task reaches the child, which keeps its model")
    func v2TreeAfterRestart() async throws {
        let server = try await InProcessServer.launch()
        let client = try await server.client()
        let parent = try #require(try await client.startThread(Wire.ThreadStartParams(config: Self.v2)).thread?.id)
        try await client.runTurn(parent, "hi")
        let child = try #require(try await client.spawn(parent, message: "write tests", model: "child-model").thread?.id)
        _ = try await client.waitForThread(child) { $0.turns.last?.status == .completed }
        try await server.restart()
        let after = try await server.client()
        let turn = try await after.runTurn(parent, "#tool wait_agent {}\n#tool followup_task {\"target\": \"task1\", \"message\": \"and docs\"}")
        let waited = try toolOutput(turn, "wait_agent")
        #expect(waited["timed_out"] as? Bool == false)
        #expect((waited["status"] as? [String: String])?["/root/task1"] == "completed")
        #expect((waited["messages"] as? [String: String])?["/root/task1"] == "echo: write tests")
        #expect(try toolOutput(turn, "followup_task")["submission_id"] != nil)
        let reloaded = try await after.waitForThread(child) { $0.turns.count == 2 && $0.turns.last?.status == .completed }
        #expect(reloaded.turns.last?.context?.model == "child-model", "a reloaded child keeps its own model")
        #expect(reloaded.turns.last?.context?.multiAgentRuntime == .v2)
    }

    @Test("a v1 tree stays reachable after unsubscribe and idle unload: send_input and wait_agent reach the child")
    func v1TreeAfterUnload() async throws {
        let server = try await InProcessServer.launch(arguments: ["--idle-unload-seconds", "0.2"])
        let client = try await server.client()
        let inbox = Inbox(client)
        let parent = try #require(try await client.startThread().thread?.id)
        try await client.runTurn(parent, "hi")
        let child = try #require(try await client.spawn(parent, message: "first task").thread?.id)
        _ = try await client.waitForThread(child) { $0.turns.last?.status == .completed }
        for id in [parent, child] {
            _ = try await client.result(.threadUnsubscribe(Wire.ThreadUnsubscribeParams(threadId: id)))
        }
        for id in [parent, child] {
            try await inbox.waitFor("thread/closed \(id)") { if case let .threadClosed(n) = $0 { n.threadId == id } else { false } }
        }
        let turn = try await client.runTurn(parent, "#tool send_input {\"target\": \"\(child)\", \"message\": \"second task\"}")
        #expect(try toolOutput(turn, "send_input")["submission_id"] != nil)
        _ = try await client.waitForThread(child) { $0.turns.count == 2 && $0.turns.last?.status == .completed }
        let waited = try await client.runTurn(parent, "#tool wait_agent {}")
        #expect((try toolOutput(waited, "wait_agent")["status"] as? [String: String])?[child] == "completed")
    }

    @Test("v1 close_agent frees a slot and resume_agent takes one back, counted from the stored registry")
    func v1CloseAndResume() async throws {
        let server = try await InProcessServer.launch()
        let client = try await server.client()
        let parent = try #require(try await client.startThread(Wire.ThreadStartParams(
            config: [Wire.KeyValue(key: "agents.max_threads", value: "1")])).thread?.id)
        try await client.runTurn(parent, "hi")
        let first = try #require(try await client.spawn(parent).thread?.id)
        await expectStatus(8, mentioning: "agents.max_threads = 1") { _ = try await client.spawn(parent) }
        _ = try await client.runTurn(parent, "#tool close_agent {\"target\": \"\(first)\"}")
        try await server.restart()
        let after = try await server.client()
        _ = try await after.spawn(parent)
        let resumed = try await after.runTurn(parent, "#tool resume_agent {\"id\": \"\(first)\"}")
        #expect((try toolOutput(resumed, "resume_agent")["error"] as? String)?.contains("agent limit reached") == true)
    }

    @Test("wait_agent honours the timeout it is given, bounded by the configured maximum")
    func waitAgentTimeouts() async throws {
        let server = try await InProcessServer.launch(config: #"{"agents": {"wait_max_ms": 1500}}"#)
        let client = try await server.client()
        let parent = try #require(try await client.startThread(Wire.ThreadStartParams(config: Self.v2)).thread?.id)
        try await client.runTurn(parent, "hi")
        _ = try #require(try await client.spawn(parent, message: "#hold").thread?.id)
        let short = try await client.runTurn(parent, "#tool wait_agent {\"timeout_ms\": 100}")
        #expect(try toolOutput(short, "wait_agent")["timed_out"] as? Bool == true)
        // Ten minutes asked, 1.5 s allowed: the turn ends well within waitForTurn's 10 s.
        let bounded = try await client.runTurn(parent, "#tool wait_agent {\"timeout_ms\": 600000}")
        let output = try toolOutput(bounded, "wait_agent")
        #expect(output["timed_out"] as? Bool == true)
        #expect((output["status"] as? [String: String])?["/root/task1"] == "running")
    }

    @Test("wait_agent wakes when a child's status changes, long before its timeout")
    func waitAgentWakes() async throws {
        let server = try await InProcessServer.launch()  // default timeout 30 s
        let client = try await server.client()
        let parent = try #require(try await client.startThread(Wire.ThreadStartParams(config: Self.v2)).thread?.id)
        try await client.runTurn(parent, "hi")
        let child = try #require(try await client.spawn(parent, message: "#hold").thread?.id)
        let childTurn = try #require(try await client.read(child).thread?.turns.last?.id)
        let waiting = try await client.startTurn(parent, "#tool wait_agent {}")
        // The wait has begun once the turn's model request is stored; the child still holds.
        _ = try await client.waitForThread(parent) { $0.turns.last?.id == waiting && $0.turns.last?.modelRequests.count == 1 }
        #expect(try await client.read(parent).thread?.turns.last?.status == .inProgress)
        _ = try await client.result(.turnInterrupt(Wire.TurnInterruptParams(threadId: child, turnId: childTurn)))
        let woke = try await client.waitForTurn(parent, waiting)
        let output = try toolOutput(woke, "wait_agent")
        #expect(output["timed_out"] as? Bool == false)
        #expect((output["status"] as? [String: String])?["/root/task1"] == "interrupted")
    }
}
