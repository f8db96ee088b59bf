import Foundation

public typealias ThreadID = String
public typealias TurnID = String

/// Unix milliseconds; the store keeps them as-is.
public typealias Millis = Int64

public func nowMillis() -> Millis { Millis((Date().timeIntervalSince1970 * 1000).rounded()) }

/// Time-ordered unique ids (UUIDv7 layout), so ids sort by creation.
/// Two draws of the system's generator and a table lookup per byte (one
/// draw per random byte and a format call per hex pair were most of what an
/// import of many items spent).
public func newID() -> String {
    var random = SystemRandomNumberGenerator()
    let high = random.next() as UInt64, low = random.next() as UInt64
    let millis = UInt64(nowMillis())
    var bytes: [UInt8] = (0..<6).map { UInt8(truncatingIfNeeded: millis >> (8 * (5 - UInt64($0)))) }
    bytes += (0..<2).map { UInt8(truncatingIfNeeded: high >> (8 * UInt64($0))) }
    bytes += (0..<8).map { UInt8(truncatingIfNeeded: low >> (8 * UInt64($0))) }
    bytes[6] = (bytes[6] & 0x0f) | 0x70
    bytes[8] = (bytes[8] & 0x3f) | 0x80
    let hex = Array("0123456789abcdef".utf8)
    var text: [UInt8] = []
    text.reserveCapacity(36)
    for (index, byte) in bytes.enumerated() {
        if index == 4 || index == 6 || index == 8 || index == 10 { text.append(UInt8(ascii: "-")) }
        text.append(hex[Int(byte >> 4)])
        text.append(hex[Int(byte & 0x0f)])
    }
    return String(decoding: text, as: UTF8.self)
}

/// A thread's stored metadata.
public struct ThreadRecord: Sendable, Equatable {
    /// Whether clients may give it input: not a V2 child, whose turns come
    /// from its parent (as in codex's MultiAgentV2).
    public var acceptsDirectInput: Bool { !(source == .threadSpawn && runtime == .v2) }

    public var id: ThreadID
    public var sessionID: ThreadID
    public var forkedFromID: ThreadID?
    public var parentID: ThreadID?
    public var source: ThreadSourceKind
    public var depth: Int
    public var taskName: String?
    public var nickname: String?
    /// A child's role, as an imported rollout recorded it.
    public var agentRole: String?
    public var preview: String = ""
    public var name: String?
    public var createdAt: Millis
    public var updatedAt: Millis
    public var archived = false
    /// The pinned runtime; nil while unresolved (new) or unpinned (legacy).
    public var runtime: MultiAgentRuntime?
    /// True for a thread whose history recorded no runtime (imported rollouts):
    /// it is pinned to V1 on first resume.
    public var legacy = false
    /// The client's selection; nil = unset. Stored apart from any effective mode.
    public var selectedMode: MultiAgentMode?
    public var model: String
    public var cwd: String
    public var baseInstructions: String?
    public var configOverrides: [KeyValuePair] = []
    /// Bumped by every committed change; the store accepts a change only on
    /// top of the version it replaces (compare-and-set), so a stale copy can
    /// never overwrite a newer one. A record not yet stored has version 1.
    public var version: Int64 = 1
    /// The number of the thread's newest kept event (0 before any): events
    /// are numbered 1, 2, 3, ... in the transaction of the change that causes
    /// them (`ThreadEngine.numberEvents`), so a number never repeats.
    public var eventSequence: Int64 = 0
    /// The agent registry entry of a spawned child (nil for other threads):
    /// changed in the same transaction as the turn that changes it.
    public var agentStatus: AgentStatus?
    /// The child's final message (completed) or error (errored).
    public var agentFinalMessage: String?
    /// Closed children no longer count against the tree's cap.
    public var agentClosed = false
    /// The principal the thread belongs to; only it can see or change the
    /// thread (see `Principal`). Never changes after creation.
    public var principal: Principal = .standalone
    /// Tools a client of the thread runs (`item/tool/call`), validated by `ClientToolRules`.
    public var clientTools: [ToolSpec] = []
    /// Which tool calls wait for an approval; a child starts with its parent's.
    public var approvalPolicy: ApprovalPolicy = .never
    /// Whether the model is offered request_user_input.
    public var userInputEnabled = false
    /// A root thread only: tools a client approved for the whole agent tree.
    public var treeApprovals: [String] = []
    /// The MCP tool servers whose tools the model is offered.
    public var mcpServers: [String] = []
    /// Sent with every model request of the thread.
    public var reasoning = Reasoning()
    /// Turns waiting to start, next first.
    public var queue: [QueuedTurn] = []
    /// Each turn pauses after a batch of tool calls until turn/continue.
    public var pauseAfterTools = false
    /// A fork: the newest of the source's turns it holds.
    public var forkedAtTurnID: TurnID?

    public init(
        id: ThreadID, sessionID: ThreadID, source: ThreadSourceKind, depth: Int = 0,
        createdAt: Millis, model: String, cwd: String
    ) {
        self.id = id
        self.sessionID = sessionID
        self.source = source
        self.depth = depth
        self.createdAt = createdAt
        self.updatedAt = createdAt
        self.model = model
        self.cwd = cwd
    }
}

public struct KeyValuePair: Sendable, Equatable, Codable {
    public var key: String
    public var value: String
    public init(key: String, value: String) { self.key = key; self.value = value }
}

public enum ContextRole: String, Sendable, CaseIterable { case system, developer, user, assistant, tool }

public enum ContextKind: String, Sendable, CaseIterable {
    case baseInstructions, usageHint, multiAgentMode, userInput, assistantMessage, toolCall, toolOutput
    case subagentNotification, mailbox, interruptionMarker, developerMessage
    /// The model is shown nothing from before it (see `ModelContext`).
    case compactionSummary
    /// Never shown: the items from `rollsBackFrom` up to it leave the model's context.
    case rollbackMarker
    /// Never shown, and nothing before it is (an imported codex compaction
    /// whose replacement history follows it).
    case historyReplaced
}

/// One model-visible history item.
public struct ContextItem: Sendable, Equatable {
    public var role: ContextRole
    public var kind: ContextKind
    public var text: String
    public var toolName: String?
    public var callID: String?
    /// `.rollbackMarker` only: the first history sequence it takes back.
    public var rollsBackFrom: Int?

    public init(role: ContextRole, kind: ContextKind, text: String, toolName: String? = nil, callID: String? = nil, rollsBackFrom: Int? = nil) {
        self.role = role
        self.kind = kind
        self.text = text
        self.toolName = toolName
        self.callID = callID
        self.rollsBackFrom = rollsBackFrom
    }
}

public struct ToolSpec: Sendable, Equatable {
    public var name: String
    public var namespace: String
    public var description: String
    /// The JSON Schema of the arguments object, as JSON text ("" if none).
    public var parametersSchema: String
    /// Client tools: a call needs an approval first.
    public var requiresApproval: Bool
    public init(name: String, namespace: String, description: String, parametersSchema: String = "", requiresApproval: Bool = false) {
        self.name = name
        self.namespace = namespace
        self.description = description
        self.parametersSchema = parametersSchema
        self.requiresApproval = requiresApproval
    }
}

/// Tokens one model call used, as the provider reported them.
public struct TokenUsage: Sendable, Equatable {
    func adding(_ other: TokenUsage) -> TokenUsage {
        TokenUsage(inputTokens: inputTokens + other.inputTokens, outputTokens: outputTokens + other.outputTokens,
                   totalTokens: totalTokens + other.totalTokens)
    }

    public var inputTokens: Int
    public var outputTokens: Int
    public var totalTokens: Int
    public init(inputTokens: Int, outputTokens: Int, totalTokens: Int) {
        self.inputTokens = inputTokens
        self.outputTokens = outputTokens
        self.totalTokens = totalTokens
    }
}

/// Why a turn failed.
public enum TurnFailureReason: String, Sendable, CaseIterable {
    case rateLimited = "rate_limited", providerError = "provider_error", timeout, badResponse = "bad_response"
    case internalError = "internal_error"
}

/// Exactly what one model call saw.
public struct ModelRequest: Sendable, Equatable {
    public var model: String
    public var context: [ContextItem]
    public var tools: [ToolSpec]
    /// A compaction's summarisation call: the answer is a summary, not a turn's output.
    public var isCompaction: Bool
    public var reasoning: Reasoning
    public init(model: String, context: [ContextItem], tools: [ToolSpec], isCompaction: Bool = false, reasoning: Reasoning = Reasoning()) {
        self.model = model
        self.context = context
        self.tools = tools
        self.isCompaction = isCompaction
        self.reasoning = reasoning
    }
}

/// A stored model request: the history is append-only, so the context it saw
/// is exactly the first `contextCount` history items.
public struct ModelRequestRecord: Sendable, Equatable {
    public var model: String
    public var contextCount: Int
    public var tools: [ToolSpec]
    /// Set when the call ended and the provider reported it.
    public var usage: TokenUsage?
    /// A compaction's summarisation call: its prompt, sent last.
    public var compactionPrompt: String?
    /// What the request went out with.
    public var reasoning: Reasoning
    public init(model: String, contextCount: Int, tools: [ToolSpec], usage: TokenUsage? = nil, compactionPrompt: String? = nil,
                reasoning: Reasoning = Reasoning()) {
        self.model = model
        self.contextCount = contextCount
        self.tools = tools
        self.usage = usage
        self.compactionPrompt = compactionPrompt
        self.reasoning = reasoning
    }

    /// What the model was (or is about to be) sent: the one place a model
    /// request is built, for the call itself and for `thread/read`'s
    /// `include_model_requests`, so the two can never differ.
    public func request<History: RandomAccessCollection<ContextItem>>(history: History, baseInstructions: String) -> ModelRequest where History.Index == Int {
        var context = [ContextItem(role: .system, kind: .baseInstructions, text: baseInstructions)]
        context += ModelContext.visible(history.prefix(contextCount))
        if let compactionPrompt { context.append(ContextItem(role: .user, kind: .userInput, text: compactionPrompt)) }
        return ModelRequest(model: model, context: context, tools: tools, isCompaction: compactionPrompt != nil, reasoning: reasoning)
    }
}

/// A child agent's status as its parent sees it (reference §5.3).
public enum AgentStatus: String, Sendable, CaseIterable {
    case pendingInit, running, completed, errored, interrupted

    /// The name the collaboration tools report.
    public var toolName: String {
        switch self {
        case .pendingInit: return "pending_init"
        case .running: return "running"
        case .completed: return "completed"
        case .errored: return "errored"
        case .interrupted: return "interrupted"
        }
    }

    public var isFinal: Bool { self != .pendingInit && self != .running }
}

public enum TurnStatus: String, Sendable, CaseIterable { case inProgress, completed, interrupted, failed }

public enum ItemType: String, Sendable, CaseIterable { case userMessage, agentMessage, collabToolCall, toolCall, contextCompaction, reasoning }

/// Who runs a tool-call item's tool.
public enum ToolSource: String, Sendable, CaseIterable, Codable { case client, mcp, builtin }

/// Which tool calls of a thread wait for a client's approval before they run.
public enum ApprovalPolicy: String, Sendable, CaseIterable, Codable {
    case never
    /// Tools marked as needing one (client tools, MCP servers so configured).
    case onRequest = "on_request"
    /// Every client and MCP tool.
    case always
}

/// A tool-call item's progress.
public enum ItemStatus: String, Sendable, CaseIterable { case inProgress, completed, failed, declined, timedOut }

public struct ItemRecord: Sendable, Equatable {
    public var id: String
    public var type: ItemType
    public var text: String?
    public var toolName: String?
    public var toolArguments: String?
    public var toolOutput: String?
    public var receiverThreadID: ThreadID?
    /// Tool-call items only.
    public var toolSource: ToolSource?
    public var status: ItemStatus?
    public var durationMs: UInt64?
    /// An MCP tool's server.
    public var toolServer: String?

    public init(id: String = newID(), type: ItemType, text: String? = nil) {
        self.id = id
        self.type = type
        self.text = text
    }
}

/// The settings a turn ran with; persisted with every turn.
public struct TurnContext: Sendable, Equatable {
    public var model: String
    /// nil only in turns imported from legacy rollouts that recorded none.
    public var runtime: MultiAgentRuntime?
    public var effectiveMode: MultiAgentMode?
    public var cwd: String
    public init(model: String, runtime: MultiAgentRuntime?, effectiveMode: MultiAgentMode?, cwd: String) {
        self.model = model
        self.runtime = runtime
        self.effectiveMode = effectiveMode
        self.cwd = cwd
    }
}

public struct TurnRecord: Sendable, Equatable {
    public var id: TurnID
    public var threadID: ThreadID
    public var sequence: Int
    public var status: TurnStatus
    public var error: String?
    /// Set on a failed turn.
    public var failureReason: TurnFailureReason?
    public var startedAt: Millis
    public var completedAt: Millis?
    public var items: [ItemRecord]
    public var context: TurnContext
    public var modelRequests: [ModelRequestRecord] = []
    /// What the turn waits for from clients (in progress only).
    public var pendingRequests: [ServerRequestRecord] = []
    /// The model's outputs still to apply once `pendingRequests` are answered.
    public var deferredOutputs: [ContextItem] = []
    /// Taken out of the model's context by thread/rollback.
    public var rolledBack = false
    /// The history sequence the turn began at (nil in turns stored before it was kept).
    public var historyStart: Int?
    /// turn/steer input the model has not been given yet.
    public var pendingInput: [ContextItem] = []
    /// Paused after a batch of tool calls (the thread's `pauseAfterTools`):
    /// the next model request waits for turn/continue.
    public var pausedAfterTools = false

    public init(id: TurnID, threadID: ThreadID, sequence: Int, startedAt: Millis, items: [ItemRecord], context: TurnContext) {
        self.id = id
        self.threadID = threadID
        self.sequence = sequence
        self.status = .inProgress
        self.startedAt = startedAt
        self.items = items
        self.context = context
    }
}

/// A thread with its whole stored state.
public struct StoredThread: Sendable, Equatable {
    public var record: ThreadRecord
    // Chunked: snapshots share them while the engine appends (see ChunkedArray).
    public var history: ChunkedArray<ContextItem>
    public var turns: ChunkedArray<TurnRecord>
    public init(record: ThreadRecord, history: some Sequence<ContextItem>, turns: some Sequence<TurnRecord>) {
        self.record = record
        self.history = ChunkedArray(history)
        self.turns = ChunkedArray(turns)
    }
}
