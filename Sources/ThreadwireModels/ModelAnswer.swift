import Foundation
import ThreadwireCore

/// What both wire formats share: how a persisted model request's items and
/// tools are sent, and how a streamed answer is put together.
enum WireMapping {
    enum Item {
        /// A message: base instructions and developer items (usage hint,
        /// mode fragment, markers) go as "system", since not every compatible
        /// server knows "developer".
        case message(role: String, content: String)
        case toolCall(callID: String, name: String, arguments: String)
        case toolOutput(callID: String, output: String)
    }

    static func item(_ item: ContextItem) -> Item {
        switch item.role {
        case .system, .developer: return .message(role: "system", content: item.text)
        case .user: return .message(role: "user", content: item.text)
        case .assistant where item.kind == .toolCall:
            return .toolCall(callID: item.callID ?? "", name: item.toolName ?? "", arguments: item.text)
        case .assistant: return .message(role: "assistant", content: item.text)
        case .tool: return .toolOutput(callID: item.callID ?? "", output: item.text)
        }
    }

    /// The tool's argument schema as a JSON object (the one `ToolSpec` carries).
    static func parameters(_ tool: ToolSpec) throws -> Any {
        guard !tool.parametersSchema.isEmpty else { return ["type": "object", "properties": [String: Any]()] as [String: Any] }
        return try JSONSerialization.jsonObject(with: Data(tool.parametersSchema.utf8))
    }
}

/// A streamed answer as it arrives: the message's text, tool calls by their
/// index (their pieces may arrive in any order), the usage. Bounded: an
/// answer larger than `maxAnswerBytes` (text plus arguments) is refused, as
/// it could not be stored or sent in a frame anyway, and a provider that
/// streams without end must not grow the server's memory.
struct ModelAnswer {
    struct Call {
        var id: String?
        var name = ""
        var arguments = ""
    }

    let maxAnswerBytes: Int
    private var text = ""
    private var calls: [Int: Call] = [:]
    private var size = 0
    var usage: TokenUsage?

    init(maxAnswerBytes: Int) { self.maxAnswerBytes = maxAnswerBytes }

    var callCount: Int { calls.count }

    mutating func append(text piece: String) throws {
        text += piece
        try grew(by: piece.utf8.count)
    }

    /// Changes call `index` (created empty when new).
    mutating func call(_ index: Int, _ change: (inout Call) -> Void) throws {
        var call = calls[index] ?? Call()
        let before = call.arguments.utf8.count
        change(&call)
        calls[index] = call
        try grew(by: call.arguments.utf8.count - before)
    }

    private mutating func grew(by bytes: Int) throws {
        size += bytes
        guard size <= maxAnswerBytes else {
            throw ModelCallError(.badResponse, "the provider's answer exceeds \(maxAnswerBytes) bytes")
        }
    }

    /// The message (if any text came, or nothing else did), then the calls in index order.
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
