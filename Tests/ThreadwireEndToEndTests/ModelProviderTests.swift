import Foundation
import Testing
import ThreadwireServerTesting
import ThreadwireClient
import ThreadwireTesting
import ThreadwireWire

/// The OpenAI-compatible backend against a real HTTP provider process
/// (Tests/provider/fake_openai.py), through the real server over TCP.
@Suite("a real model provider over HTTP (OpenAI-compatible, streamed)", .timeLimit(.minutes(3)))
struct ModelProviderTests {
    static func config(_ provider: FakeProvider, idleMs: Int = 10_000, retries: Int = 2, mode: Bool = true,
                       requestMs: Int = 5000) -> String {
        """
        {"features": {"multi_agent_v2": true, "multi_agent_mode": \(mode)},
         "multi_agent_v2": {"usage_hint_enabled": \(mode)},
         "model_providers": [{"name": "fake", "base_url": "\(provider.baseURL)", "api_key_env": "FAKE_PROVIDER_KEY",
                              "request_timeout_ms": \(requestMs), "stream_idle_timeout_ms": \(idleMs), "max_retries": \(retries),
                              "retry_base_delay_ms": 20}],
         "models": [{"slug": "remote-1", "provider": "fake", "multi_agent_version": "v2"}]}
        """
    }

    static func launch(_ provider: FakeProvider, idleMs: Int = 10_000, retries: Int = 2,
                       requestMs: Int = 5000) async throws -> ServerProcess {
        try await ServerProcess.launch(config: config(provider, idleMs: idleMs, retries: retries, requestMs: requestMs),
                                       environment: ["FAKE_PROVIDER_KEY": "sk-test-123"])
    }

    @Test("deltas stream between item/started and item/completed; the HTTP body is the persisted model request; usage is recorded")
    func streamingAndRequestBody() async throws {
        let provider = try await FakeProvider.launch()
        defer { provider.stop() }
        let server = try await Self.launch(provider)
        defer { server.stopInBackground() }
        try await provider.script([FakeProvider.stream(text: ["Hel", "lo, ", "world"], usage: (40, 3), delayMs: 5)])

        let client = try await server.client()
        let quiet = try await server.client(optOut: ["item/agent_message/delta"])
        let started = try await client.startThread(Wire.ThreadStartParams(model: "remote-1", multiAgentMode: .proactive))
        let id = try #require(started.thread?.id)
        _ = try await quiet.resume(id)
        let inbox = Inbox(client)
        let quietInbox = Inbox(quiet)
        let turn = try await client.runTurn(id, "say hello")

        #expect(turn.status == .completed)
        let message = try #require(turn.items.last)
        #expect(message.type == .agentMessage)
        #expect(message.text == "Hello, world")
        try await inbox.waitFor("turn/completed") { if case .turnCompleted = $0 { true } else { false } }
        // item/started (empty) → deltas → item/completed, all for the same item id.
        let events = await inbox.payloads().compactMap { payload -> String? in
            switch payload {
            case let .itemStarted(n) where n.item?.id == message.id: return "started:\(n.item?.text ?? "")"
            case let .itemAgentMessageDelta(n) where n.itemId == message.id: return "delta:\(n.delta ?? "")"
            case let .itemCompleted(n) where n.item?.id == message.id: return "completed:\(n.item?.text ?? "")"
            default: return nil
            }
        }
        #expect(events == ["started:", "delta:Hel", "delta:lo, ", "delta:world", "completed:Hello, world"])
        try await quietInbox.waitFor("turn/completed") { if case .turnCompleted = $0 { true } else { false } }
        #expect(await quietInbox.payloads().allSatisfy { if case .itemAgentMessageDelta = $0 { false } else { true } },
                "a client that opted out gets no deltas")
        #expect(await quietInbox.payloads().contains { if case let .itemCompleted(n) = $0 { n.item?.id == message.id } else { false } })

        // What the provider received is what thread/read shows as the model request.
        let sent = try await provider.requests()
        #expect(sent.count == 1)
        let body = try #require(sent[0]["body"] as? [String: Any])
        let headers = try #require(sent[0]["headers"] as? [String: String])
        #expect(headers["authorization"] == "Bearer sk-test-123")
        #expect(body["model"] as? String == "remote-1")
        #expect(body["stream"] as? Bool == true)
        let request = try #require(turn.modelRequests.last)
        let messages = try #require(body["messages"] as? [[String: Any]])
        #expect(messages.count == request.context.count)
        for (sentMessage, item) in zip(messages, request.context) {
            let role: String
            switch item.role {
            case .system?, .developer?: role = "system"
            case .assistant?: role = "assistant"
            case .tool?: role = "tool"
            default: role = "user"
            }
            #expect(sentMessage["role"] as? String == role)
            #expect(sentMessage["content"] as? String == item.text)
        }
        #expect(messages.contains { ($0["content"] as? String)?.hasPrefix("<multi_agent_mode>") == true },
                "the proactive mode fragment was sent, as persisted")
        let tools = try #require(body["tools"] as? [[String: Any]])
        #expect(tools.count == request.tools.count)
        for (sentTool, spec) in zip(tools, request.tools) {
            let function = try #require(sentTool["function"] as? [String: Any])
            #expect(function["name"] as? String == spec.name)
            let schema = try JSONSerialization.jsonObject(with: Data(try #require(spec.parametersJsonSchema).utf8)) as? NSDictionary
            #expect((function["parameters"] as? NSDictionary) == schema, "the tool's schema as ToolSpec carries it")
        }
        #expect(Set(tools.compactMap { ($0["function"] as? [String: Any])?["name"] as? String })
                == ["spawn_agent", "send_message", "followup_task", "wait_agent", "list_agents", "close_agent"])
        #expect(request.usage?.inputTokens == 40)
        #expect(request.usage?.outputTokens == 3)
        #expect(request.usage?.totalTokens == 43)
    }

    @Test("tool arguments nested 100,000 levels deep become a tool error the model reads (no parser recurses into them); the server goes on serving")
    func deeplyNestedArguments() async throws {
        let provider = try await FakeProvider.launch()
        defer { provider.stop() }
        let server = try await Self.launch(provider)
        defer { server.stopInBackground() }
        let deep = String(repeating: "[", count: 100_000) + String(repeating: "]", count: 100_000)
        try await provider.script([
            FakeProvider.stream(toolCalls: [(name: "list_agents", arguments: #"{"path_prefix": "# + deep + "}")]),
            FakeProvider.stream(text: ["read it"]).merging(["match": "tool_call_id"]) { $1 },
        ])
        let client = try await server.client()
        let id = try #require(try await client.startThread(Wire.ThreadStartParams(model: "remote-1")).thread?.id)
        let turn = try await client.runTurn(id, "list")
        #expect(turn.status == .completed)
        let call = try #require(turn.items.first { $0.type == .collabToolCall })
        #expect(call.toolOutput?.contains("nest deeper than 64 levels") == true, "\(call.toolOutput ?? "")")
        #expect(try await client.read(id).thread?.id == id, "the server still serves")
    }

    @Test("tool calls whose arguments arrive split are reassembled; malformed arguments become a tool error the model reads")
    func toolCalls() async throws {
        let provider = try await FakeProvider.launch()
        defer { provider.stop() }
        let server = try await Self.launch(provider)
        defer { server.stopInBackground() }
        try await provider.script([
            FakeProvider.stream(toolCalls: [
                (name: "spawn_agent", arguments: #"{"task_name": "docs", "message": "write the docs"}"#),
                (name: "close_agent", arguments: #"{"target": 7"#),
                (name: "list_agents", arguments: #"{"path_prefix": 3}"#),
            ], pieces: 4),
            FakeProvider.stream(text: ["spawned"]).merging(["match": "tool_call_id"]) { $1 },
        ])
        let client = try await server.client()
        let id = try #require(try await client.startThread(Wire.ThreadStartParams(model: "remote-1")).thread?.id)
        // The child runs on the provider too: give it its own scripted answer.
        try await provider.script([FakeProvider.stream(text: ["docs written"])])
        let turn = try await client.runTurn(id, "delegate")
        #expect(turn.status == .completed, "malformed arguments never fail the turn")
        let calls = turn.items.filter { $0.type == .collabToolCall }
        #expect(calls.map(\.toolName) == ["spawn_agent", "close_agent", "list_agents"])
        #expect(calls[0].toolArguments == #"{"task_name": "docs", "message": "write the docs"}"#)
        #expect(calls[0].receiverThreadId != nil)
        #expect(calls[1].toolOutput?.contains("must be a JSON object") == true)
        #expect(calls[2].toolOutput?.contains("argument 'path_prefix' of list_agents must be a string") == true)
        #expect(turn.items.last?.text == "spawned")

        // The second call showed the model its tool calls and their outputs.
        let requests = try await provider.requests()
        let second = try #require(requests.first { request in
            ((request["body"] as? [String: Any])?["messages"] as? [[String: Any]])?.contains { $0["role"] as? String == "tool" } == true
        })
        let messages = try #require((second["body"] as? [String: Any])?["messages"] as? [[String: Any]])
        let toolMessages = messages.filter { $0["role"] as? String == "tool" }
        #expect(toolMessages.compactMap { $0["tool_call_id"] as? String } == ["call_0", "call_1", "call_2"])
        #expect((toolMessages[1]["content"] as? String)?.contains("error") == true)
        let assistantCalls = messages.compactMap { ($0["tool_calls"] as? [[String: Any]])?.first?["function"] as? [String: Any] }
        #expect(assistantCalls.compactMap { $0["arguments"] as? String }.first == #"{"task_name": "docs", "message": "write the docs"}"#)
    }

    @Test("429 with Retry-After and 500 are retried before anything streamed; past max_retries the turn fails as rate_limited or provider_error")
    func retries() async throws {
        let provider = try await FakeProvider.launch()
        defer { provider.stop() }
        let server = try await Self.launch(provider, retries: 2)
        defer { server.stopInBackground() }
        let client = try await server.client()
        let inbox = Inbox(client)
        let id = try #require(try await client.startThread(Wire.ThreadStartParams(model: "remote-1")).thread?.id)

        try await provider.script([
            ["status": 429, "headers": ["Retry-After": "0"], "body": #"{"error": {"message": "slow down"}}"#],
            ["status": 503, "body": "busy"],
            FakeProvider.stream(text: ["after retries"]),
        ])
        let recovered = try await client.runTurn(id, "one")
        #expect(recovered.status == .completed)
        #expect(recovered.items.last?.text == "after retries")
        #expect(try await provider.requests().count == 3)

        try await provider.script(Array(repeating: ["status": 429, "headers": ["Retry-After": "0"], "body": "limited"], count: 3))
        let limited = try await client.runTurn(id, "two")
        #expect(limited.status == .failed)
        #expect(limited.failureReason == .rateLimited)
        #expect(limited.error?.contains("429") == true)
        let completed = try await inbox.waitFor("turn/completed of the rate-limited turn") {
            if case let .turnCompleted(n) = $0 { n.turn?.id == limited.id } else { false }
        }
        guard case let .turnCompleted(notification)? = completed.payload else { throw TestTimeout(description: "no payload") }
        #expect(notification.turn?.failureReason == .rateLimited, "turn/completed shows the reason too")

        try await provider.script(Array(repeating: ["status": 500, "body": "boom"], count: 3))
        let broken = try await client.runTurn(id, "three")
        #expect(broken.failureReason == .providerError)
        #expect(broken.error?.contains("500") == true)
        #expect(try await provider.requests().count == 9, "1 + max_retries attempts each")

        try await provider.script([["status": 400, "body": #"{"error": {"message": "bad model"}}"#]])
        let rejected = try await client.runTurn(id, "four")
        #expect(rejected.failureReason == .providerError)
        #expect(try await provider.requests().count == 10, "a 400 is not retried")

        // The failure reason is stored: a fresh read after the fact shows it.
        let stored = try #require(try await client.read(id).thread?.turns.first { $0.id == limited.id })
        #expect(stored.failureReason == .rateLimited)
    }

    @Test("no response head in time and a stalled stream fail the turn as timeout (connection closed); malformed JSON as bad_response")
    func badResponseAndStall() async throws {
        let provider = try await FakeProvider.launch()
        defer { provider.stop() }
        let server = try await Self.launch(provider, idleMs: 300, requestMs: 1500)
        defer { server.stopInBackground() }
        let client = try await server.client()
        let id = try #require(try await client.startThread(Wire.ThreadStartParams(model: "remote-1")).thread?.id)

        // No response head within request_timeout_ms (1.5 s here): timeout, not retried.
        var slow = FakeProvider.stream(text: ["late"])
        slow["head_delay_ms"] = 6000
        try await provider.script([slow])
        let late = try await client.runTurn(id, "zero", timeout: .seconds(20))
        #expect(late.failureReason == .timeout)
        #expect(late.error?.contains("did not answer within") == true)
        #expect(try await provider.requests().count == 1, "a timeout is not retried")

        try await provider.script([["events": [["data": #"{"choices": [{"delta": {"content": "ok"}}]}"#], ["data": "{not json"]]]])
        let bad = try await client.runTurn(id, "one")
        #expect(bad.status == .failed)
        #expect(bad.failureReason == .badResponse)

        var stalled = FakeProvider.stream(text: ["partial"])
        stalled["done"] = false
        stalled["events"] = Array((stalled["events"] as! [[String: Any]]).prefix(2))
        stalled["stall"] = true
        try await provider.script([stalled])
        let timedOut = try await client.runTurn(id, "two")
        #expect(timedOut.status == .failed)
        #expect(timedOut.failureReason == .timeout)
        #expect(timedOut.error?.contains("stalled") == true)
        let deadline = ContinuousClock.now + Patience.standard
        while ContinuousClock.now < deadline, try await provider.requests().last?["disconnected"] as? Bool != true {
            try await Task.sleep(for: .milliseconds(50))
        }
        #expect(try await provider.requests().last?["disconnected"] as? Bool == true, "the stalled HTTP request was closed")
    }

    @Test("a client resuming while a message streams gets its item/started with the text so far as one delta, then the live deltas: together exactly the item's final text")
    func resumeMidStream() async throws {
        let provider = try await FakeProvider.launch()
        defer { provider.stop() }
        let server = try await Self.launch(provider)
        defer { server.stopInBackground() }
        // Six seconds of text: the resume lands while it streams, also on a loaded machine.
        try await provider.script([FakeProvider.stream(text: (0..<200).map { "piece \($0) " }, delayMs: 30)])
        let client = try await server.client()
        let inbox = Inbox(client)
        let id = try #require(try await client.startThread(Wire.ThreadStartParams(model: "remote-1")).thread?.id)
        let turnID = try await client.startTurn(id, "talk for a while")
        let deadline = ContinuousClock.now + .seconds(10)
        while ContinuousClock.now < deadline,
              await inbox.payloads().filter({ if case .itemAgentMessageDelta = $0 { true } else { false } }).count < 5 {
            try await Task.sleep(for: .milliseconds(10))
        }
        let late = try await server.client()
        let lateInbox = Inbox(late)
        let head = try #require(try await client.read(id, turns: false).thread?.threadSequence)
        _ = try await late.result(.threadResume(Wire.ThreadResumeParams(threadId: id, excludeTurns: true, afterThreadSequence: head)))
        let turn = try await late.waitForTurn(id, turnID, timeout: .seconds(30))
        let final = try #require(turn.items.last { $0.type == .agentMessage }?.text)
        try await lateInbox.waitFor("item/completed") { if case .itemCompleted = $0 { true } else { false } }
        let payloads = await lateInbox.payloads()
        let started = payloads.filter { if case .itemStarted = $0 { true } else { false } }
        let deltas = payloads.compactMap { payload -> String? in if case let .itemAgentMessageDelta(d) = payload { d.delta } else { nil } }
        #expect(started.count == 1, "the streaming item's start, once")
        #expect((deltas.first?.count ?? 0) > "piece 0 ".count, "the first delta is the text so far, several pieces: \(deltas.first ?? "")")
        #expect(deltas.joined() == final, "the text so far and the live deltas are the final text, nothing twice or missing")
    }

    @Test("turn/interrupt cancels the HTTP stream at once: the provider sees the disconnect and no delta follows the turn's end")
    func interruptCancelsStream() async throws {
        let provider = try await FakeProvider.launch()
        defer { provider.stop() }
        let server = try await Self.launch(provider)
        defer { server.stopInBackground() }
        // Twenty seconds of stream: the interrupt lands long before its end,
        // also when the suite's other tests hold the cores (fresh-clone run
        // 55 interrupted a 5 s stream after 94 of its 100 events).
        try await provider.script([FakeProvider.stream(text: (0..<400).map { "piece \($0) " }, delayMs: 50)])
        let client = try await server.client()
        let inbox = Inbox(client)
        let id = try #require(try await client.startThread(Wire.ThreadStartParams(model: "remote-1")).thread?.id)
        let turnID = try await client.startTurn(id, "talk for a while")
        try await inbox.waitFor("a delta") { if case .itemAgentMessageDelta = $0 { true } else { false } }
        _ = try await client.result(.turnInterrupt(Wire.TurnInterruptParams(threadId: id, turnId: turnID)))
        let turn = try await client.waitForTurn(id, turnID)
        #expect(turn.status == .interrupted)
        let deadline = ContinuousClock.now + Patience.standard
        while ContinuousClock.now < deadline, try await provider.requests().first?["disconnected"] as? Bool != true {
            try await Task.sleep(for: .milliseconds(20))
        }
        let request = try #require(try await provider.requests().first)
        #expect(request["disconnected"] as? Bool == true)
        #expect((request["events_sent"] as? Int ?? 0) < 300, "the stream was cut, not read to its end")
        try await inbox.waitFor("turn/completed") { if case .turnCompleted = $0 { true } else { false } }
        try await Task.sleep(for: .milliseconds(300))
        let payloads = await inbox.payloads()
        let end = try #require(payloads.firstIndex { if case .turnCompleted = $0 { true } else { false } })
        #expect(!payloads[end...].contains { if case .itemAgentMessageDelta = $0 { true } else { false } })
    }

    @Test("a child runs on the provider beside its parent; wait_agent returns when it finished, with its final message; no mode fragment where the rules give none (v2 without its usage hint)")
    func childInParallel() async throws {
        let provider = try await FakeProvider.launch()
        defer { provider.stop() }
        let server = try await ServerProcess.launch(config: Self.config(provider, mode: false),
                                                    environment: ["FAKE_PROVIDER_KEY": "k"])
        defer { server.stopInBackground() }
        try await provider.script([
            // The parent: spawn, then wait in the same answer.
            FakeProvider.stream(toolCalls: [
                (name: "spawn_agent", arguments: #"{"task_name": "research", "message": "find the bug"}"#),
                (name: "wait_agent", arguments: #"{"timeout_ms": 20000}"#),
            ]).merging(["match": "say when done"]) { $1 },
            // The child answers slowly; the parent's wait must outlast it.
            FakeProvider.stream(text: ["found ", "it"], delayMs: 150).merging(["match": "find the bug"]) { $1 },
            FakeProvider.stream(text: ["all done"]).merging(["match": "tool_call_id"]) { $1 },
        ])
        let client = try await server.client()
        let id = try #require(try await client.startThread(Wire.ThreadStartParams(model: "remote-1")).thread?.id)
        let turn = try await client.runTurn(id, "say when done")
        #expect(turn.status == .completed)
        let wait = try #require(turn.items.first { $0.toolName == "wait_agent" })
        #expect(wait.toolOutput?.contains("found it") == true, "the child's final message: \(wait.toolOutput ?? "")")
        #expect(wait.toolOutput?.contains("\"timed_out\":false") == true)
        #expect(turn.items.last?.text == "all done")
        let child = try #require(turn.items.first { $0.toolName == "spawn_agent" }?.receiverThreadId)
        let childTurn = try #require(try await client.read(child).thread?.turns.last)
        #expect(childTurn.status == .completed)
        #expect(childTurn.items.last?.text == "found it")
        // Mode does not apply (no usage hint): neither the persisted requests nor the bodies carry a fragment.
        #expect(turn.modelRequests.allSatisfy { $0.context.of(.multiAgentMode).isEmpty })
        for request in try await provider.requests() {
            let messages = (request["body"] as? [String: Any])?["messages"] as? [[String: Any]] ?? []
            #expect(!messages.contains { ($0["content"] as? String)?.contains("<multi_agent_mode>") == true })
        }
    }

    @Test("a provider that cannot be reached is retried max_retries times, then the turn fails as provider_error")
    func unreachable() async throws {
        let closed = try PostgresCluster.freePort()  // free a moment ago: nothing listens there
        let config = """
            {"model_providers": [{"name": "gone", "base_url": "http://127.0.0.1:\(closed)/v1", "max_retries": 2,
                                  "retry_base_delay_ms": 10, "request_timeout_ms": 2000}],
             "models": [{"slug": "remote-1", "provider": "gone"}]}
            """
        let server = try await ServerProcess.launch(config: config)
        defer { server.stopInBackground() }
        let client = try await server.client()
        let id = try #require(try await client.startThread(Wire.ThreadStartParams(model: "remote-1")).thread?.id)
        let turn = try await client.runTurn(id, "anyone there?")
        #expect(turn.status == .failed)
        #expect(turn.failureReason == .providerError)
        #expect(turn.error?.contains("cannot reach model provider 'gone'") == true)
        #expect(turn.error?.contains("3 attempts") == true)
    }

    @Test("wire_api responses: text deltas, a function call in pieces and usage; the body's input items carry the calls and outputs")
    func responsesAPI() async throws {
        let provider = try await FakeProvider.launch()
        defer { provider.stop() }
        let config = """
            {"features": {"multi_agent_v2": true},
             "model_providers": [{"name": "fake", "base_url": "\(provider.baseURL)", "wire_api": "responses"}],
             "models": [{"slug": "remote-r", "provider": "fake", "multi_agent_version": "v2"}]}
            """
        let server = try await ServerProcess.launch(config: config)
        defer { server.stopInBackground() }
        try await provider.script([
            FakeProvider.responsesStream(text: ["Listing ", "agents."], toolCalls: [(name: "list_agents", arguments: #"{"path_prefix": "/root"}"#)]),
            FakeProvider.responsesStream(text: ["None yet."], usage: (50, 3)).merging(["match": "function_call_output"]) { $1 },
        ])
        let client = try await server.client()
        let inbox = Inbox(client)
        let id = try #require(try await client.startThread(Wire.ThreadStartParams(model: "remote-r")).thread?.id)
        let turn = try await client.runTurn(id, "who is there?")
        #expect(turn.status == .completed)
        #expect(turn.items.map(\.type) == [.userMessage, .agentMessage, .collabToolCall, .agentMessage])
        #expect(turn.items[1].text == "Listing agents.")
        #expect(turn.items[2].toolArguments == #"{"path_prefix": "/root"}"#)
        #expect(turn.items[2].toolOutput?.contains("agents") == true)
        #expect(turn.items.last?.text == "None yet.")
        #expect(turn.modelRequests.last?.usage?.totalTokens == 53)
        try await inbox.waitFor("a delta") { if case let .itemAgentMessageDelta(n) = $0 { n.delta == "agents." } else { false } }

        let requests = try await provider.requests()
        #expect(requests.map { $0["path"] as? String } == ["/v1/responses", "/v1/responses"])
        let body = try #require(requests[1]["body"] as? [String: Any])
        #expect(body["stream"] as? Bool == true)
        let input = try #require(body["input"] as? [[String: Any]])
        #expect(input.count == turn.modelRequests.last?.context.count)
        let call = try #require(input.first { $0["type"] as? String == "function_call" })
        #expect(call["call_id"] as? String == "fc_0")
        #expect(call["name"] as? String == "list_agents")
        let output = try #require(input.first { $0["type"] as? String == "function_call_output" })
        #expect(output["call_id"] as? String == "fc_0")
        let tools = try #require(body["tools"] as? [[String: Any]])
        #expect(tools.allSatisfy { $0["type"] as? String == "function" && $0["parameters"] is [String: Any] })
    }

    @Test("a provider whose API key variable is unset stops startup with a message naming it")
    func missingAPIKey() async throws {
        let provider = try await FakeProvider.launch()
        defer { provider.stop() }
        let config = NSTemporaryDirectory() + "threadwire-provider-\(UUID().uuidString).json"
        try Self.config(provider).write(toFile: config, atomically: true, encoding: .utf8)
        let (status, _, stderr) = try await runBinary(ServerProcess.binary, [
            "--listen", "127.0.0.1:0", "--data-dir", NSTemporaryDirectory() + "threadwire-provider-\(UUID().uuidString)", "--config", config])
        #expect(status != 0)
        #expect(stderr.contains("FAKE_PROVIDER_KEY"))
    }
}
