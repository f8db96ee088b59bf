import Foundation
import Synchronization
import Testing
import ThreadwireServerTesting
import ThreadwireClient
import ThreadwireWire

/// Client tools: the server calls a client (`item/tool/call`) while a turn
/// waits, on the real server with the scripted model (`#tool NAME {json}`
/// makes the model call a tool).
@Suite("client tools and server requests", .timeLimit(.minutes(3)))
struct ClientToolTests {
    static let readFile = Wire.ToolSpec(
        name: "read_file", description: "Reads a file of the user's workspace.",
        parametersJsonSchema: #"{"type":"object","properties":{"path":{"type":"string"}},"required":["path"],"additionalProperties":false}"#)

    static func startParams(_ tools: [Wire.ToolSpec] = [readFile], config: [Wire.KeyValue] = []) -> Wire.ThreadStartParams {
        var params = Wire.ThreadStartParams()
        params.clientTools = tools
        params.config = config
        return params
    }

    @Test("a client tool the model calls is run by the client: item, waiting status, output back to the model, resolved")
    func answered() async throws {
        let server = try await InProcessServer.launch()
        let ide = try await server.capableClient()
        let inbox = Inbox(ide)
        let seen = Mutex<[Wire.ServerRequest]>([])
        ide.serveClientTools { request, call in
            seen.withLock { $0.append(request) }
            return Wire.ToolCallResult(output: "contents of \(call.arguments ?? "")")
        }
        let started = try await ide.startThread(Self.startParams())
        #expect(started.clientTools.map(\.name) == ["read_file"], "thread/start reports the client tools")
        let id = try #require(started.thread?.id)
        let turn = try await ide.runTurn(id, "#tool read_file {\"path\":\"a.txt\"}\nsummarise it")
        #expect(turn.status == .completed)
        let item = try #require(turn.items.first { $0.type == .toolCall })
        #expect(item.toolName == "read_file")
        #expect(item.toolSource == .client)
        #expect(item.status == .completed)
        #expect(item.toolOutput == #"contents of {"path":"a.txt"}"#)
        #expect(item.durationMs != nil)
        #expect(turn.pendingRequests.isEmpty)

        let request = try #require(seen.withLock { $0.first })
        #expect(request.threadId == id)
        #expect(request.turnId == turn.id)
        guard case let .itemToolCall(call)? = request.params else { Issue.record("not item/tool/call"); return }
        #expect(call.itemId == item.id)
        #expect(call.tool == "read_file")
        #expect((request.timeoutMs ?? 0) > 0 && (request.deadlineAt ?? 0) > (request.createdAt ?? 0))

        // The model's second request carries the client's output for its call.
        let outputs = turn.lastContext.filter { $0.kind == .toolOutput }
        #expect(outputs.map(\.text) == [#"contents of {"path":"a.txt"}"#])
        #expect(outputs.first?.callId == call.callId)
        #expect(turn.modelRequests.first?.tools.contains { $0.name == "read_file" } == true, "the model was offered the client tool")

        try await inbox.waitFor("thread/status/changed waiting on the client tool") {
            if case let .threadStatusChanged(n) = $0 { n.status?.activeFlags == [.waitingOnClientTool] } else { false }
        }
        try await inbox.waitFor("server_request/resolved ANSWERED") {
            if case let .serverRequestResolved(n) = $0 { n.requestId == request.id && n.outcome == .answered && n.answerRefused == nil } else { false }
        }
        let started_ = await inbox.payloads().contains { if case let .itemStarted(n) = $0 { n.item?.id == item.id && n.item?.status == .inProgress } else { false } }
        #expect(started_, "item/started shows the call in progress")
    }

    @Test("a client's tool output over 1 MiB is refused, naming the field and the limit, and the request stays pending; a shorter answer then completes the turn")
    func oversizedAnswer() async throws {
        let server = try await InProcessServer.launch()
        let ide = try await server.capableClient()
        let inbox = Inbox(ide)
        let requests = Mutex<[Wire.ServerRequest]>([])
        ide.serveClientTools { request, _ in
            requests.withLock { $0.append(request) }
            return Wire.ToolCallResult(output: String(repeating: "x", count: 1_048_577))
        }
        let id = try #require(try await ide.startThread(Self.startParams()).thread?.id)
        let turnID = try await ide.startTurn(id, "#tool read_file {\"path\":\"a.txt\"}\nsummarise it")
        try await inbox.waitFor("the oversized answer refused") {
            if case let .serverRequestResolved(n) = $0 {
                n.outcome == .pending && (n.answerRefused ?? "").contains("answer.item_tool_call.output is 1048577 bytes; the limit is 1048576")
            } else { false }
        }
        let request = try #require(requests.withLock { $0.first })
        try await ide.answer(Wire.ServerRequestAnswer(id: request.id, code: 0, result: .itemToolCall(Wire.ToolCallResult(output: "short"))))
        let turn = try await ide.waitForTurn(id, turnID)
        #expect(turn.status == .completed)
        #expect(turn.items.first { $0.type == .toolCall }?.toolOutput == "short")
    }

    @Test("arguments that do not fit the tool's schema go back to the model; no client is asked")
    func schemaInvalidArguments() async throws {
        let server = try await InProcessServer.launch()
        let ide = try await server.capableClient()
        let asked = Atomic<Int>(0)
        ide.serveClientTools { _, _ in
            asked.add(1, ordering: .relaxed)
            return Wire.ToolCallResult(output: "ran")
        }
        let id = try #require(try await ide.startThread(Self.startParams()).thread?.id)
        let turn = try await ide.runTurn(id, "#tool read_file {\"path\":3}")
        #expect(turn.status == .completed)
        let item = try #require(turn.items.first { $0.type == .toolCall })
        #expect(item.status == .failed)
        #expect(item.toolOutput?.contains("arguments.path must be string") == true, "\(item.toolOutput ?? "")")
        #expect(turn.lastContext.contains { $0.kind == .toolOutput && ($0.text ?? "").contains("must be string") })
        let extra = try await ide.runTurn(id, "#tool read_file {\"path\":\"a\",\"mode\":\"x\"}")
        #expect(extra.items.first { $0.type == .toolCall }?.toolOutput?.contains("has no property 'mode'") == true)
        #expect(asked.load(ordering: .relaxed) == 0, "no client was asked")
    }

    @Test("client tools are validated, replaced by thread/tools/update, and kept by fork, resume and children")
    func toolsValidatedAndKept() async throws {
        let server = try await InProcessServer.launch()
        let client = try await server.client()
        func refused(_ tools: [Wire.ToolSpec], mentioning: String) async {
            await expectStatus(3, mentioning: mentioning) { _ = try await client.startThread(Self.startParams(tools)) }
        }
        await refused([Self.readFile, Self.readFile], mentioning: "appears twice")
        await refused([Wire.ToolSpec(name: "spawn_agent", parametersJsonSchema: #"{"type":"object"}"#)], mentioning: "built-in tool")
        await refused([Wire.ToolSpec(name: "bad name!", parametersJsonSchema: #"{"type":"object"}"#)], mentioning: "client_tools[0].name")
        await refused([Wire.ToolSpec(name: "t", parametersJsonSchema: #"{"type":"string"}"#)], mentioning: "\"type\": \"object\"")
        await refused([Wire.ToolSpec(name: "t", parametersJsonSchema: "[1,2]")], mentioning: "not a JSON object")
        await refused([Wire.ToolSpec(name: "t", toolNamespace: "x")], mentioning: "tool_namespace")
        await refused([Wire.ToolSpec(name: "t", parametersJsonSchema: "{\"type\":\"object\",\"description\":\"" + String(repeating: "x", count: 17000) + "\"}")],
                      mentioning: "16384")

        let id = try #require(try await client.startThread(Self.startParams()).thread?.id)
        let grep = Wire.ToolSpec(name: "grep", description: "Searches.", parametersJsonSchema: #"{"type":"object"}"#, requiresApproval: true)
        guard case let .threadToolsUpdate(updated) = try await client.result(.threadToolsUpdate(Wire.ThreadToolsUpdateParams(
            threadId: id, clientTools: [Self.readFile, grep]))) else { Issue.record("bad result"); return }
        #expect(updated.clientTools.map(\.name) == ["read_file", "grep"])
        await expectStatus(3, mentioning: "appears twice") {
            _ = try await client.result(.threadToolsUpdate(Wire.ThreadToolsUpdateParams(threadId: id, clientTools: [grep, grep])))
        }
        #expect(try await client.read(id).clientTools.map(\.name) == ["read_file", "grep"])
        #expect(try await client.read(id).clientTools.last?.requiresApproval == true)
        // The next model call is offered the new list.
        let turn = try await client.runTurn(id, "hello")
        #expect(Set(turn.lastTools).isSuperset(of: ["read_file", "grep"]))

        try await server.restart()
        let again = try await server.client()
        #expect(try await again.resume(id).clientTools.map(\.name) == ["read_file", "grep"], "kept across a restart")
        #expect(try await again.fork(id).clientTools.map(\.name) == ["read_file", "grep"], "kept by fork")
        let child = try #require(try await again.spawn(id).thread?.id)
        #expect(try await again.read(child).clientTools.map(\.name) == ["read_file", "grep"], "a child agent has its parent's tools")
    }

    @Test("two clients race to answer: exactly one answer counts, the other is told")
    func racingAnswers() async throws {
        let server = try await InProcessServer.launch()
        let first = try await server.capableClient()
        let second = try await server.capableClient()
        let firstInbox = Inbox(first)
        let secondInbox = Inbox(second)
        let id = try #require(try await first.startThread(Self.startParams()).thread?.id)
        _ = try await second.resume(id)
        let turnID = try await first.startTurn(id, "#tool read_file {\"path\":\"r\"}")
        let a = try await first.nextServerRequest()
        let b = try await second.nextServerRequest()
        #expect(a.id == b.id, "both eligible connections were sent the same request")
        async let answerA: Void = first.answer(Wire.ServerRequestAnswer(id: a.id, code: 0, result: .itemToolCall(Wire.ToolCallResult(output: "from first"))))
        async let answerB: Void = second.answer(Wire.ServerRequestAnswer(id: b.id, code: 0, result: .itemToolCall(Wire.ToolCallResult(output: "from second"))))
        _ = try await (answerA, answerB)
        let turn = try await first.waitForTurn(id, turnID)
        let output = try #require(turn.items.first { $0.type == .toolCall }?.toolOutput)
        #expect(output == "from first" || output == "from second")
        #expect(turn.lastContext.filter { $0.kind == .toolOutput }.count == 1, "the model read one output")
        let loser = output == "from first" ? secondInbox : firstInbox
        try await loser.waitFor("the other answer refused") {
            if case let .serverRequestResolved(n) = $0 { n.requestId == a.id && (n.answerRefused ?? "").contains("no longer pending") } else { false }
        }
        let winner = output == "from first" ? firstInbox : secondInbox
        try await winner.waitFor("resolved ANSWERED") {
            if case let .serverRequestResolved(n) = $0 { n.requestId == a.id && n.outcome == .answered } else { false }
        }
        let winnerRefused = await winner.payloads().contains { if case let .serverRequestResolved(n) = $0 { n.answerRefused != nil } else { false } }
        #expect(!winnerRefused, "the answer that counted was not refused")
        // A duplicate answer later changes nothing and is told so.
        try await first.answer(Wire.ServerRequestAnswer(id: a.id, code: 0, result: .itemToolCall(Wire.ToolCallResult(output: "late"))))
        try await firstInbox.waitFor("late answer refused") {
            if case let .serverRequestResolved(n) = $0 { n.requestId == a.id && (n.answerRefused ?? "").contains("changed nothing") } else { false }
        }
        #expect(try await first.read(id).thread?.turns.last?.items.first { $0.type == .toolCall }?.toolOutput == output)
    }

    @Test("a connection that closes without answering: the request is offered to the next eligible subscriber")
    func offeredAgainAfterDisconnect() async throws {
        let server = try await InProcessServer.launch()
        let first = try await server.capableClient()
        let id = try #require(try await first.startThread(Self.startParams()).thread?.id)
        let turnID = try await first.startTurn(id, "#tool read_file {\"path\":\"d\"}")
        let offered = try await first.nextServerRequest()
        await first.close()

        let observer = try await server.client()
        let status = try #require(try await observer.read(id, turns: false).thread?.status)
        #expect(status.type == .active && status.activeFlags == [.waitingOnClientTool], "the thread says it waits on a client")

        let second = try await server.capableClient()
        _ = try await second.resume(id)
        let again = try await second.nextServerRequest()
        #expect(again.id == offered.id, "the same request, by the same id")
        try await second.answer(Wire.ServerRequestAnswer(id: again.id, code: 0, result: .itemToolCall(Wire.ToolCallResult(output: "second"))))
        let turn = try await second.waitForTurn(id, turnID)
        #expect(turn.status == .completed)
        #expect(turn.items.first { $0.type == .toolCall }?.toolOutput == "second")
    }

    @Test("connections that did not declare client tools, or act for another principal, are never asked")
    func nonEligibleNeverAsked() async throws {
        let tokens = NSTemporaryDirectory() + "threadwire-tokens-" + UUID().uuidString
        try "alice \(aliceToken)\nbob \(bobToken)\n".write(toFile: tokens, atomically: true, encoding: .utf8)
        chmod(tokens, 0o600)
        defer { try? FileManager.default.removeItem(atPath: tokens) }
        let server = try await InProcessServer.launch(arguments: ["--auth-tokens", tokens])
        let alice = try await server.capableClient(token: aliceToken)
        let plain = try await server.client(initialize: false)
        try await plain.initialize(name: "dashboard", authToken: aliceToken)
        let bob = try await server.capableClient(token: bobToken)
        let id = try #require(try await alice.startThread(Self.startParams()).thread?.id)
        _ = try await plain.resume(id)
        await expectStatus(5, mentioning: id) { _ = try await bob.resume(id) }
        let turnID = try await alice.startTurn(id, "#tool read_file {\"path\":\"n\"}")
        let request = try await alice.nextServerRequest()
        // Neither may answer: they were not sent it.
        let plainInbox = Inbox(plain)
        try await plain.answer(Wire.ServerRequestAnswer(id: request.id, code: 0, result: .itemToolCall(Wire.ToolCallResult(output: "plain"))))
        try await bob.answer(Wire.ServerRequestAnswer(id: request.id, code: 0, result: .itemToolCall(Wire.ToolCallResult(output: "bob"))))
        try await plainInbox.waitFor("refused: not sent to it") {
            if case let .serverRequestResolved(n) = $0 { (n.answerRefused ?? "").contains("not sent to this connection") } else { false }
        }
        try await alice.answer(Wire.ServerRequestAnswer(id: request.id, code: 0, result: .itemToolCall(Wire.ToolCallResult(output: "alice"))))
        let turn = try await alice.waitForTurn(id, turnID)
        #expect(turn.items.first { $0.type == .toolCall }?.toolOutput == "alice")
        #expect(await plain.hasNoServerRequest(), "a connection without the capability got no request")
        #expect(await bob.hasNoServerRequest(), "another principal got no request")
    }

    @Test("no answer within the thread's timeout: the model reads that the tool timed out; a client error is a failed call")
    func timeoutAndClientError() async throws {
        let server = try await InProcessServer.launch()
        let ide = try await server.capableClient()
        let inbox = Inbox(ide)
        await expectStatus(3, mentioning: "ceiling") {
            _ = try await ide.startThread(Self.startParams(config: [Wire.KeyValue(key: "tools.client_request_timeout_ms", value: "600001")]))
        }
        let id = try #require(try await ide.startThread(Self.startParams(config: [
            Wire.KeyValue(key: "tools.client_request_timeout_ms", value: "300"),
        ])).thread?.id)
        let turn = try await ide.runTurn(id, "#tool read_file {\"path\":\"slow\"}")
        #expect(turn.status == .completed)
        let item = try #require(turn.items.first { $0.type == .toolCall })
        #expect(item.status == .timedOut)
        #expect(turn.lastContext.contains { $0.kind == .toolOutput && ($0.text ?? "").contains("timed out") })
        try await inbox.waitFor("resolved TIMED_OUT") {
            if case let .serverRequestResolved(n) = $0 { n.outcome == .timedOut } else { false }
        }

        let other = try #require(try await ide.startThread(Self.startParams()).thread?.id)
        let turnID = try await ide.startTurn(other, "#tool read_file {\"path\":\"x\"}")
        let request = try await ide.nextServerRequest(thread: other)
        try await ide.answer(Wire.ServerRequestAnswer(id: request.id, code: 5, message: "no such file"))
        let failed = try await ide.waitForTurn(other, turnID)
        let failedItem = try #require(failed.items.first { $0.type == .toolCall })
        #expect(failedItem.status == .failed)
        #expect(failedItem.toolOutput?.contains("no such file") == true)
    }

    @Test("turn/interrupt while a turn waits withdraws the request; a later answer is refused")
    func interruptWithdraws() async throws {
        let server = try await InProcessServer.launch()
        let ide = try await server.capableClient()
        let inbox = Inbox(ide)
        let id = try #require(try await ide.startThread(Self.startParams()).thread?.id)
        let turnID = try await ide.startTurn(id, "#tool read_file {\"path\":\"i\"}")
        let request = try await ide.nextServerRequest()
        _ = try await ide.result(.turnInterrupt(Wire.TurnInterruptParams(threadId: id, turnId: turnID)))
        try await inbox.waitFor("resolved WITHDRAWN") {
            if case let .serverRequestResolved(n) = $0 { n.requestId == request.id && n.outcome == .withdrawn } else { false }
        }
        let turn = try await ide.waitForTurn(id, turnID)
        #expect(turn.status == .interrupted)
        #expect(turn.items.first { $0.type == .toolCall }?.status == .failed)
        try await ide.answer(Wire.ServerRequestAnswer(id: request.id, code: 0, result: .itemToolCall(Wire.ToolCallResult(output: "late"))))
        try await inbox.waitFor("late answer refused") {
            if case let .serverRequestResolved(n) = $0 { n.requestId == request.id && n.answerRefused != nil } else { false }
        }
        // The thread takes new turns.
        #expect(try await ide.runTurn(id, "again").status == .completed)
    }

    @Test("an answer without an id, or OK without a result, is refused and the request still waits")
    func malformedAnswers() async throws {
        let server = try await InProcessServer.launch()
        let ide = try await server.capableClient()
        let inbox = Inbox(ide)
        let id = try #require(try await ide.startThread(Self.startParams()).thread?.id)
        let turnID = try await ide.startTurn(id, "#tool read_file {\"path\":\"m\"}")
        let request = try await ide.nextServerRequest()
        try await ide.answer(Wire.ServerRequestAnswer(code: 0))
        var unmatched = ide.unmatchedResponses.makeAsyncIterator()
        let refusal = try #require(await unmatched.next())
        #expect(refusal.code == 3 && refusal.message?.contains("needs the id") == true)
        try await ide.answer(Wire.ServerRequestAnswer(id: request.id, code: 0))
        try await inbox.waitFor("refused: OK without a result") {
            if case let .serverRequestResolved(n) = $0 { n.outcome == .pending && (n.answerRefused ?? "").contains("needs a result") } else { false }
        }
        try await ide.answer(Wire.ServerRequestAnswer(id: request.id, code: 0, result: .itemToolCall(Wire.ToolCallResult(output: "ok"))))
        #expect(try await ide.waitForTurn(id, turnID).items.first { $0.type == .toolCall }?.toolOutput == "ok")
    }

    @Test("several client calls in one model response are asked one after the other, in order")
    func severalCallsInOneResponse() async throws {
        let server = try await InProcessServer.launch()
        let ide = try await server.capableClient()
        let order = Mutex<[String]>([])
        ide.serveClientTools { _, call in
            order.withLock { $0.append(call.arguments ?? "") }
            return Wire.ToolCallResult(output: "read \(call.arguments ?? "")")
        }
        let id = try #require(try await ide.startThread(Self.startParams()).thread?.id)
        let turn = try await ide.runTurn(id, "#tool read_file {\"path\":\"1\"}\n#tool read_file {\"path\":\"2\"}\n#tool read_file {\"path\":\"3\"}")
        #expect(turn.status == .completed)
        #expect(order.withLock { $0 } == [#"{"path":"1"}"#, #"{"path":"2"}"#, #"{"path":"3"}"#])
        #expect(turn.items.filter { $0.type == .toolCall }.map(\.status) == [.completed, .completed, .completed])
        let context = turn.lastContext.filter { $0.kind == .toolCall || $0.kind == .toolOutput }.map(\.kind)
        #expect(context == [.toolCall, .toolOutput, .toolCall, .toolOutput, .toolCall, .toolOutput])
    }
}

/// Waiting that survives the process: kill -9 and SIGTERM while a turn waits
/// for a client (real server processes).
@Suite("client tools across restarts", .timeLimit(.minutes(3)))
struct ClientToolRestartTests {
    @Test("kill -9 while a turn waits on a client tool: after restart the same request is offered and the turn goes on")
    func survivesKill9() async throws {
        let server = try await ServerProcess.launch()
        try await waitThroughRestart(server) { await server.kill9() }
    }

    @Test("SIGTERM while a turn waits on a client tool: the server exits 0 at once and the turn goes on after restart")
    func survivesSigterm() async throws {
        let server = try await ServerProcess.launch(arguments: ["--turn-grace-seconds", "30"])
        try await waitThroughRestart(server) {
            let started = ContinuousClock.now
            #expect(await server.stop() == 0)
            // A turn that only waits for a client does not hold the shutdown for its grace period.
            #expect(ContinuousClock.now - started < .seconds(20))
        }
    }

    /// Two client calls in one model response; the process goes down while
    /// the first waits. The answer to it, and the second call (kept as a
    /// deferred output of the stored turn), both happen after the restart.
    private func waitThroughRestart(_ server: ServerProcess, down: () async throws -> Void) async throws {
        let ide = try await server.capableClient()
        let id = try #require(try await ide.startThread(ClientToolTests.startParams()).thread?.id)
        let turnID = try await ide.startTurn(id, "#tool read_file {\"path\":\"1\"}\n#tool read_file {\"path\":\"2\"}")
        let first = try await ide.nextServerRequest()
        try await down()
        try await server.start()

        let observer = try await server.client()
        let waiting = try #require(try await observer.read(id).thread)
        #expect(waiting.status?.type == .active, "not interrupted: the turn only waited on a client")
        #expect(waiting.status?.activeFlags == [.waitingOnClientTool])
        #expect(waiting.turns.last?.status == .inProgress)
        #expect(waiting.turns.last?.pendingRequests.map(\.id) == [first.id])

        let ide2 = try await server.capableClient()
        _ = try await ide2.resume(id)
        let again = try await ide2.nextServerRequest()
        #expect(again.id == first.id, "the same request after the restart")
        try await ide2.answer(Wire.ServerRequestAnswer(id: again.id, code: 0, result: .itemToolCall(Wire.ToolCallResult(output: "one"))))
        let second = try await ide2.nextServerRequest()
        guard case let .itemToolCall(call)? = second.params else { Issue.record("not a tool call"); return }
        #expect(call.arguments == #"{"path":"2"}"#, "the response's second call, stored while the first waited")
        try await ide2.answer(Wire.ServerRequestAnswer(id: second.id, code: 0, result: .itemToolCall(Wire.ToolCallResult(output: "two"))))
        let turn = try await ide2.waitForTurn(id, turnID)
        #expect(turn.status == .completed)
        #expect(turn.items.filter { $0.type == .toolCall }.compactMap(\.toolOutput) == ["one", "two"])
        #expect(turn.lastContext.filter { $0.kind == .toolOutput }.map(\.text) == ["one", "two"])
    }
}

@Suite("config file keys", .timeLimit(.minutes(1)))
struct ConfigFileKeyTests {
    @Test("an unknown or misspelled config key stops startup, naming the key and the file")
    func unknownKeyStopsStartup() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("tw-config-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        for (config, key) in [
            (#"{"mcp_servers": {"time": {"comand": "mcp-server-time"}}}"#, "mcp_servers.time.comand"),
            (#"{"mcp_server": {"time": {"command": "mcp-server-time"}}}"#, "mcp_server"),
            (#"{"limits": {"max_frame_byte": 1024}}"#, "limits.max_frame_byte"),
            (#"{"models": [{"slug": "m", "multi_agent_verison": "v2"}]}"#, "models[].multi_agent_verison"),
        ] {
            let path = directory.appendingPathComponent("config.json").path
            try config.write(toFile: path, atomically: true, encoding: .utf8)
            let (status, _, stderr) = try await runBinary(ServerProcess.binary, [
                "--listen", "127.0.0.1:0", "--data-dir", directory.appendingPathComponent("data").path, "--config", path,
            ])
            #expect(status != 0)
            #expect(stderr.contains("unknown key '\(key)'") && stderr.contains(path), "\(stderr)")
        }
    }
}

extension InProcessServer {
    /// A connection that declared it runs client tools.
    func capableClient(token: String? = nil) async throws -> ThreadwireClient {
        let client = try await self.client(initialize: false)
        try await client.initialize(name: "ide", authToken: token ?? self.token, clientTools: true)
        return client
    }
}

extension ServerProcess {
    func capableClient() async throws -> ThreadwireClient {
        let client = try await self.client(initialize: false)
        try await client.initialize(name: "ide", authToken: token, clientTools: true)
        return client
    }
}

extension ThreadwireClient {
    /// The next server request (of `thread`, when given) this connection is sent.
    func nextServerRequest(thread: String? = nil, timeout: Duration = Patience.standard) async throws -> Wire.ServerRequest {
        try await withThrowingTaskGroup(of: Wire.ServerRequest?.self) { group in
            group.addTask {
                for await request in self.serverRequests where thread == nil || request.threadId == thread { return request }
                return nil
            }
            group.addTask {
                try await Task.sleep(for: timeout)
                return nil
            }
            let first = try await group.next() ?? nil
            group.cancelAll()
            guard let first else { throw TestTimeout(description: "no server request within \(timeout)") }
            return first
        }
    }

    /// True when no server request arrives within a short while.
    func hasNoServerRequest() async -> Bool {
        (try? await nextServerRequest(timeout: .milliseconds(300))) == nil
    }
}


@Suite("the Swift client (real server)", .timeLimit(.minutes(2)))
struct ClientLifetimeTests {
    @Test("a client dropped without close() closes its connection: the server counts it closed at once, not at its idle timeout")
    func droppedClientCloses() async throws {
        // The idle timeout far beyond the wait, so only the drop can close it.
        let server = try await ServerProcess.launch(arguments: ["--admin-listen", "127.0.0.1:0", "--idle-timeout-ms", "600000"])
        defer { server.stopInBackground() }
        func open() async throws -> Double? {
            metricValue(try await httpGet(port: server.adminPort, path: "/metrics").body, "threadwire_connections_open")
        }
        var client: ThreadwireClient? = try await server.client()
        #expect(try await client?.call(.healthCheck(.init())).code == 0)
        #expect(try await open() == 1)
        client = nil
        // 60 s: a full run on 2 cores once took over 10 s to get here (CI of
        // bb2ab2d); still a tenth of the idle timeout.
        try await waitUntil("the dropped client's connection closed", timeout: .seconds(60)) { try await open() == 0 ? true : nil }
    }
}
