public import Foundation
public import ThreadwireCore

/// The two request formats a provider may speak (`wire_api`).
public enum WireAPI: String, Sendable, Equatable {
    /// `POST {base_url}/chat/completions`: OpenAI, Ollama, vLLM, llama.cpp.
    case chat
    /// `POST {base_url}/responses`: OpenAI's Responses API (codex's own format).
    case responses

    var path: String { self == .chat ? "/chat/completions" : "/responses" }

    func body(for request: ModelRequest) throws -> Data {
        self == .chat ? try ChatCompletions.body(for: request) : try ResponsesAPI.body(for: request)
    }

    func accumulator() -> any StreamAccumulator {
        self == .chat ? ChatCompletions.Accumulator() : ResponsesAPI.Accumulator()
    }
}

/// Builds one model call's answer from its server-sent events.
protocol StreamAccumulator {
    /// Applies one event; returns the text it adds to the answer's message.
    mutating func add(_ event: ServerSentEventParser.Event) throws -> String
    /// The answer is whole (a finish reason, or the format's last event).
    var finished: Bool { get }
    /// Nothing more is expected: stop reading.
    var complete: Bool { get }
    func response() throws -> ModelResponse
}

extension ChatCompletions.Accumulator: StreamAccumulator {
    mutating func add(_ event: ServerSentEventParser.Event) throws -> String { try add(event.data) }
    var complete: Bool { sawDone }
}

/// The Responses API format (`stream: true`): typed events such as
/// `response.output_text.delta`, `response.output_item.added` (a function
/// call's id and name), `response.function_call_arguments.delta` and
/// `response.completed` (with usage).
public enum ResponsesAPI {
    /// The same items as `ChatCompletions.body` (`WireMapping.item`): tool
    /// calls as `function_call` items and their outputs as
    /// `function_call_output` items with the same `call_id`.
    public static func body(for request: ModelRequest) throws -> Data {
        let input = request.context.map { item -> [String: Any] in
            switch WireMapping.item(item) {
            case let .message(role, content):
                return ["role": role, "content": content]
            case let .toolCall(callID, name, arguments):
                return ["type": "function_call", "call_id": callID, "name": name, "arguments": arguments]
            case let .toolOutput(callID, output):
                return ["type": "function_call_output", "call_id": callID, "output": output]
            }
        }
        var body: [String: Any] = ["model": request.model, "stream": true, "store": false, "input": input]
        if !request.reasoning.isEmpty {
            var reasoning: [String: Any] = [:]
            if let effort = request.reasoning.effort { reasoning["effort"] = effort }
            if let summary = request.reasoning.summary { reasoning["summary"] = summary }
            body["reasoning"] = reasoning
        }
        if !request.tools.isEmpty {
            body["tools"] = try request.tools.map { tool -> [String: Any] in
                ["type": "function", "name": tool.name, "description": tool.description, "parameters": try WireMapping.parameters(tool)]
            }
        }
        return try JSONSerialization.data(withJSONObject: body, options: [.sortedKeys])
    }

    struct Event: Decodable {
        struct Item: Decodable {
            var type: String?
            var call_id: String?
            var name: String?
            var arguments: String?
        }
        struct Usage: Decodable {
            var input_tokens: Int?
            var output_tokens: Int?
            var total_tokens: Int?
        }
        struct Response: Decodable {
            var usage: Usage?
            var error: APIError?
        }
        struct APIError: Decodable {
            var message: String?
            var code: String?
        }
        var type: String?
        var delta: String?
        var output_index: Int?
        var item: Item?
        var arguments: String?
        var response: Response?
        var message: String?
    }

    struct Accumulator: StreamAccumulator {
        private var answer: ModelAnswer
        private(set) var finished = false
        var complete: Bool { finished }

        init(maxAnswerBytes: Int = 4 << 20) { answer = ModelAnswer(maxAnswerBytes: maxAnswerBytes) }

        mutating func add(_ event: ServerSentEventParser.Event) throws -> String {
            let decoded: Event
            do {
                decoded = try JSONDecoder().decode(Event.self, from: Data(event.data.utf8))
            } catch {
                throw ModelCallError(.badResponse, "the provider sent an event that is not a Responses API event: \(event.data.prefix(200))")
            }
            switch decoded.type ?? event.type ?? "" {
            case "response.output_text.delta":
                let added = decoded.delta ?? ""
                try answer.append(text: added)
                return added
            case "response.output_item.added", "response.output_item.done":
                if let item = decoded.item, item.type == "function_call", let index = decoded.output_index {
                    try answer.call(index) { entry in
                        if let id = item.call_id { entry.id = id }
                        if let name = item.name { entry.name = name }
                        if let arguments = item.arguments, !arguments.isEmpty { entry.arguments = arguments }
                    }
                }
            case "response.function_call_arguments.delta":
                if let index = decoded.output_index { try answer.call(index) { $0.arguments += decoded.delta ?? "" } }
            case "response.function_call_arguments.done":
                if let index = decoded.output_index, let arguments = decoded.arguments {
                    try answer.call(index) { $0.arguments = arguments }
                }
            case "response.completed":
                if let usage = decoded.response?.usage {
                    let input = usage.input_tokens ?? 0
                    let output = usage.output_tokens ?? 0
                    answer.usage = TokenUsage(inputTokens: input, outputTokens: output, totalTokens: usage.total_tokens ?? input + output)
                }
                finished = true
            case "response.failed", "error":
                let message = decoded.response?.error?.message ?? decoded.message ?? "unknown"
                throw ModelCallError(.providerError, "the provider reported an error mid-stream: \(message)")
            default:
                break  // created, in_progress, content_part, ...: nothing to keep
            }
            return ""
        }

        func response() throws -> ModelResponse { try answer.response() }
    }
}
