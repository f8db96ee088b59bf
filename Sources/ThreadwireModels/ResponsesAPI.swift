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
    /// Same mapping as `ChatCompletions.body`: base instructions and developer
    /// items as "system" messages, tool calls as `function_call` items and
    /// their outputs as `function_call_output` items with the same `call_id`.
    public static func body(for request: ModelRequest) throws -> Data {
        var input: [[String: Any]] = []
        for item in request.context {
            switch item.role {
            case .system, .developer:
                input.append(["role": "system", "content": item.text])
            case .user:
                input.append(["role": "user", "content": item.text])
            case .assistant:
                if item.kind == .toolCall {
                    input.append(["type": "function_call", "call_id": item.callID ?? "", "name": item.toolName ?? "",
                                  "arguments": item.text])
                } else {
                    input.append(["role": "assistant", "content": item.text])
                }
            case .tool:
                input.append(["type": "function_call_output", "call_id": item.callID ?? "", "output": item.text])
            }
        }
        var body: [String: Any] = ["model": request.model, "stream": true, "store": false, "input": input]
        if !request.tools.isEmpty {
            body["tools"] = try request.tools.map { tool -> [String: Any] in
                let schema = tool.parametersSchema.isEmpty
                    ? ["type": "object", "properties": [String: Any]()] as [String: Any]
                    : try JSONSerialization.jsonObject(with: Data(tool.parametersSchema.utf8))
                return ["type": "function", "name": tool.name, "description": tool.description, "parameters": schema]
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
        let maxAnswerBytes: Int
        private var text = ""
        private var calls: [Int: (id: String, name: String, arguments: String)] = [:]
        private var usage: TokenUsage?
        private(set) var finished = false
        var complete: Bool { finished }

        init(maxAnswerBytes: Int = 4 << 20) { self.maxAnswerBytes = maxAnswerBytes }

        mutating func add(_ event: ServerSentEventParser.Event) throws -> String {
            let decoded: Event
            do {
                decoded = try JSONDecoder().decode(Event.self, from: Data(event.data.utf8))
            } catch {
                throw ModelCallError(.badResponse, "the provider sent an event that is not a Responses API event: \(event.data.prefix(200))")
            }
            var added = ""
            switch decoded.type ?? event.type ?? "" {
            case "response.output_text.delta":
                added = decoded.delta ?? ""
                text += added
            case "response.output_item.added", "response.output_item.done":
                if let item = decoded.item, item.type == "function_call", let index = decoded.output_index {
                    var entry = calls[index] ?? (id: "", name: "", arguments: "")
                    if let id = item.call_id { entry.id = id }
                    if let name = item.name { entry.name = name }
                    if let arguments = item.arguments, !arguments.isEmpty { entry.arguments = arguments }
                    calls[index] = entry
                }
            case "response.function_call_arguments.delta":
                if let index = decoded.output_index {
                    calls[index, default: (id: "", name: "", arguments: "")].arguments += decoded.delta ?? ""
                }
            case "response.function_call_arguments.done":
                if let index = decoded.output_index, let arguments = decoded.arguments {
                    calls[index, default: (id: "", name: "", arguments: "")].arguments = arguments
                }
            case "response.completed":
                if let usage = decoded.response?.usage {
                    let input = usage.input_tokens ?? 0
                    let output = usage.output_tokens ?? 0
                    self.usage = TokenUsage(inputTokens: input, outputTokens: output, totalTokens: usage.total_tokens ?? input + output)
                }
                finished = true
            case "response.failed", "error":
                let message = decoded.response?.error?.message ?? decoded.message ?? "unknown"
                throw ModelCallError(.providerError, "the provider reported an error mid-stream: \(message)")
            default:
                break  // created, in_progress, content_part, ...: nothing to keep
            }
            guard text.utf8.count + calls.values.reduce(0, { $0 + $1.arguments.utf8.count }) <= maxAnswerBytes else {
                throw ModelCallError(.badResponse, "the provider's answer exceeds \(maxAnswerBytes) bytes")
            }
            return added
        }

        func response() throws -> ModelResponse {
            var outputs: [ModelOutput] = []
            if !text.isEmpty || calls.isEmpty { outputs.append(.message(text)) }
            for index in calls.keys.sorted() {
                let call = calls[index]!
                guard !call.name.isEmpty else {
                    throw ModelCallError(.badResponse, "the provider streamed a function call without a name (output \(index))")
                }
                outputs.append(.toolCall(name: call.name, arguments: call.arguments, callID: call.id.isEmpty ? "call_\(index)" : call.id))
            }
            return ModelResponse(outputs: outputs, usage: usage)
        }
    }
}
