import Foundation

/// The collaboration tools offered to the model, one table per runtime. Each
/// entry is the whole tool: its parameters, declared once (the JSON Schema
/// sent to the provider and carried by `ToolSpec`, and the validation of the
/// model's arguments, both come from that declaration, so they cannot
/// disagree), the type its arguments decode to, when it runs, and the
/// engine method that runs it. Nothing else knows a tool by its name.
public enum ToolCatalog {
    public static let v1Namespace = "multi_agent_v1"
    public static let v2Namespace = "collaboration"

    static let v1: [ToolDefinition] = [
        ToolDefinition("spawn_agent", "Start a sub-agent with a first message. Returns {agent_id, nickname}.", [
            .string("message", "The sub-agent's first instructions.", required: true),
            .string("model", "The model the sub-agent runs on; default: this thread's."),
        ], ToolArguments.Spawn.self) { try await $0.spawnAgentTool($1, $2) },
        ToolDefinition("send_input", "Send input to a sub-agent and start its turn. Returns {submission_id}.", [
            .string("target", "The sub-agent's id.", required: true),
            .string("message", "The input.", required: true),
        ], ToolArguments.TargetedMessage.self) { try await $0.startTaskTool($1, $2) },
        ToolDefinition("wait_agent", "Wait until sub-agents reach a final status. Returns {status, messages, timed_out}.", [
            .strings("targets", "Sub-agent ids; default: every open sub-agent of this thread."),
            .integer("timeout_ms", "How long to wait at most, in milliseconds."),
        ], ToolArguments.Wait.self, phase: .beforeCommit) { await $0.waitAgentTool($1, $2) },
        ToolDefinition("resume_agent", "Reopen a closed sub-agent. Returns {status}.", [
            .string("id", "The sub-agent's id.", required: true),
        ], ToolArguments.Resume.self) { try await $0.resumeAgentTool($1, $2) },
        ToolDefinition("close_agent", "Close a sub-agent (interrupting its turn). Returns {status}.", [
            .string("target", "The sub-agent's id.", required: true),
        ], ToolArguments.Target.self) { try await $0.closeAgentTool($1, $2) },
    ]

    static let v2: [ToolDefinition] = [
        ToolDefinition("spawn_agent", "Start a sub-agent on a task. Returns {task_name, nickname}.", [
            .string("task_name", "A short name for the task; the agent's path becomes <your path>/<task_name>.", required: true),
            .string("message", "The task.", required: true),
            .string("model", "The model the sub-agent runs on; default: this thread's."),
        ], ToolArguments.Spawn.self) { try await $0.spawnAgentTool($1, $2) },
        ToolDefinition("send_message", "Queue a message for an agent without starting a turn. Returns {queued}.", [
            .string("target", "The agent's task path, task name or id.", required: true),
            .string("message", "The message.", required: true),
        ], ToolArguments.TargetedMessage.self) { try await $0.sendMessageTool($1, $2) },
        ToolDefinition("followup_task", "Give a sub-agent a follow-up task (starts its turn). Returns {submission_id}.", [
            .string("target", "The agent's task path, task name or id.", required: true),
            .string("message", "The follow-up task.", required: true),
        ], ToolArguments.TargetedMessage.self) { try await $0.startTaskTool($1, $2) },
        ToolDefinition("wait_agent", "Wait until agents reach a final status. Returns {status, messages, timed_out}.", [
            .strings("targets", "Task paths, task names or ids; default: every open sub-agent of this thread."),
            .integer("timeout_ms", "How long to wait at most, in milliseconds."),
        ], ToolArguments.Wait.self, phase: .beforeCommit) { await $0.waitAgentTool($1, $2) },
        ToolDefinition("list_agents", "List the agents below this one. Returns {agents}.", [
            .string("path_prefix", "Only agents whose task path starts with this."),
        ], ToolArguments.List.self) { try await $0.listAgentsTool($1, $2) },
        ToolDefinition("close_agent", "Close a sub-agent (interrupting its turn). Returns {status}.", [
            .string("target", "The agent's task path, task name or id.", required: true),
        ], ToolArguments.Target.self) { try await $0.closeAgentTool($1, $2) },
    ]

    /// - Parameters:
    ///   - depth: the thread's own depth (root 0).
    public static func offered(runtime: MultiAgentRuntime?, depth: Int, maxDepth: Int, source: ThreadSourceKind) -> [ToolSpec] {
        if source == .review { return [] }
        switch runtime {
        case nil, .disabled?:
            return []
        case .v1?:
            // V1 hides spawning once the next spawn would exceed the depth limit.
            let canSpawn = depth + 1 <= maxDepth
            return v1.filter { canSpawn || $0.name != "spawn_agent" }.map { $0.spec(namespace: v1Namespace) }
        case .v2?:
            return v2.map { $0.spec(namespace: v2Namespace) }
        }
    }

    /// The definition of a tool of `runtime`'s table.
    static func definition(_ name: String, runtime: MultiAgentRuntime?) -> ToolDefinition? {
        (runtime == .v2 ? v2 : v1).first { $0.name == name }
    }

    /// The definition of a tool the model was offered in this request; nil
    /// for a name it was not offered (the model made it up, or it was not
    /// available at this depth).
    static func offeredDefinition(_ name: String, runtime: MultiAgentRuntime?, offered: [ToolSpec]) -> ToolDefinition? {
        guard offered.contains(where: { $0.name == name }) else { return nil }
        return definition(name, runtime: runtime)
    }
}

/// When a tool runs within a turn's step.
enum ToolPhase: Sendable {
    /// Under the caller's gate, its effects in the step's commit.
    case inCommit
    /// Before the step's commit, with no gate held (wait_agent waits for
    /// other threads, which must be able to change meanwhile).
    case beforeCommit
}

/// One call of a tool: the thread that called it and its running turn.
struct ToolInvocation {
    let owner: ThreadOwner
    /// The caller as it is when the tool runs (under its gate, for `inCommit`).
    let caller: StoredThread
    let turnIndex: Int
    var runtime: MultiAgentRuntime { caller.record.runtime ?? .disabled }
}

/// A tool: name, description, parameters, argument type and executor.
struct ToolDefinition: Sendable {
    struct Parameter: Sendable {
        enum Kind: Sendable { case string, integer, strings }
        let name: String
        let kind: Kind
        let description: String
        let required: Bool

        static func string(_ name: String, _ description: String, required: Bool = false) -> Parameter {
            Parameter(name: name, kind: .string, description: description, required: required)
        }
        static func integer(_ name: String, _ description: String, required: Bool = false) -> Parameter {
            Parameter(name: name, kind: .integer, description: description, required: required)
        }
        static func strings(_ name: String, _ description: String, required: Bool = false) -> Parameter {
            Parameter(name: name, kind: .strings, description: description, required: required)
        }
    }

    typealias Executor = @Sendable (ThreadEngine, ToolInvocation, ToolDefinition, String) async throws -> ThreadEngine.ToolResult

    let name: String
    let description: String
    let parameters: [Parameter]
    /// JSON text, keys sorted: the same bytes every time.
    let schema: String
    let phase: ToolPhase
    private let executor: Executor

    init<Arguments: Decodable>(_ name: String, _ description: String, _ parameters: [Parameter], _: Arguments.Type,
                               phase: ToolPhase = .inCommit,
                               execute: @escaping @Sendable (ThreadEngine, ToolInvocation, Arguments) async throws -> ThreadEngine.ToolResult) {
        self.name = name
        self.description = description
        self.parameters = parameters
        self.phase = phase
        executor = { engine, invocation, definition, arguments in
            try await execute(engine, invocation, try definition.decode(arguments, as: Arguments.self))
        }
        var properties: [String: Any] = [:]
        for parameter in parameters {
            switch parameter.kind {
            case .string: properties[parameter.name] = ["type": "string", "description": parameter.description]
            case .integer: properties[parameter.name] = ["type": "integer", "minimum": 0, "description": parameter.description]
            case .strings:
                properties[parameter.name] = ["type": "array", "items": ["type": "string"], "description": parameter.description]
            }
        }
        schema = jsonText([
            "type": "object", "properties": properties, "required": parameters.filter(\.required).map(\.name),
            "additionalProperties": false,
        ])
    }

    /// Checks and decodes the model's arguments, then runs the tool. A
    /// thrown error is the tool's failure, shown to the model as its output.
    func execute(_ engine: ThreadEngine, _ invocation: ToolInvocation, arguments: String) async throws -> ThreadEngine.ToolResult {
        try await executor(engine, invocation, self, arguments)
    }

    func spec(namespace: String) -> ToolSpec {
        ToolSpec(name: name, namespace: namespace, description: description, parametersSchema: schema)
    }

    /// The model's arguments, checked against the parameters (an object, no
    /// unknown keys, required ones present, each of its type), then decoded.
    func decode<Arguments: Decodable>(_ arguments: String, as _: Arguments.Type = Arguments.self) throws -> Arguments {
        let data = Data((arguments.isEmpty ? "{}" : arguments).utf8)
        if JSONNesting.tooDeep(arguments) {
            throw ToolArgumentError("arguments of \(name) nest deeper than \(JSONNesting.limit) levels")
        }
        guard case let .object(object)? = try? JSONDecoder().decode(LooseJSON.self, from: data) else {
            throw ToolArgumentError("arguments of \(name) must be a JSON object, got: \(arguments.prefix(200))")
        }
        for key in object.keys.sorted() where !parameters.contains(where: { $0.name == key }) {
            throw ToolArgumentError("\(name) has no argument '\(key)'; its arguments are: \(parameters.map(\.name).joined(separator: ", "))")
        }
        for parameter in parameters {
            guard let value = object[parameter.name], value != .null else {
                if parameter.required { throw ToolArgumentError("\(name) needs the argument '\(parameter.name)'") }
                continue
            }
            switch (parameter.kind, value) {
            case (.string, .string):
                break
            case (.strings, .array) where value.isArrayOfStrings:
                break
            case let (.integer, .integer(number)) where number >= 0:
                break
            default:
                let expected: String
                switch parameter.kind {
                case .string: expected = "a string"
                case .integer: expected = "a non-negative integer"
                case .strings: expected = "an array of strings"
                }
                throw ToolArgumentError("argument '\(parameter.name)' of \(name) must be \(expected)")
            }
        }
        do {
            return try JSONDecoder().decode(Arguments.self, from: data)
        } catch {
            throw ToolArgumentError("arguments of \(name) could not be read: \(error)")
        }
    }

}

/// Any JSON value, to check the model's arguments before decoding them.
enum LooseJSON: Decodable, Equatable {
    case null, bool(Bool), integer(Int64), number(Double), string(String)
    case array([LooseJSON]), object([String: LooseJSON])

    init(from decoder: any Decoder) throws {
        let container = try decoder.singleValueContainer()
        if container.decodeNil() {
            self = .null
        } else if let value = try? container.decode(Bool.self) {
            self = .bool(value)
        } else if let value = try? container.decode(Int64.self) {
            self = .integer(value)
        } else if let value = try? container.decode(Double.self) {
            self = .number(value)
        } else if let value = try? container.decode(String.self) {
            self = .string(value)
        } else if let value = try? container.decode([LooseJSON].self) {
            self = .array(value)
        } else {
            self = .object(try container.decode([String: LooseJSON].self))
        }
    }

    var isArrayOfStrings: Bool {
        guard case let .array(items) = self else { return false }
        return items.allSatisfy { if case .string = $0 { true } else { false } }
    }
}

/// Arguments the model got wrong; the model sees the message as the tool's output.
struct ToolArgumentError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

/// The collaboration tools' arguments.
enum ToolArguments {
    struct Spawn: Decodable {
        var message: String
        var model: String?
        var task_name: String?
    }
    struct TargetedMessage: Decodable {
        var target: String
        var message: String
    }
    struct Target: Decodable {
        var target: String
    }
    struct Resume: Decodable {
        var id: String
    }
    struct Wait: Decodable {
        var targets: [String]?
        var timeout_ms: Int?
    }
    struct List: Decodable {
        var path_prefix: String?
    }
}
