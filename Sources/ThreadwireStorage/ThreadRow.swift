import Foundation
public import ThreadwireCore

/// A `threads` row by column name: the one mapping between a `ThreadRecord`
/// and the columns every store keeps (SQLite and PostgreSQL have the same
/// columns). Encodable by column name for stores that write rows as JSON
/// (PostgreSQL's `jsonb_populate_record`).
public struct ThreadRow: Encodable, Sendable, Equatable {
    public var id, session_id: String
    public var parent_id, forked_from_id: String?
    public var source: String
    public var depth: Int64
    public var task_name, nickname: String?
    public var preview: String
    public var name: String?
    public var created_at, updated_at: Int64
    public var archived: Bool
    public var runtime: String?
    public var legacy: Bool
    public var selected_mode: String?
    public var model, cwd: String
    public var base_instructions: String?
    public var config_overrides: String
    public var version: Int64
    public var agent_status, agent_final_message: String?
    public var agent_closed: Bool
    /// The principal the thread belongs to (the column kept its first name).
    public var owner: String
    /// JSON (`ToolSettings`): the thread's client tools.
    public var tool_settings: String
    public var agent_role: String?
    /// The number of the thread's newest kept event.
    public var event_sequence: Int64

    /// The `tool_settings` column's JSON.
    struct ToolSettings: Codable, Equatable {
        struct Tool: Codable, Equatable {
            var name: String
            var description: String
            var parameters_json_schema: String
            var requires_approval: Bool?
        }
        var client_tools: [Tool]?
        var approval_policy: ApprovalPolicy?
        var user_input: Bool?
        var tree_approvals: [String]?
        var mcp_servers: [String]?
        var reasoning_effort: String?
        var reasoning_summary: String?
        var queue: [QueuedTurn]?
        var pause_after_tools: Bool?
        var forked_at_turn_id: String?
    }

    public init(_ r: ThreadRecord) throws {
        id = r.id; session_id = r.sessionID; parent_id = r.parentID; forked_from_id = r.forkedFromID
        source = r.source.rawValue; depth = Int64(r.depth); task_name = r.taskName; nickname = r.nickname
        preview = r.preview; name = r.name; created_at = r.createdAt; updated_at = r.updatedAt
        archived = r.archived; runtime = r.runtime?.rawValue; legacy = r.legacy
        selected_mode = r.selectedMode?.rawValue; model = r.model; cwd = r.cwd
        base_instructions = r.baseInstructions
        // The common empty cases spelled out: a JSONEncoder per row was a few
        // per cent of a commit's CPU (the same bytes it writes for them).
        config_overrides = r.configOverrides.isEmpty ? "[]" : String(decoding: try JSONEncoder().encode(r.configOverrides), as: UTF8.self)
        version = r.version; agent_status = r.agentStatus?.rawValue; agent_final_message = r.agentFinalMessage
        agent_closed = r.agentClosed; owner = r.principal
        let tools = ToolSettings(client_tools: r.clientTools.isEmpty ? nil : r.clientTools.map {
            ToolSettings.Tool(name: $0.name, description: $0.description, parameters_json_schema: $0.parametersSchema,
                              requires_approval: $0.requiresApproval ? true : nil)
        }, approval_policy: r.approvalPolicy == .never ? nil : r.approvalPolicy, user_input: r.userInputEnabled ? true : nil,
           tree_approvals: r.treeApprovals.isEmpty ? nil : r.treeApprovals, mcp_servers: r.mcpServers.isEmpty ? nil : r.mcpServers,
           reasoning_effort: r.reasoning.effort, reasoning_summary: r.reasoning.summary, queue: r.queue.isEmpty ? nil : r.queue,
           pause_after_tools: r.pauseAfterTools ? true : nil, forked_at_turn_id: r.forkedAtTurnID)
        if tools == ToolSettings() {
            tool_settings = "{}"
        } else {
            let encoder = JSONEncoder()
            encoder.outputFormatting = .sortedKeys
            tool_settings = String(decoding: try encoder.encode(tools), as: UTF8.self)
        }
        agent_role = r.agentRole
        event_sequence = r.eventSequence
    }

    /// A row as a store read it, column by column.
    public init(reading row: some ColumnReader) throws {
        id = try row.text("id"); session_id = try row.text("session_id")
        parent_id = try row.optionalText("parent_id"); forked_from_id = try row.optionalText("forked_from_id")
        source = try row.text("source"); depth = try row.integer("depth")
        task_name = try row.optionalText("task_name"); nickname = try row.optionalText("nickname")
        preview = try row.text("preview"); name = try row.optionalText("name")
        created_at = try row.integer("created_at"); updated_at = try row.integer("updated_at")
        archived = try row.boolean("archived"); runtime = try row.optionalText("runtime"); legacy = try row.boolean("legacy")
        selected_mode = try row.optionalText("selected_mode"); model = try row.text("model"); cwd = try row.text("cwd")
        base_instructions = try row.optionalText("base_instructions"); config_overrides = try row.text("config_overrides")
        version = try row.integer("version"); agent_status = try row.optionalText("agent_status")
        agent_final_message = try row.optionalText("agent_final_message"); agent_closed = try row.boolean("agent_closed")
        owner = try row.text("owner")
        tool_settings = try row.text("tool_settings")
        agent_role = try row.optionalText("agent_role")
        event_sequence = try row.integer("event_sequence")
    }

    public func record() throws -> ThreadRecord {
        var record = ThreadRecord(
            id: id, sessionID: session_id, source: ThreadSourceKind(rawValue: source) ?? .appServer, depth: Int(depth),
            createdAt: created_at, model: model, cwd: cwd)
        record.parentID = parent_id
        record.forkedFromID = forked_from_id
        record.taskName = task_name
        record.nickname = nickname
        record.agentRole = agent_role
        record.preview = preview
        record.name = name
        record.updatedAt = updated_at
        record.archived = archived
        record.runtime = runtime.flatMap(MultiAgentRuntime.init(rawValue:))
        record.legacy = legacy
        record.selectedMode = selected_mode.flatMap(MultiAgentMode.init(rawValue:))
        record.baseInstructions = base_instructions
        do {
            record.configOverrides = try JSONDecoder().decode([KeyValuePair].self, from: Data(config_overrides.utf8))
        } catch {
            throw StoreError.unavailable("thread \(id) has unreadable config_overrides: \(error)")
        }
        record.version = version
        record.eventSequence = event_sequence
        record.agentStatus = agent_status.flatMap(AgentStatus.init(rawValue:))
        record.agentFinalMessage = agent_final_message
        record.agentClosed = agent_closed
        record.principal = owner
        do {
            let tools = try JSONDecoder().decode(ToolSettings.self, from: Data(tool_settings.utf8))
            record.clientTools = (tools.client_tools ?? []).map {
                ToolSpec(name: $0.name, namespace: "", description: $0.description, parametersSchema: $0.parameters_json_schema,
                         requiresApproval: $0.requires_approval ?? false)
            }
            record.approvalPolicy = tools.approval_policy ?? .never
            record.userInputEnabled = tools.user_input ?? false
            record.treeApprovals = tools.tree_approvals ?? []
            record.mcpServers = tools.mcp_servers ?? []
            record.reasoning = Reasoning(effort: tools.reasoning_effort, summary: tools.reasoning_summary)
            record.queue = tools.queue ?? []
            record.pauseAfterTools = tools.pause_after_tools ?? false
            record.forkedAtTurnID = tools.forked_at_turn_id
        } catch {
            throw StoreError.unavailable("thread \(id) has unreadable tool_settings: \(error)")
        }
        return record
    }

    /// A column a versioned write replaces: its name, the kind of its
    /// values, and a row's value.
    public struct ChangeableColumn: Sendable {
        public let name: String
        public let kind: ColumnValue.Kind
        public let value: @Sendable (ThreadRow) -> ColumnValue

        static func text(_ name: String, _ value: @escaping @Sendable (ThreadRow) -> String?) -> Self {
            Self(name: name, kind: .text) { .text(value($0)) }
        }

        static func integer(_ name: String, _ value: @escaping @Sendable (ThreadRow) -> Int64) -> Self {
            Self(name: name, kind: .integer) { .integer(value($0)) }
        }

        static func boolean(_ name: String, _ value: @escaping @Sendable (ThreadRow) -> Bool) -> Self {
            Self(name: name, kind: .boolean) { .boolean(value($0)) }
        }
    }

    /// The columns a versioned write replaces (all but `id` and `owner`,
    /// which never change), in the order of `changeableColumns` and
    /// `changeableValues`.
    public static let changeable: [ChangeableColumn] = [
        .text("session_id") { $0.session_id }, .text("parent_id") { $0.parent_id },
        .text("forked_from_id") { $0.forked_from_id }, .text("source") { $0.source }, .integer("depth") { $0.depth },
        .text("task_name") { $0.task_name }, .text("nickname") { $0.nickname }, .text("preview") { $0.preview },
        .text("name") { $0.name }, .integer("created_at") { $0.created_at }, .integer("updated_at") { $0.updated_at },
        .boolean("archived") { $0.archived }, .text("runtime") { $0.runtime }, .boolean("legacy") { $0.legacy },
        .text("selected_mode") { $0.selected_mode }, .text("model") { $0.model }, .text("cwd") { $0.cwd },
        .text("base_instructions") { $0.base_instructions }, .text("config_overrides") { $0.config_overrides },
        .integer("version") { $0.version }, .text("agent_status") { $0.agent_status },
        .text("agent_final_message") { $0.agent_final_message }, .boolean("agent_closed") { $0.agent_closed },
        .text("tool_settings") { $0.tool_settings }, .text("agent_role") { $0.agent_role },
        .integer("event_sequence") { $0.event_sequence },
    ]

    public static let changeableColumns = changeable.map(\.name)

    public var changeableValues: [ColumnValue] {
        var values: [ColumnValue] = []
        values.reserveCapacity(Self.changeable.count)
        appendChangeableValues(to: &values)
        return values
    }

    /// The row's changeable values, appended in place: the row is borrowed
    /// once for all of them (handed to each column's closure from outside,
    /// it was copied, every string retained, once per column).
    public func appendChangeableValues(to values: inout [ColumnValue]) {
        for column in Self.changeable { values.append(column.value(self)) }
    }
}

/// One column's value, for a store that binds values by position.
public enum ColumnValue: Sendable, Equatable {
    case text(String?)
    case integer(Int64)
    case boolean(Bool)

    public enum Kind: Sendable { case text, integer, boolean }
}

/// How a store reads one row's columns by name.
public protocol ColumnReader {
    func text(_ column: String) throws -> String
    func optionalText(_ column: String) throws -> String?
    func integer(_ column: String) throws -> Int64
    func boolean(_ column: String) throws -> Bool
}
