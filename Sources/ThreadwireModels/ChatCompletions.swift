public import Foundation
public import ThreadwireCore

/// The Chat Completions wire format (`POST {base_url}/chat/completions` with
/// `stream: true`), as OpenAI, Ollama, vLLM and llama.cpp's server speak it.
public enum ChatCompletions {
    /// The request body for a model request: exactly what thread/read shows
    /// as the turn's model request, mapped message by message.
    /// - Developer items (usage hint, mode fragment, markers) are sent with the
    ///   "system" role: not every compatible server knows "developer".
    /// - A tool call is an assistant message with one `tool_calls` entry; its
    ///   output is a "tool" message with the same `tool_call_id`.
    public static func body(for request: ModelRequest) throws -> Data {
        var messages: [[String: Any]] = []
        for item in request.context {
            switch item.role {
            case .system, .developer:
                messages.append(["role": "system", "content": item.text])
            case .user:
                messages.append(["role": "user", "content": item.text])
            case .assistant:
                if item.kind == .toolCall {
                    messages.append([
                        "role": "assistant", "content": NSNull(),
                        "tool_calls": [[
                            "id": item.callID ?? "", "type": "function",
                            "function": ["name": item.toolName ?? "", "arguments": item.text],
                        ]],
                    ])
                } else {
                    messages.append(["role": "assistant", "content": item.text])
                }
            case .tool:
                messages.append(["role": "tool", "tool_call_id": item.callID ?? "", "content": item.text])
            }
        }
        var body: [String: Any] = [
            "model": request.model, "stream": true, "stream_options": ["include_usage": true], "messages": messages,
        ]
        if !request.tools.isEmpty {
            body["tools"] = try request.tools.map { tool -> [String: Any] in
                let schema = tool.parametersSchema.isEmpty
                    ? ["type": "object", "properties": [String: Any]()] as [String: Any]
                    : try JSONSerialization.jsonObject(with: Data(tool.parametersSchema.utf8))
                return ["type": "function", "function": ["name": tool.name, "description": tool.description, "parameters": schema]]
            }
        }
        return try JSONSerialization.data(withJSONObject: body, options: [.sortedKeys])
    }

    /// One streamed chunk (every field optional: servers differ).
    struct Chunk: Decodable {
        struct Choice: Decodable {
            struct Delta: Decodable {
                struct ToolCall: Decodable {
                    struct Function: Decodable {
                        var name: String?
                        var arguments: String?
                    }
                    var index: Int?
                    var id: String?
                    var function: Function?
                }
                var content: String?
                var tool_calls: [ToolCall]?
            }
            var delta: Delta?
            var finish_reason: String?
        }
        struct Usage: Decodable {
            var prompt_tokens: Int?
            var completion_tokens: Int?
            var total_tokens: Int?
        }
        struct APIError: Decodable {
            var message: String?
            var type: String?
        }
        var choices: [Choice]?
        var usage: Usage?
        var error: APIError?
    }

    /// Builds the answer from the stream's chunks.
    struct Accumulator {
        /// An answer (text plus tool arguments) larger than this is refused:
        /// it could not be stored or sent in a frame anyway, and a provider
        /// that streams without end must not grow the server's memory.
        let maxAnswerBytes: Int
        private var text = ""
        private var calls: [Int: (id: String?, name: String, arguments: String)] = [:]
        private var usage: TokenUsage?
        private(set) var finished = false
        private(set) var sawDone = false

        init(maxAnswerBytes: Int = 4 << 20) { self.maxAnswerBytes = maxAnswerBytes }

        /// Applies one `data:` payload; returns the text it adds to the message.
        mutating func add(_ payload: String) throws -> String {
            if payload == "[DONE]" {
                finished = true
                sawDone = true
                return ""
            }
            let chunk: Chunk
            do {
                chunk = try JSONDecoder().decode(Chunk.self, from: Data(payload.utf8))
            } catch {
                throw ModelCallError(.badResponse, "the provider sent an event that is not a chat completion chunk: \(payload.prefix(200))")
            }
            if let error = chunk.error {
                throw ModelCallError(.providerError, "the provider reported an error mid-stream: \(error.message ?? error.type ?? "unknown")")
            }
            if let usage = chunk.usage {
                let input = usage.prompt_tokens ?? 0
                let output = usage.completion_tokens ?? 0
                self.usage = TokenUsage(inputTokens: input, outputTokens: output, totalTokens: usage.total_tokens ?? input + output)
            }
            var added = ""
            for choice in chunk.choices ?? [] {
                if let content = choice.delta?.content {
                    added += content
                }
                for call in choice.delta?.tool_calls ?? [] {
                    let index = call.index ?? calls.count
                    var entry = calls[index] ?? (id: nil, name: "", arguments: "")
                    if let id = call.id, !id.isEmpty { entry.id = id }
                    if let name = call.function?.name { entry.name += name }
                    if let arguments = call.function?.arguments { entry.arguments += arguments }
                    calls[index] = entry
                }
                if choice.finish_reason != nil { finished = true }
            }
            text += added
            guard text.utf8.count + calls.values.reduce(0, { $0 + $1.arguments.utf8.count }) <= maxAnswerBytes else {
                throw tooLarge()
            }
            return added
        }

        private func tooLarge() -> ModelCallError {
            ModelCallError(.badResponse, "the provider's answer exceeds \(maxAnswerBytes) bytes")
        }

        func response() throws -> ModelResponse {
            var outputs: [ModelOutput] = []
            if !text.isEmpty || calls.isEmpty { outputs.append(.message(text)) }
            for index in calls.keys.sorted() {
                let call = calls[index]!
                guard !call.name.isEmpty else {
                    throw ModelCallError(.badResponse, "the provider streamed a tool call without a name (index \(index))")
                }
                // Malformed arguments are the tool's business: the model reads the error.
                outputs.append(.toolCall(name: call.name, arguments: call.arguments, callID: call.id ?? "call_\(index)"))
            }
            return ModelResponse(outputs: outputs, usage: usage)
        }
    }
}
