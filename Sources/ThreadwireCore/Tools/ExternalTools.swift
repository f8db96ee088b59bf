// The tools whose calls someone other than the server runs or answers (a
// client, the user, an MCP server), and how their calls and answers are
// written into a turn.

extension ModelOutput {
    /// How an output waits in a stored turn (`deferredOutputs`).
    var contextItem: ContextItem {
        switch self {
        case let .message(text): return ContextItem(role: .assistant, kind: .assistantMessage, text: text)
        case let .toolCall(name, arguments, callID):
            return ContextItem(role: .assistant, kind: .toolCall, text: arguments, toolName: name, callID: callID)
        }
    }
}

extension ContextItem {
    var modelOutput: ModelOutput? {
        switch kind {
        case .assistantMessage: return .message(text)
        case .toolCall: return .toolCall(name: toolName ?? "", arguments: text, callID: callID ?? "")
        default: return nil
        }
    }
}

/// A tool whose calls someone other than the server runs or answers.
enum ExternalTool: Sendable {
    case client(ToolSpec)
    case userInput
    case mcp(HostedTool)

    /// As traces name where a tool runs.
    var sourceName: String {
        switch self {
        case .client: "client"
        case .userInput: "user_input"
        case .mcp: "mcp"
        }
    }

    var spec: ToolSpec {
        switch self {
        case let .client(spec): return spec
        case .userInput: return UserInputTool.spec
        case let .mcp(hosted): return hosted.spec
        }
    }

    var source: ToolSource {
        switch self {
        case .client: return .client
        case .userInput: return .builtin
        case .mcp: return .mcp
        }
    }

    var requiresApproval: Bool { spec.requiresApproval }

    /// The request a call starts with when no approval comes first (nil:
    /// the server runs it).
    func firstRequest(itemID: String, arguments: String, callID: String) -> ServerRequestRecord.Kind? {
        switch self {
        case .mcp:
            return nil
        case let .client(spec):
            return .toolCall(itemID: itemID, tool: spec.name, arguments: arguments, callID: callID)
        case .userInput:
            let fields = LooseJSON.fields(arguments)
            return .userInput(itemID: itemID, question: fields?["question"]?.stringValue ?? "",
                              choices: fields?["choices"]?.arrayValue?.compactMap(\.stringValue) ?? [], callID: callID)
        }
    }
}

/// The built-in tool the model asks the user with (enabled per thread).
public enum UserInputTool {
    public static let name = "request_user_input"
    public static let spec = ToolSpec(
        name: name, namespace: "",
        description: "Ask the user a question and wait for the answer. Use it only for a decision or information that only the user has.",
        parametersSchema: #"{"type":"object","properties":{"question":{"type":"string","minLength":1,"maxLength":4000},"choices":{"type":"array","items":{"type":"string"},"maxItems":16}},"required":["question"],"additionalProperties":false}"#)
}

extension ServerRequestRecord.Kind {
    /// The called tool's name and the model's call id.
    var toolAndCall: (tool: String, callID: String) {
        switch self {
        case let .toolCall(_, tool, _, callID), let .approval(_, tool, _, callID, _, _): return (tool, callID)
        case let .userInput(_, _, _, callID): return (UserInputTool.name, callID)
        }
    }
}

extension ClientCapability {
    /// The server request method a capability answers.
    var method: String {
        switch self {
        case .clientTools: return "item/tool/call"
        case .approvals: return "item/tool/request_approval"
        case .userInput: return "item/tool/request_user_input"
        }
    }
}
