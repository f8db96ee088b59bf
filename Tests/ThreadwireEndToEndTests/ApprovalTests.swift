import Foundation
import Synchronization
import Testing
import ThreadwireServerTesting
import ThreadwireClient
import ThreadwireWire

/// Approvals (`item/tool/request_approval`) and user input
/// (`item/tool/request_user_input`) on the real server with the scripted
/// model (`#tool NAME {json}` makes the model call a tool).
@Suite("approvals and user input", .timeLimit(.minutes(3)))
struct ApprovalTests {
    static let grep = Wire.ToolSpec(
        name: "grep", description: "Searches the workspace.",
        parametersJsonSchema: #"{"type":"object","properties":{"pattern":{"type":"string"}}}"#, requiresApproval: true)

    static func startParams(_ policy: Wire.ApprovalPolicy?, userInput: Bool? = nil, config: [Wire.KeyValue] = []) -> Wire.ThreadStartParams {
        var params = ClientToolTests.startParams([ClientToolTests.readFile, grep], config: config)
        params.approvalPolicy = policy
        params.userInput = userInput
        return params
    }

    static func approval(_ request: Wire.ServerRequest, _ decision: Wire.ApprovalDecision, reason: String? = nil) -> Wire.ServerRequestAnswer {
        Wire.ServerRequestAnswer(id: request.id, code: 0, result: .itemToolRequestApproval(Wire.ApprovalResult(decision: decision, reason: reason)))
    }

    static func toolOutput(_ request: Wire.ServerRequest, _ output: String) -> Wire.ServerRequestAnswer {
        Wire.ServerRequestAnswer(id: request.id, code: 0, result: .itemToolCall(Wire.ToolCallResult(output: output)))
    }

    @Test("on_request: only a tool marked as needing approval waits for one; approved, the client runs it; the policy is reported")
    func onRequestApproved() async throws {
        let server = try await InProcessServer.launch()
        let ide = try await server.askingClient()
        let inbox = Inbox(ide)
        let started = try await ide.startThread(Self.startParams(.onRequest))
        #expect(started.approvalPolicy == .onRequest, "thread/start reports the policy")
        #expect(started.settings?.approvalPolicy == .onRequest)
        let id = try #require(started.thread?.id)

        // read_file needs no approval: straight to item/tool/call.
        let plain = try await ide.startTurn(id, "#tool read_file {\"path\":\"a\"}")
        let call = try await ide.nextServerRequest()
        guard case .itemToolCall? = call.params else { Issue.record("read_file asked for an approval: \(call)"); return }
        try await ide.answer(Self.toolOutput(call, "A"))
        #expect(try await ide.waitForTurn(id, plain).status == .completed)

        let turnID = try await ide.startTurn(id, "#tool grep {\"pattern\":\"TODO\"}")
        let ask = try await ide.nextServerRequest()
        guard case let .itemToolRequestApproval(params)? = ask.params else { Issue.record("no approval asked: \(ask)"); return }
        #expect(params.tool == "grep")
        #expect(params.arguments == #"{"pattern":"TODO"}"#)
        #expect(params.source == .client)
        #expect(ask.threadId == id && ask.rootThreadId == id && ask.turnId == turnID)
        try await inbox.waitFor("thread/status/changed waiting on an approval") {
            if case let .threadStatusChanged(n) = $0 { n.status?.activeFlags == [.waitingOnApproval] } else { false }
        }
        let waiting = try #require(try await ide.read(id).thread?.turns.last)
        #expect(waiting.pendingRequests.map(\.id) == [ask.id], "the approval is stored with the turn")
        #expect(waiting.items.last?.status == .inProgress)

        try await ide.answer(Self.approval(ask, .approve))
        let run = try await ide.nextServerRequest()
        guard case let .itemToolCall(runParams)? = run.params else { Issue.record("approved, but not run: \(run)"); return }
        #expect(runParams.itemId == params.itemId, "the same item: approved, then run")
        try await ide.answer(Self.toolOutput(run, "3 matches"))
        let turn = try await ide.waitForTurn(id, turnID)
        #expect(turn.status == .completed)
        let item = try #require(turn.items.first { $0.type == .toolCall })
        #expect(item.status == .completed && item.toolOutput == "3 matches")
        try await inbox.waitFor("server_request/resolved ANSWERED for the approval") {
            if case let .serverRequestResolved(n) = $0 { n.requestId == ask.id && n.outcome == .answered } else { false }
        }

        // turn/start changes the policy for this and later turns; thread/settings/update too.
        let never = try await ide.startTurn(id, "#tool grep {}", approvalPolicy: .never)
        let direct = try await ide.nextServerRequest()
        guard case .itemToolCall? = direct.params else { Issue.record("NEVER still asked: \(direct)"); return }
        try await ide.answer(Self.toolOutput(direct, "0 matches"))
        #expect(try await ide.waitForTurn(id, never).status == .completed)
        #expect(try await ide.read(id).settings?.approvalPolicy == .never)
        let update = try await ide.updateSettings(Wire.ThreadSettingsUpdateParams(threadId: id, approvalPolicy: .always))
        #expect(update.settings?.approvalPolicy == .always && update.changed == true)
        _ = try await ide.startTurn(id, "#tool read_file {\"path\":\"b\"}")
        guard case .itemToolRequestApproval? = try await ide.nextServerRequest().params else {
            Issue.record("ALWAYS did not ask for read_file"); return
        }
        try await server.restart()
        let again = try await server.client()
        #expect(try await again.resume(id).approvalPolicy == .always, "the policy is stored with the thread")
    }

    @Test("decline: the tool never runs, the model reads the reason; cancel: the turn is interrupted")
    func declineAndCancel() async throws {
        let server = try await InProcessServer.launch()
        let ide = try await server.askingClient()
        let id = try #require(try await ide.startThread(Self.startParams(.always)).thread?.id)

        let declined = try await ide.startTurn(id, "#tool grep {\"pattern\":\"x\"}")
        let ask = try await ide.nextServerRequest()
        try await ide.answer(Self.approval(ask, .decline, reason: "not in this repository"))
        let turn = try await ide.waitForTurn(id, declined)
        #expect(turn.status == .completed, "the turn goes on after a decline")
        let item = try #require(turn.items.first { $0.type == .toolCall })
        #expect(item.status == .declined)
        #expect(turn.lastContext.contains { $0.kind == .toolOutput && ($0.text ?? "").contains("not in this repository") },
                "the model reads the reason")

        let cancelled = try await ide.startTurn(id, "#tool grep {\"pattern\":\"y\"}\nafter")
        let second = try await ide.nextServerRequest()
        try await ide.answer(Self.approval(second, .cancel))
        let ended = try await ide.waitForTurn(id, cancelled)
        #expect(ended.status == .interrupted)
        #expect(ended.items.first { $0.type == .toolCall }?.status == .declined)
        #expect(ended.modelRequests.count == 1, "the model is not called again after a cancel")
        #expect(try await ide.read(id).thread?.status?.type == .idle)
        // Last: it ends this connection's stream of server requests.
        #expect(await ide.hasNoServerRequest(), "a declined or cancelled tool is never sent to a client")
    }

    @Test("a child's approval reaches the root's client naming the child, its task path and the root; approve-for-tree stops asking")
    func childApprovalGoesToRoot() async throws {
        let server = try await InProcessServer.launch()
        // The spawner answers nothing; the IDE subscribes to the root only.
        let spawner = try await server.client()
        let ide = try await server.askingClient()
        var params = Self.startParams(.onRequest)
        params.config = [Wire.KeyValue(key: "features.multi_agent_v2", value: "true")]
        let root = try #require(try await spawner.startThread(params).thread?.id)
        _ = try await spawner.runTurn(root, "hello")
        let child = try #require(try await spawner.spawn(root, message: "#tool grep {\"pattern\":\"bug\"}").thread)
        let childID = try #require(child.id)
        #expect(try await spawner.read(childID).settings?.approvalPolicy == .onRequest, "the child has its root's policy")

        // Subscribing to the root offers what the tree waits for.
        _ = try await ide.resume(root)
        let ask = try await ide.nextServerRequest()
        guard case let .itemToolRequestApproval(params)? = ask.params else { Issue.record("no approval: \(ask)"); return }
        #expect(ask.threadId == childID, "names the child")
        #expect(ask.rootThreadId == root, "names the root")
        #expect(ask.taskPath == child.source?.taskName && ask.taskPath?.hasPrefix("/root/") == true, "names the task path: \(ask.taskPath ?? "none")")
        #expect(params.tool == "grep")
        #expect(await spawner.hasNoServerRequest(), "a connection without the capability is never asked")

        try await ide.answer(Self.approval(ask, .approveForTree))
        let run = try await ide.nextServerRequest()
        guard case .itemToolCall? = run.params else { Issue.record("approved, not run: \(run)"); return }
        #expect(run.threadId == childID)
        try await ide.answer(Self.toolOutput(run, "found"))
        let childTurn = try await waitUntil("the child's turn completes") {
            try await spawner.read(childID).thread?.turns.last.flatMap { $0.status == .completed ? $0 : nil }
        }
        #expect(childTurn.items.first { $0.type == .toolCall }?.toolOutput == "found")

        // Approved for the tree: the root's own call of grep is not asked again.
        let rootTurn = try await ide.startTurn(root, "#tool grep {\"pattern\":\"again\"}")
        let direct = try await ide.nextServerRequest()
        guard case .itemToolCall? = direct.params else { Issue.record("asked again after approve-for-tree: \(direct)"); return }
        try await ide.answer(Self.toolOutput(direct, "ok"))
        #expect(try await ide.waitForTurn(root, rootTurn).status == .completed)
    }

    @Test("request_user_input: offered only when enabled, the question and choices reach the client, the answer reaches the model")
    func userInput() async throws {
        let server = try await InProcessServer.launch()
        let ide = try await server.askingClient()
        let plain = try #require(try await ide.startThread(Self.startParams(nil)).thread?.id)
        #expect(try await ide.runTurn(plain, "hi").lastTools.contains("request_user_input") == false)

        let started = try await ide.startThread(Self.startParams(nil, userInput: true))
        #expect(started.settings?.userInput == true)
        let id = try #require(started.thread?.id)
        let turnID = try await ide.startTurn(id, #"#tool request_user_input {"question":"Which branch?","choices":["main","dev"]}"#)
        let ask = try await ide.nextServerRequest()
        guard case let .itemToolRequestUserInput(question)? = ask.params else { Issue.record("not a question: \(ask)"); return }
        #expect(question.question == "Which branch?")
        #expect(question.choices == ["main", "dev"])
        #expect(try await ide.read(id).thread?.status?.activeFlags == [.waitingOnUserInput])

        // An answer of another method is refused and the question still waits.
        let inbox = Inbox(ide)
        try await ide.answer(Self.toolOutput(ask, "nope"))
        try await inbox.waitFor("the mismatched answer refused, still PENDING") {
            if case let .serverRequestResolved(n) = $0 { n.requestId == ask.id && n.outcome == .pending && n.answerRefused != nil } else { false }
        }
        try await ide.answer(Wire.ServerRequestAnswer(id: ask.id, code: 0, result: .itemToolRequestUserInput(Wire.UserInputResult(answer: "dev"))))
        let turn = try await ide.waitForTurn(id, turnID)
        let item = try #require(turn.items.first { $0.type == .toolCall })
        #expect(item.toolSource == .builtin && item.status == .completed)
        #expect(turn.lastContext.contains { $0.kind == .toolOutput && $0.text == #"{"answer":"dev"}"# })
    }

    @Test("an approval nobody answers times out: the tool does not run and the model reads why")
    func approvalTimesOut() async throws {
        let server = try await InProcessServer.launch()
        let ide = try await server.askingClient()
        let id = try #require(try await ide.startThread(Self.startParams(
            .always, config: [Wire.KeyValue(key: "tools.client_request_timeout_ms", value: "300")])).thread?.id)
        let turnID = try await ide.startTurn(id, "#tool read_file {\"path\":\"late\"}")
        _ = try await ide.nextServerRequest()
        let turn = try await ide.waitForTurn(id, turnID)
        #expect(turn.status == .completed)
        #expect(turn.items.first { $0.type == .toolCall }?.status == .timedOut)
        #expect(turn.lastContext.contains { $0.kind == .toolOutput && ($0.text ?? "").contains("no client approved it") })
    }
}

@Suite("approvals across restarts", .timeLimit(.minutes(3)))
struct ApprovalRestartTests {
    @Test("kill -9 or SIGTERM while a turn waits on an approval: after restart the same request is offered, approved, run, and the turn completes",
          arguments: ["kill -9", "SIGTERM"])
    func survivesRestart(_ how: String) async throws {
        let server = try await ServerProcess.launch(arguments: ["--turn-grace-seconds", "30"])
        let ide = try await server.askingClient()
        let id = try #require(try await ide.startThread(ApprovalTests.startParams(.always)).thread?.id)
        let turnID = try await ide.startTurn(id, "#tool read_file {\"path\":\"k\"}")
        let ask = try await ide.nextServerRequest()
        if how == "kill -9" {
            await server.kill9()
        } else {
            let stopping = ContinuousClock.now
            #expect(await server.stop() == 0)
            #expect(ContinuousClock.now - stopping < .seconds(20), "a turn waiting on an approval does not hold the shutdown")
        }
        try await server.start()

        let observer = try await server.client()
        let waiting = try #require(try await observer.read(id).thread)
        #expect(waiting.status?.activeFlags == [.waitingOnApproval], "still waiting on the approval, not interrupted")
        #expect(waiting.turns.last?.pendingRequests.map(\.id) == [ask.id])

        let ide2 = try await server.askingClient()
        _ = try await ide2.resume(id)
        let again = try await ide2.nextServerRequest()
        #expect(again.id == ask.id, "the same approval request")
        try await ide2.answer(ApprovalTests.approval(again, .approve))
        let run = try await ide2.nextServerRequest()
        guard case .itemToolCall? = run.params else { Issue.record("approved, not run: \(run)"); return }
        try await ide2.answer(ApprovalTests.toolOutput(run, "after restart"))
        let turn = try await ide2.waitForTurn(id, turnID)
        #expect(turn.status == .completed)
        #expect(turn.items.first { $0.type == .toolCall }?.toolOutput == "after restart")
    }
}

extension InProcessServer {
    /// A client that answers every kind of server request.
    func askingClient() async throws -> ThreadwireClient {
        let client = try await self.client(initialize: false)
        try await client.initialize(name: "ide", authToken: token, clientTools: true, approvals: true, userInput: true)
        return client
    }
}

extension ServerProcess {
    func askingClient() async throws -> ThreadwireClient {
        let client = try await self.client(initialize: false)
        try await client.initialize(name: "ide", authToken: token, clientTools: true, approvals: true, userInput: true)
        return client
    }
}

/// The CLI answering server requests: `turn start --approve/--client-tool`
/// and `watch` (an operator answering a request that waited).
@Suite("CLI answers server requests", .timeLimit(.minutes(3)))
struct CLIServerRequestTests {
    static var cli: String { URL(fileURLWithPath: ServerProcess.binary).deletingLastPathComponent().appendingPathComponent("threadwire").path }
    static let echoArgs = Wire.ToolSpec(name: "echo_args", description: "Echoes its arguments.", parametersJsonSchema: #"{"type":"object"}"#)

    func thread(_ client: ThreadwireClient) async throws -> String {
        var params = Wire.ThreadStartParams(approvalPolicy: .always)
        params.clientTools = [Self.echoArgs]
        return try #require(try await client.startThread(params).thread?.id)
    }

    @Test("turn start --approve yes --client-tool NAME=COMMAND approves the call and serves it from a local command")
    func turnStartServes() async throws {
        let server = try await ServerProcess.launch()
        let client = try await server.client()
        let id = try await thread(client)
        let (status, stdout, stderr) = try await runBinary(Self.cli, [
            "turn", "start", "--server", "127.0.0.1:\(server.port)", id, #"#tool echo_args {"x":1}"#,
            "--approve", "yes", "--client-tool", "echo_args=cat",
        ])
        #expect(status == 0, "\(stderr)")
        #expect(stdout.contains("turn_completed"), "the notifications up to the end of the turn")
        let turn = try #require(try await client.read(id).thread?.turns.last)
        #expect(turn.status == .completed)
        let item = try #require(turn.items.first { $0.type == .toolCall })
        #expect(item.status == .completed && item.toolOutput == #"{"x":1}"#, "the command read the arguments on stdin: \(item.toolOutput ?? "")")
    }

    @Test("watch --approve no answers an approval that waited for a client, and the turn goes on")
    func watchAnswersWhatWaited() async throws {
        let server = try await ServerProcess.launch()
        let client = try await server.client()
        let id = try await thread(client)
        let turnID = try await client.startTurn(id, #"#tool echo_args {"y":2}"#)
        try await waitUntil("the turn waits on an approval") {
            try await client.read(id).thread?.status?.activeFlags == [.waitingOnApproval] ? true : nil
        }
        let watch = Process()
        watch.executableURL = URL(fileURLWithPath: Self.cli)
        watch.arguments = ["watch", "--server", "127.0.0.1:\(server.port)", id, "--approve", "no"]
        watch.standardOutput = FileHandle.nullDevice
        try watch.run()
        defer { watch.terminate() }
        let turn = try await client.waitForTurn(id, turnID, timeout: .seconds(30))
        #expect(turn.status == .completed)
        let item = try #require(turn.items.first { $0.type == .toolCall })
        #expect(item.status == .declined)
        #expect(item.toolOutput?.contains("--approve no") == true, "\(item.toolOutput ?? "")")
    }
}
