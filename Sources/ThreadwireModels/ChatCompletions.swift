public import Foundation
public import ThreadwireCore

/// The Chat Completions wire format (`POST {base_url}/chat/completions` with
/// `stream: true`), as OpenAI, Ollama, vLLM and llama.cpp's server speak it.
public enum ChatCompletions {
    /// The request body for a model request: exactly what thread/read shows
    /// as the turn's model request, mapped message by message.
    /// - Developer items go as "system" (`WireMapping.item`).
    /// - A tool call is an assistant message with one `tool_calls` entry; its
    ///   output is a "tool" message with the same `tool_call_id`.
    public static func body(for request: ModelRequest) throws -> Data {
        let messages = request.context.map { item -> [String: Any] in
            switch WireMapping.item(item) {
            case let .message(role, content):
                return ["role": role, "content": content]
            case let .toolCall(callID, name, arguments):
                return ["role": "assistant", "content": NSNull(),
                        "tool_calls": [["id": callID, "type": "function", "function": ["name": name, "arguments": arguments]]]]
            case let .toolOutput(callID, output):
                return ["role": "tool", "tool_call_id": callID, "content": output]
            }
        }
        var body: [String: Any] = [
            "model": request.model, "stream": true, "stream_options": ["include_usage": true], "messages": messages,
        ]
        // Chat Completions takes an effort only (a summary is the Responses API's).
        if let effort = request.reasoning.effort { body["reasoning_effort"] = effort }
        if !request.tools.isEmpty {
            body["tools"] = try request.tools.map { tool -> [String: Any] in
                ["type": "function",
                 "function": ["name": tool.name, "description": tool.description, "parameters": try WireMapping.parameters(tool)]]
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
        private var answer: ModelAnswer
        private(set) var finished = false
        private(set) var sawDone = false

        init(maxAnswerBytes: Int = 4 << 20) { answer = ModelAnswer(maxAnswerBytes: maxAnswerBytes) }

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
                answer.usage = TokenUsage(inputTokens: input, outputTokens: output, totalTokens: usage.total_tokens ?? input + output)
            }
            var added = ""
            for choice in chunk.choices ?? [] {
                if let content = choice.delta?.content {
                    try answer.append(text: content)
                    added += content
                }
                for call in choice.delta?.tool_calls ?? [] {
                    try answer.call(call.index ?? answer.callCount) { entry in
                        if let id = call.id, !id.isEmpty { entry.id = id }
                        // Names and arguments may both come in pieces.
                        entry.name += call.function?.name ?? ""
                        entry.arguments += call.function?.arguments ?? ""
                    }
                }
                if choice.finish_reason != nil { finished = true }
            }
            return added
        }

        func response() throws -> ModelResponse { try answer.response() }
    }
}
