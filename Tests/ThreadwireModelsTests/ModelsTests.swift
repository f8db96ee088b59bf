import Foundation
import Logging
import Testing
import ThreadwireCore
@testable import ThreadwireModels

@Suite("server-sent events parser")
struct ServerSentEventTests {
    func parse(_ chunks: [String]) throws -> [ServerSentEventParser.Event] {
        var parser = ServerSentEventParser()
        return try chunks.flatMap { try parser.feed(Array($0.utf8)) }
    }

    @Test("events split anywhere, including inside a CRLF, come out whole and once")
    func splits() throws {
        let stream = "data: {\"a\":1}\r\n\r\n: keep-alive comment\n\nevent: update\ndata: line one\ndata: line two\nid: 7\n\ndata:no-space\r\rdata: [DONE]\n\n"
        let expected: [ServerSentEventParser.Event] = [
            .init(data: "{\"a\":1}"), .init(type: "update", data: "line one\nline two", id: "7"),
            .init(data: "no-space", id: "7"), .init(data: "[DONE]", id: "7"),
        ]
        #expect(try parse([stream]) == expected)
        let bytes = Array(stream.utf8)
        for split in 1..<bytes.count {
            var parser = ServerSentEventParser()
            let events = try parser.feed(bytes[..<split]) + parser.feed(bytes[split...])
            #expect(events == expected, "split at \(split)")
        }
        var parser = ServerSentEventParser()
        #expect(try bytes.flatMap { try parser.feed([$0]) } == expected, "one byte at a time")
    }

    @Test("an event without data is dropped; an unfinished event is not delivered")
    func partial() throws {
        #expect(try parse(["event: ping\n\n", "data: half"]).isEmpty)
    }

    @Test("a line longer than the limit is an error, so memory stays bounded")
    func longLine() throws {
        var parser = ServerSentEventParser(maxLineBytes: 16)
        #expect(throws: ServerSentEventParser.LineTooLong.self) { try parser.feed(Array(repeating: UInt8(ascii: "x"), count: 17)) }
    }
}

@Suite("Chat Completions: request bodies and streamed answers")
struct ChatCompletionsTests {
    @Test("the body maps every context item in order, tool calls with their ids, and tools with their schemas")
    func body() throws {
        let tools = ToolCatalog.offered(runtime: .v2, depth: 0, maxDepth: 1, source: .appServer)
        let request = ModelRequest(model: "m", context: [
            ContextItem(role: .system, kind: .baseInstructions, text: "base"),
            ContextItem(role: .developer, kind: .multiAgentMode, text: "<multi_agent_mode>proactive</multi_agent_mode>"),
            ContextItem(role: .user, kind: .userInput, text: "hi"),
            ContextItem(role: .assistant, kind: .toolCall, text: "{\"task_name\":\"a\",\"message\":\"b\"}", toolName: "spawn_agent", callID: "c1"),
            ContextItem(role: .tool, kind: .toolOutput, text: "{\"nickname\":\"x\"}", toolName: "spawn_agent", callID: "c1"),
            ContextItem(role: .assistant, kind: .assistantMessage, text: "done"),
        ], tools: tools)
        let body = try #require(try JSONSerialization.jsonObject(with: ChatCompletions.body(for: request)) as? [String: Any])
        let messages = try #require(body["messages"] as? [[String: Any]])
        #expect(messages.map { $0["role"] as? String } == ["system", "system", "user", "assistant", "tool", "assistant"])
        #expect(messages[3]["content"] is NSNull)
        let call = try #require((messages[3]["tool_calls"] as? [[String: Any]])?.first)
        #expect(call["id"] as? String == "c1")
        #expect((call["function"] as? [String: Any])?["arguments"] as? String == "{\"task_name\":\"a\",\"message\":\"b\"}")
        #expect(messages[4]["tool_call_id"] as? String == "c1")
        let sentTools = try #require(body["tools"] as? [[String: Any]])
        #expect(sentTools.count == 6)
        let spawn = try #require(sentTools.first { ($0["function"] as? [String: Any])?["name"] as? String == "spawn_agent" })
        let parameters = try #require((spawn["function"] as? [String: Any])?["parameters"] as? [String: Any])
        #expect(parameters["required"] as? [String] == ["task_name", "message"])
        #expect(parameters["additionalProperties"] as? Bool == false)
        #expect((body["stream_options"] as? [String: Any])?["include_usage"] as? Bool == true)
    }

    @Test("reasoning: Chat Completions gets reasoning_effort, the Responses API reasoning {effort, summary}; none set sends neither")
    func reasoning() throws {
        let context = [ContextItem(role: .user, kind: .userInput, text: "hi")]
        func json(_ data: Data) throws -> [String: Any] { try #require(try JSONSerialization.jsonObject(with: data) as? [String: Any]) }
        let set = ModelRequest(model: "m", context: context, tools: [], reasoning: Reasoning(effort: "high", summary: "concise"))
        #expect(try json(ChatCompletions.body(for: set))["reasoning_effort"] as? String == "high")
        let responses = try #require(try json(ResponsesAPI.body(for: set))["reasoning"] as? [String: String])
        #expect(responses == ["effort": "high", "summary": "concise"])
        let plain = ModelRequest(model: "m", context: context, tools: [])
        #expect(try json(ChatCompletions.body(for: plain))["reasoning_effort"] == nil)
        #expect(try json(ResponsesAPI.body(for: plain))["reasoning"] == nil)
    }

    @Test("tool calls streamed in pieces by index are reassembled in order; usage is kept; [DONE] or a finish reason completes")
    func accumulator() throws {
        var answer = ChatCompletions.Accumulator()
        let chunks = [
            #"{"choices":[{"index":0,"delta":{"role":"assistant","content":"Let me "}}]}"#,
            #"{"choices":[{"index":0,"delta":{"content":"delegate."}}]}"#,
            #"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"b","function":{"name":"wait_agent","arguments":"{}"}}]}}]}"#,
            #"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"a","function":{"name":"spawn_","arguments":"{\"task"}}]}}]}"#,
            #"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"name":"agent","arguments":"_name\":\"t\"}"}}]}}]}"#,
            #"{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#,
            #"{"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":4,"total_tokens":14}}"#,
        ]
        var text = ""
        for chunk in chunks { text += try answer.add(chunk) }
        #expect(text == "Let me delegate.")
        #expect(answer.finished)
        let response = try answer.response()
        #expect(response.outputs == [
            .message("Let me delegate."),
            .toolCall(name: "spawn_agent", arguments: #"{"task_name":"t"}"#, callID: "a"),
            .toolCall(name: "wait_agent", arguments: "{}", callID: "b"),
        ])
        #expect(response.usage == TokenUsage(inputTokens: 10, outputTokens: 4, totalTokens: 14))
    }

    @Test("an answer larger than the limit is refused as bad_response, so memory stays bounded")
    func tooLarge() throws {
        var answer = ChatCompletions.Accumulator(maxAnswerBytes: 1000)
        let piece = #"{"choices":[{"index":0,"delta":{"content":"\#(String(repeating: "x", count: 100))"}}]}"#
        for _ in 0..<10 { _ = try answer.add(piece) }
        do {
            _ = try answer.add(piece)
            Issue.record("the 11th piece crosses 1000 bytes of text")
        } catch let error as ModelCallError {
            #expect(error.reason == .badResponse)
            #expect(error.message.contains("exceeds 1000 bytes"))
        }
    }

    @Test("a chunk that is not JSON is a bad_response; an error object mid-stream a provider_error")
    func badChunks() throws {
        var answer = ChatCompletions.Accumulator()
        #expect(throws: ModelCallError.self) { try answer.add("{oops") }
        do {
            _ = try answer.add("{oops")
        } catch let error as ModelCallError {
            #expect(error.reason == .badResponse)
        }
        do {
            _ = try answer.add(#"{"error":{"message":"overloaded"}}"#)
            Issue.record("an error event must fail the call")
        } catch let error as ModelCallError {
            #expect(error.reason == .providerError)
            #expect(error.message.contains("overloaded"))
        }
    }
}

@Suite("retry backoff")
struct BackoffTests {
    @Test("each retry doubles the base with jitter in [0.5, 1], capped; Retry-After wins, capped too")
    func delays() throws {
        var provider = ModelProviderConfig(name: "p", baseURL: "http://127.0.0.1:1/v1")
        provider.retryBaseDelay = .milliseconds(100)
        provider.maxRetryDelay = .seconds(1)
        let backend = try OpenAICompatibleBackend(provider: provider, environment: [:], logger: Logger(label: "test"))
        for attempt in 1...6 {
            let ceiling = min(Duration.milliseconds(100 * (1 << (attempt - 1))), .seconds(1))
            for _ in 0..<50 {
                let delay = backend.delay(before: attempt, retryAfter: nil)
                #expect(delay <= ceiling && delay >= ceiling / 2 - .milliseconds(1), "attempt \(attempt): \(delay)")
            }
        }
        #expect(backend.delay(before: 1, retryAfter: .milliseconds(700)) == .milliseconds(700))
        #expect(backend.delay(before: 1, retryAfter: .seconds(90)) == .seconds(1))
    }

    @Test("a provider naming an unset API key variable is refused with the variable's name")
    func missingKey() {
        let provider = ModelProviderConfig(name: "hosted", baseURL: "https://example.invalid/v1", apiKeyEnv: "SOME_KEY")
        #expect(throws: ModelCallError.self) { try OpenAICompatibleBackend(provider: provider, environment: [:], logger: Logger(label: "t")) }
    }
}

@Suite("Responses API: streamed events")
struct ResponsesAPITests {
    @Test("text deltas, function calls by output index (arguments in pieces or whole at done), usage at completed; errors fail the call")
    func events() throws {
        var answer = ResponsesAPI.Accumulator()
        let events = [
            #"{"type":"response.created","response":{"id":"r"}}"#,
            #"{"type":"response.output_text.delta","output_index":0,"delta":"On "}"#,
            #"{"type":"response.output_text.delta","output_index":0,"delta":"it."}"#,
            #"{"type":"response.output_item.added","output_index":2,"item":{"type":"function_call","call_id":"b","name":"wait_agent","arguments":""}}"#,
            #"{"type":"response.output_item.added","output_index":1,"item":{"type":"function_call","call_id":"a","name":"spawn_agent","arguments":""}}"#,
            #"{"type":"response.function_call_arguments.delta","output_index":1,"delta":"{\"task_name\":"}"#,
            #"{"type":"response.function_call_arguments.delta","output_index":1,"delta":"\"t\"}"}"#,
            #"{"type":"response.function_call_arguments.done","output_index":2,"arguments":"{}"}"#,
            #"{"type":"response.completed","response":{"usage":{"input_tokens":9,"output_tokens":2,"total_tokens":11}}}"#,
        ]
        var text = ""
        for event in events { text += try answer.add(ServerSentEventParser.Event(data: event)) }
        #expect(text == "On it.")
        #expect(answer.finished && answer.complete)
        let response = try answer.response()
        #expect(response.outputs == [
            .message("On it."),
            .toolCall(name: "spawn_agent", arguments: #"{"task_name":"t"}"#, callID: "a"),
            .toolCall(name: "wait_agent", arguments: "{}", callID: "b"),
        ])
        #expect(response.usage == TokenUsage(inputTokens: 9, outputTokens: 2, totalTokens: 11))

        var failing = ResponsesAPI.Accumulator()
        do {
            _ = try failing.add(ServerSentEventParser.Event(data: #"{"type":"response.failed","response":{"error":{"message":"quota"}}}"#))
            Issue.record("response.failed must fail the call")
        } catch let error as ModelCallError {
            #expect(error.reason == .providerError)
            #expect(error.message.contains("quota"))
        }
    }
}
