import Foundation
import Testing
import ThreadwireServerTesting
import ThreadwireClient
import ThreadwireWire

/// The seed PRs' runtime-pinning scenarios (000, 001), over the real protocol
/// against the real server binary and its SQLite store.
@Suite("multi-agent runtime (real server)", .timeLimit(.minutes(3)))
struct RuntimeScenarioTests {
    static let catalog = """
        {"models": [{"slug": "model-v1", "multi_agent_version": "v1"},
                    {"slug": "model-v2", "multi_agent_version": "v2"},
                    {"slug": "model-future", "multi_agent_version": "v9"}]}
        """

    func config(_ key: String, _ value: String) -> Wire.KeyValue { Wire.KeyValue(key: key, value: value) }

    @Test("flag fallback: v2 flag -> v2, collab only -> v1, neither -> disabled")
    func flagFallback() async throws {
        let server = try await InProcessServer.launch()
        let client = try await server.client()
        let cases: [([Wire.KeyValue], Wire.MultiAgentRuntime)] = [
            ([config("features.multi_agent_v2", "true")], .v2),
            ([], .v1),
            ([config("features.multi_agent", "false")], .disabled),
        ]
        for (overrides, expected) in cases {
            let thread = try await client.startThread(Wire.ThreadStartParams(config: overrides))
            #expect(thread.multiAgentRuntime == .unspecified, "unresolved until the first turn")
            let id = try #require(thread.thread?.id)
            let turn = try await client.runTurn(id, "hello")
            #expect(turn.context?.multiAgentRuntime == expected)
            #expect(try await client.read(id).thread?.multiAgentRuntime == expected)
        }
    }

    @Test("server config flags resolve new threads too")
    func serverConfigFlags() async throws {
        let server = try await InProcessServer.launch(config: #"{"features": {"multi_agent_v2": true}}"#)
        let client = try await server.client()
        let id = try #require(try await client.startThread().thread?.id)
        #expect(try await client.runTurn(id, "hi").context?.multiAgentRuntime == .v2)
    }

    @Test("a catalog selector overrides local feature flags; an unknown selector counts as absent")
    func catalogBeatsFlags() async throws {
        let server = try await InProcessServer.launch(config: Self.catalog)
        let client = try await server.client()
        let v1 = try #require(try await client.startThread(Wire.ThreadStartParams(
            model: "model-v1", config: [config("features.multi_agent_v2", "true")])).thread?.id)
        #expect(try await client.runTurn(v1, "hi").context?.multiAgentRuntime == .v1)
        let future = try #require(try await client.startThread(Wire.ThreadStartParams(
            model: "model-future", config: [config("features.multi_agent_v2", "true")])).thread?.id)
        #expect(try await client.runTurn(future, "hi").context?.multiAgentRuntime == .v2)
    }

    @Test("a model switch before the first turn changes which selector applies; after it, nothing changes")
    func modelSwitch() async throws {
        let server = try await InProcessServer.launch(config: Self.catalog)
        let client = try await server.client()
        // Before the first turn: thread/settings/update switches to a v2-selected model.
        let a = try #require(try await client.startThread().thread?.id)
        _ = try await client.updateSettings(Wire.ThreadSettingsUpdateParams(threadId: a, model: "model-v2"))
        #expect(try await client.runTurn(a, "hi").context?.multiAgentRuntime == .v2)
        // A turn/start model override on the first turn also decides.
        let b = try #require(try await client.startThread().thread?.id)
        #expect(try await client.runTurn(b, "hi", model: "model-v2").context?.multiAgentRuntime == .v2)
        // After the first turn the runtime is pinned: switching to a v2 model keeps v1.
        let c = try #require(try await client.startThread().thread?.id)
        #expect(try await client.runTurn(c, "hi").context?.multiAgentRuntime == .v1)
        let switched = try await client.runTurn(c, "again", model: "model-v2")
        #expect(switched.context?.model == "model-v2")
        #expect(switched.context?.multiAgentRuntime == .v1)
        #expect(switched.lastTools.contains("send_input"), "still the v1 tool surface")
    }

    @Test("resume and fork keep the runtime when the server restarts under other flags")
    func resumeAndForkUnderChangedFlags() async throws {
        let server = try await InProcessServer.launch(config: "{}")
        var client = try await server.client()
        let id = try #require(try await client.startThread().thread?.id)
        #expect(try await client.runTurn(id, "hi").context?.multiAgentRuntime == .v1)
        await client.close()

        try server.rewriteConfig(#"{"features": {"multi_agent_v2": true}}"#)
        try await server.restart()
        client = try await server.client()
        let resumed = try await client.resume(id)
        #expect(resumed.multiAgentRuntime == .v1)
        let turn = try await client.runTurn(id, "after restart")
        #expect(turn.context?.multiAgentRuntime == .v1)
        #expect(turn.lastTools.contains("send_input") && !turn.lastTools.contains("send_message"))
        let fork = try await client.fork(id)
        #expect(fork.multiAgentRuntime == .v1)
        #expect(fork.thread?.forkedFromId == id)
        let forkID = try #require(fork.thread?.id)
        #expect(try await client.runTurn(forkID, "in the fork").context?.multiAgentRuntime == .v1)
        // A brand-new thread does follow the new flags.
        let fresh = try #require(try await client.startThread().thread?.id)
        #expect(try await client.runTurn(fresh, "hi").context?.multiAgentRuntime == .v2)
    }

    @Test("a legacy rollout is pinned to v1 on first resume, history and timestamps untouched, and stays pinned")
    func legacyPinning() async throws {
        let server = try await InProcessServer.launch()
        await server.stop()
        let rollout = server.dataDir + "/rollout.jsonl"
        try """
            {"timestamp":"2026-05-01T10:00:00.000Z","type":"session_meta","payload":{"id":"0196a000-0000-7000-8000-00000000abcd","timestamp":"2026-05-01T10:00:00.000Z","cwd":"/repo","originator":"codex_cli_rs","cli_version":"0.40.0","source":"cli","model_provider":"openai"}}
            {"timestamp":"2026-05-01T10:00:01.000Z","type":"turn_context","payload":{"cwd":"/repo","model":"gpt-5","summary":"auto"}}
            {"timestamp":"2026-05-01T10:00:01.500Z","type":"response_item","payload":{"type":"message","role":"user","content":[{"type":"input_text","text":"fix the bug"}]}}
            {"timestamp":"2026-05-01T10:00:05.000Z","type":"response_item","payload":{"type":"message","role":"assistant","content":[{"type":"output_text","text":"done"}]}}
            """.write(toFile: rollout, atomically: true, encoding: .utf8)
        let importer = Process()
        importer.executableURL = URL(fileURLWithPath: ServerProcess.binary.replacingOccurrences(of: "threadwire-server", with: "threadwire"))
        importer.arguments = ["import", "--data-dir", server.dataDir + "/store", rollout]
        importer.standardOutput = Pipe()
        try importer.run()
        await importer.exited()
        #expect(importer.terminationStatus == 0)

        // Restarted under v2 flags: a legacy thread must still come back as v1.
        try server.rewriteConfig(#"{"features": {"multi_agent_v2": true}}"#)
        try await server.start()
        var client = try await server.client()
        let id = "0196a000-0000-7000-8000-00000000abcd"
        let before = try #require(try await client.read(id).thread)
        #expect(before.multiAgentRuntime == .unspecified)
        #expect(before.source?.kind == .imported)

        let resumed = try await client.resume(id)
        #expect(resumed.multiAgentRuntime == .v1)
        let after = try #require(try await client.read(id).thread)
        #expect(after.multiAgentRuntime == .v1)
        #expect(after.createdAt == before.createdAt && after.updatedAt == before.updatedAt, "timestamps preserved")
        #expect(after.turns == before.turns, "history not rewritten")

        await client.close()
        try await server.restart()
        client = try await server.client()
        #expect(try await client.read(id).thread?.multiAgentRuntime == .v1)
        let turn = try await client.runTurn(id, "continue")
        #expect(turn.context?.multiAgentRuntime == .v1)
        // The new turn saw the imported history.
        #expect(turn.lastContext.contains { $0.text == "fix the bug" })
    }

    /// The parent's followup_task gives a v2 child `message`; the child's
    /// turn, once it ended.
    static func parentDrives(_ client: ThreadwireClient, parent: String, child: String, _ message: String) async throws -> Wire.Turn {
        let before = try await client.read(child).thread?.turns.count ?? 0
        try await client.runTurn(parent, #"#tool followup_task {"target": "\#(child)", "message": "\#(message)"}"#)
        let thread = try await client.waitForThread(child) { $0.turns.count == before + 1 && $0.turns.last?.status == .completed }
        return try #require(thread.turns.last)
    }

    @Test("a client gives input to a v1 child, never to a v2 child (its parent does); threads report which")
    func directInput() async throws {
        let server = try await InProcessServer.launch(config: Self.catalog)
        let client = try await server.client()
        let v2 = try #require(try await client.startThread(Wire.ThreadStartParams(model: "model-v2")).thread?.id)
        let v1 = try #require(try await client.startThread(Wire.ThreadStartParams(model: "model-v1")).thread?.id)
        // Absent means true (the field's default): only a V2 child carries it.
        #expect(try await client.read(v2).thread?.canAcceptDirectInput == nil, "a root always does")
        try await client.runTurn(v2, "plan")
        try await client.runTurn(v1, "plan")
        let v2Child = try await client.spawn(v2)
        let v1Child = try await client.spawn(v1)
        #expect(v2Child.thread?.canAcceptDirectInput == false)
        #expect(v1Child.thread?.canAcceptDirectInput == nil)
        let v2ChildID = try #require(v2Child.thread?.id)
        let v1ChildID = try #require(v1Child.thread?.id)
        #expect(try await client.read(v2ChildID).thread?.canAcceptDirectInput == false)
        await expectStatus(9, mentioning: "its turns come from its parent") { _ = try await client.startTurn(v2ChildID, "from a client") }
        await expectStatus(9, mentioning: "its turns come from its parent") {
            _ = try await client.result(.turnStart(Wire.TurnStartParams(
                threadId: v2ChildID, input: [Wire.UserInput(content: .text("queued"))], whenBusy: .enqueue)))
        }
        // Its parent's followup_task still starts its turns, and a client may steer none of them.
        let held = try await client.startTurn(v2, ##"#tool followup_task {"target": "\##(v2ChildID)", "message": "#hold"}"##)
        let running = try await client.waitForThread(v2ChildID) { $0.status?.type == .active }
        await expectStatus(9, mentioning: "its turns come from its parent") {
            _ = try await client.result(.turnSteer(Wire.TurnSteerParams(
                threadId: v2ChildID, expectedTurnId: running.status?.activeTurnId, input: [Wire.UserInput(content: .text("steer"))])))
        }
        // Interrupting it is not input: allowed.
        _ = try await client.result(.turnInterrupt(Wire.TurnInterruptParams(threadId: v2ChildID, turnId: running.status?.activeTurnId)))
        _ = try await client.waitForTurn(v2, held)
        #expect(try await client.read(v2ChildID).thread?.turns.count == 1, "no turn of a client's on the v2 child")
        #expect(try await client.runTurn(v1ChildID, "from a client").status == .completed, "a v1 child takes a client's turn")
    }

    @Test("a child inherits a v2 parent's runtime even when the child's model says v1")
    func childInheritance() async throws {
        let server = try await InProcessServer.launch(config: Self.catalog)
        let client = try await server.client()
        let parent = try #require(try await client.startThread(Wire.ThreadStartParams(model: "model-v2")).thread?.id)
        try await client.runTurn(parent, "plan")
        let child = try await client.spawn(parent, model: "model-v1")
        #expect(child.multiAgentRuntime == .v2)
        #expect(child.thread?.source?.kind == .threadSpawn)
        #expect(child.thread?.source?.depth == 1)
        #expect(child.thread?.parentThreadId == parent)
        let childID = try #require(child.thread?.id)
        // A v2 child's turns come from its parent.
        let turn = try await Self.parentDrives(client, parent: parent, child: childID, "work")
        #expect(turn.context?.multiAgentRuntime == .v2)
        #expect(turn.context?.model == "model-v1")

        // A spawn_agent tool call does the same.
        let script = #"#tool spawn_agent {"task_name": "helper", "message": "go", "model": "model-v1"}"#
        let spawning = try await client.runTurn(parent, script)
        let call = try #require(spawning.items.first { $0.type == .collabToolCall })
        let toolChild = try #require(call.receiverThreadId)
        let toolChildThread = try await client.waitForThread(toolChild) { $0.turns.first?.status == .completed }
        #expect(toolChildThread.multiAgentRuntime == .v2)
        #expect(toolChildThread.source?.taskName == "/root/helper")
    }

    @Test("v1 and v2 tool sets, and the v2-only usage hint")
    func toolsAndHints() async throws {
        let server = try await InProcessServer.launch()
        let client = try await server.client()
        let v1 = try #require(try await client.startThread().thread?.id)
        let v1Turn = try await client.runTurn(v1, "hi")
        #expect(v1Turn.lastTools == ["spawn_agent", "send_input", "wait_agent", "resume_agent", "close_agent"])
        #expect(v1Turn.modelRequests.last?.tools.allSatisfy { $0.toolNamespace == "multi_agent_v1" } == true)
        #expect(v1Turn.lastContext.of(.usageHint).isEmpty)

        let v2 = try #require(try await client.startThread(Wire.ThreadStartParams(
            config: [config("features.multi_agent_v2", "true")])).thread?.id)
        let v2Turn = try await client.runTurn(v2, "hi")
        #expect(v2Turn.lastTools == ["spawn_agent", "send_message", "followup_task", "wait_agent", "list_agents", "close_agent"])
        #expect(v2Turn.lastContext.of(.usageHint).count == 1)
        #expect(v2Turn.lastContext.of(.usageHint).first?.role == .developer)

        let off = try #require(try await client.startThread(Wire.ThreadStartParams(
            config: [config("features.multi_agent", "false")])).thread?.id)
        #expect(try await client.runTurn(off, "hi").lastTools.isEmpty)
    }

    @Test("a parent hears of a child: v1 by a subagent notification message, v2 by a mailbox item")
    func parentNotifications() async throws {
        let server = try await InProcessServer.launch()
        let client = try await server.client()
        for (overrides, kind) in [([Wire.KeyValue](), Wire.ContextKind.subagentNotification),
                                   ([config("features.multi_agent_v2", "true")], .mailbox)] {
            let parent = try #require(try await client.startThread(Wire.ThreadStartParams(config: overrides)).thread?.id)
            try await client.runTurn(parent, "start")
            let child = try #require(try await client.spawn(parent, message: "do the work").thread?.id)
            _ = try await client.waitForThread(child) { $0.turns.first?.status == .completed }
            let next = try await client.runTurn(parent, "what happened?")
            let notes = next.lastContext.of(kind)
            #expect(notes.count == 1, "\(kind)")
            #expect(notes.first?.role == .user)
            #expect(notes.first?.text?.contains("completed") == true)
            let other: Wire.ContextKind = kind == .mailbox ? .subagentNotification : .mailbox
            #expect(next.lastContext.of(other).isEmpty)
            if kind == .subagentNotification {
                #expect(notes.first?.text?.hasPrefix("<subagent_notification>") == true)
            }
        }
    }

    @Test("interruption markers: v1 user-role turn_aborted, v2 developer marker; a second turn/start while active fails")
    func interruptionMarkers() async throws {
        let server = try await InProcessServer.launch()
        let client = try await server.client()
        for (overrides, role) in [([Wire.KeyValue](), Wire.ContextRole.user),
                                   ([config("features.multi_agent_v2", "true")], .developer)] {
            let id = try #require(try await client.startThread(Wire.ThreadStartParams(config: overrides)).thread?.id)
            let turn = try await client.startTurn(id, "#hold")
            await expectStatus(9, mentioning: "active turn") { _ = try await client.startTurn(id, "second") }
            _ = try await client.result(.turnInterrupt(Wire.TurnInterruptParams(threadId: id, turnId: turn)))
            let interrupted = try await client.waitForTurn(id, turn)
            #expect(interrupted.status == .interrupted)
            let next = try await client.runTurn(id, "go on")
            let markers = next.lastContext.of(.interruptionMarker)
            #expect(markers.count == 1)
            #expect(markers.first?.role == role)
            if role == .user { #expect(markers.first?.text?.contains("<turn_aborted>") == true) }
        }
    }

    @Test("forking a thread mid-turn copies the turn as interrupted with its marker")
    func forkMidTurn() async throws {
        let server = try await InProcessServer.launch()
        let client = try await server.client()
        let id = try #require(try await client.startThread().thread?.id)
        try await client.runTurn(id, "first")
        let active = try await client.startTurn(id, "#hold")
        let fork = try await client.fork(id)
        let forkID = try #require(fork.thread?.id)
        let forked = try #require(try await client.read(forkID).thread)
        #expect(forked.turns.count == 2)
        #expect(forked.turns.last?.id == active)
        #expect(forked.turns.last?.status == .interrupted)
        #expect(try await client.read(id).thread?.turns.last?.status == .inProgress, "the source keeps running")
        let next = try await client.runTurn(forkID, "continue")
        #expect(next.lastContext.of(.interruptionMarker).count == 1)
    }

    @Test("concurrency caps: v1 agents.max_threads, v2 max_concurrent_threads_per_session - 1")
    func concurrencyCaps() async throws {
        let server = try await InProcessServer.launch()
        let client = try await server.client()
        let v1 = try #require(try await client.startThread(Wire.ThreadStartParams(
            config: [config("agents.max_threads", "2")])).thread?.id)
        try await client.runTurn(v1, "hi")
        _ = try await client.spawn(v1)
        _ = try await client.spawn(v1)
        await expectStatus(8, mentioning: "agents.max_threads = 2") { _ = try await client.spawn(v1) }

        let v2 = try #require(try await client.startThread(Wire.ThreadStartParams(
            config: [config("features.multi_agent_v2", "true")])).thread?.id)
        try await client.runTurn(v2, "hi")
        for _ in 0..<3 { _ = try await client.spawn(v2) }
        await expectStatus(8, mentioning: "max_concurrent_threads_per_session - 1") { _ = try await client.spawn(v2) }

        // The model sees the same limit as tool output.
        let turn = try await client.runTurn(v2, #"#tool spawn_agent {"task_name": "extra", "message": "x"}"#)
        let output = try #require(turn.items.first { $0.type == .collabToolCall }?.toolOutput)
        #expect(output.contains("agent limit reached"))
    }

    @Test("depth gate: a child cannot spawn under max_depth 1; v1 hides spawn_agent from it")
    func depthGate() async throws {
        let server = try await InProcessServer.launch()
        let client = try await server.client()
        let root = try #require(try await client.startThread().thread?.id)
        try await client.runTurn(root, "hi")
        let child = try #require(try await client.spawn(root).thread?.id)
        let childTurn = try await client.runTurn(child, "hi")
        #expect(!childTurn.lastTools.contains("spawn_agent"))
        #expect(childTurn.lastTools.contains("wait_agent"))
        await expectStatus(9, mentioning: "agents.max_depth = 1") { _ = try await client.spawn(child) }
    }

    @Test("per-thread overrides may lower the server's agent limits, never raise them")
    func overrideCeilings() async throws {
        let server = try await InProcessServer.launch(config: #"{"agents": {"max_depth": 2, "max_threads": 4}}"#)
        let client = try await server.client()
        for (key, value) in [("agents.max_threads", "1000"), ("agents.max_depth", "300"),
                             ("multi_agent_v2.max_concurrent_threads_per_session", "5")] {
            await expectStatus(3, mentioning: "exceeds the server's ceiling") {
                _ = try await client.startThread(Wire.ThreadStartParams(config: [config(key, value)]))
            }
            await expectStatus(3, mentioning: "'\(key)'") {
                _ = try await client.startThread(Wire.ThreadStartParams(config: [config(key, value)]))
            }
        }
        // The server's max_depth 2 lets a child spawn a grandchild ...
        let deep = try #require(try await client.startThread().thread?.id)
        try await client.runTurn(deep, "hi")
        let deepChild = try #require(try await client.spawn(deep).thread?.id)
        try await client.runTurn(deepChild, "hi")
        #expect(try await client.spawn(deepChild).thread?.source?.depth == 2)
        // ... and a thread that lowers it to 1 cannot; lowering max_threads to 1 caps at one child.
        let shallow = try #require(try await client.startThread(Wire.ThreadStartParams(
            config: [config("agents.max_depth", "1"), config("agents.max_threads", "1")])).thread?.id)
        try await client.runTurn(shallow, "hi")
        let only = try #require(try await client.spawn(shallow).thread?.id)
        await expectStatus(8, mentioning: "agents.max_threads = 1") { _ = try await client.spawn(shallow) }
        try await client.runTurn(only, "hi")
        await expectStatus(9, mentioning: "agents.max_depth = 1") { _ = try await client.spawn(only) }
    }

    @Test("review threads are pinned disabled and never see collaboration tools, whatever flags or catalog say")
    func reviewDisabled() async throws {
        let server = try await InProcessServer.launch(config: Self.catalog)
        let client = try await server.client()
        let review = try await client.startThread(Wire.ThreadStartParams(
            model: "model-v2", config: [config("features.multi_agent_v2", "true")], source: .review))
        #expect(review.multiAgentRuntime == .disabled)
        let id = try #require(review.thread?.id)
        let turn = try await client.runTurn(id, #"#tool spawn_agent {"message": "x"}"#)
        #expect(turn.context?.multiAgentRuntime == .disabled)
        #expect(turn.lastTools.isEmpty)
        #expect(turn.items.first { $0.type == .collabToolCall }?.toolOutput?.contains("not available") == true)
        // A review child of a v2 parent is disabled too.
        let parent = try #require(try await client.startThread(Wire.ThreadStartParams(model: "model-v2")).thread?.id)
        try await client.runTurn(parent, "hi")
        #expect(try await client.spawn(parent, review: true).multiAgentRuntime == .disabled)
    }

    @Test("everything survives a restart between any two steps")
    func restartBetweenSteps() async throws {
        let server = try await InProcessServer.launch(config: Self.catalog)
        var client = try await server.client()
        let parent = try #require(try await client.startThread(Wire.ThreadStartParams(model: "model-v2")).thread?.id)
        try await server.restart()
        client = try await server.client()
        #expect(try await client.resume(parent).multiAgentRuntime == .unspecified)
        try await client.runTurn(parent, "hi")
        try await server.restart()
        client = try await server.client()
        let child = try #require(try await client.spawn(parent, model: "model-v1").thread?.id)
        try await server.restart()
        client = try await server.client()
        #expect(try await client.read(child).thread?.multiAgentRuntime == .v2)
        #expect(try await Self.parentDrives(client, parent: parent, child: child, "work").context?.multiAgentRuntime == .v2)
        let fork = try #require(try await client.fork(parent).thread?.id)
        try await server.restart()
        client = try await server.client()
        #expect(try await client.resume(fork).multiAgentRuntime == .v2)
    }
}
