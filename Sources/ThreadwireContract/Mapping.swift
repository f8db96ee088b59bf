public import ThreadwireCore
public import ThreadwireWire

// Domain <-> wire mapping, in one place for the store (records) and the
// server (responses and notifications).

extension MultiAgentRuntime {
    public var wire: Wire.MultiAgentRuntime {
        switch self {
        case .disabled: return .disabled
        case .v1: return .v1
        case .v2: return .v2
        }
    }

    public init?(wire: Wire.MultiAgentRuntime?) {
        switch wire {
        case .disabled?: self = .disabled
        case .v1?: self = .v1
        case .v2?: self = .v2
        case .unspecified?, nil: return nil
        }
    }
}

extension MultiAgentMode {
    public var wire: Wire.MultiAgentMode {
        switch self {
        case .explicitRequestOnly: return .explicitRequestOnly
        case .proactive: return .proactive
        }
    }

    public init?(wire: Wire.MultiAgentMode?) {
        switch wire {
        case .explicitRequestOnly?: self = .explicitRequestOnly
        case .proactive?: self = .proactive
        case .unspecified?, nil: return nil
        }
    }
}

extension ContextItem {
    public var wire: Wire.ContextItem {
        Wire.ContextItem(
            role: Wire.ContextRole(domain: role), kind: Wire.ContextKind(domain: kind), text: text,
            toolName: toolName, callId: callID)
    }

    public init(wire: Wire.ContextItem) {
        self.init(
            role: wire.role.flatMap(ContextRole.init(wire:)) ?? .user,
            kind: wire.kind.flatMap(ContextKind.init(wire:)) ?? .userInput,
            text: wire.text ?? "", toolName: wire.toolName, callID: wire.callId)
    }
}

extension Wire.ContextRole {
    init(domain: ContextRole) {
        switch domain {
        case .system: self = .system
        case .developer: self = .developer
        case .user: self = .user
        case .assistant: self = .assistant
        case .tool: self = .tool
        }
    }
}

extension ContextRole {
    init?(wire: Wire.ContextRole) {
        switch wire {
        case .system: self = .system
        case .developer: self = .developer
        case .user: self = .user
        case .assistant: self = .assistant
        case .tool: self = .tool
        case .unspecified: return nil
        }
    }
}

extension Wire.ContextKind {
    init(domain: ContextKind) {
        switch domain {
        case .baseInstructions: self = .baseInstructions
        case .usageHint: self = .usageHint
        case .multiAgentMode: self = .multiAgentMode
        case .userInput: self = .userInput
        case .assistantMessage: self = .assistantMessage
        case .toolCall: self = .toolCall
        case .toolOutput: self = .toolOutput
        case .subagentNotification: self = .subagentNotification
        case .mailbox: self = .mailbox
        case .interruptionMarker: self = .interruptionMarker
        case .developerMessage: self = .developerMessage
        }
    }
}

extension ContextKind {
    init?(wire: Wire.ContextKind) {
        switch wire {
        case .baseInstructions: self = .baseInstructions
        case .usageHint: self = .usageHint
        case .multiAgentMode: self = .multiAgentMode
        case .userInput: self = .userInput
        case .assistantMessage: self = .assistantMessage
        case .toolCall: self = .toolCall
        case .toolOutput: self = .toolOutput
        case .subagentNotification: self = .subagentNotification
        case .mailbox: self = .mailbox
        case .interruptionMarker: self = .interruptionMarker
        case .developerMessage: self = .developerMessage
        case .unspecified: return nil
        }
    }
}

extension ToolSpec {
    public var wire: Wire.ToolSpec { Wire.ToolSpec(name: name, toolNamespace: namespace, description: description) }
    public init(wire: Wire.ToolSpec) {
        self.init(name: wire.name ?? "", namespace: wire.toolNamespace ?? "", description: wire.description ?? "")
    }
}

extension ItemRecord {
    public var wire: Wire.ThreadItem {
        let type: Wire.ItemType
        switch self.type {
        case .userMessage: type = .userMessage
        case .agentMessage: type = .agentMessage
        case .collabToolCall: type = .collabToolCall
        }
        return Wire.ThreadItem(
            id: id, type: type, text: text, toolName: toolName, toolArguments: toolArguments,
            toolOutput: toolOutput, receiverThreadId: receiverThreadID)
    }

    public init(wire: Wire.ThreadItem) {
        let type: ItemType
        switch wire.type {
        case .agentMessage?: type = .agentMessage
        case .collabToolCall?: type = .collabToolCall
        default: type = .userMessage
        }
        self.init(id: wire.id ?? newID(), type: type, text: wire.text)
        toolName = wire.toolName
        toolArguments = wire.toolArguments
        toolOutput = wire.toolOutput
        receiverThreadID = wire.receiverThreadId
    }
}

extension TurnStatus {
    public var wire: Wire.TurnStatus {
        switch self {
        case .inProgress: return .inProgress
        case .completed: return .completed
        case .interrupted: return .interrupted
        case .failed: return .failed
        }
    }

    public init(wire: Wire.TurnStatus?) {
        switch wire {
        case .completed?: self = .completed
        case .interrupted?: self = .interrupted
        case .failed?: self = .failed
        default: self = .inProgress
        }
    }
}

extension TurnContext {
    public var wire: Wire.TurnContext {
        Wire.TurnContext(model: model, multiAgentRuntime: runtime?.wire ?? .unspecified,
                         effectiveMultiAgentMode: effectiveMode?.wire, cwd: cwd)
    }

    public init(wire: Wire.TurnContext?) {
        self.init(model: wire?.model ?? "", runtime: MultiAgentRuntime(wire: wire?.multiAgentRuntime),
                  effectiveMode: MultiAgentMode(wire: wire?.effectiveMultiAgentMode), cwd: wire?.cwd ?? "")
    }
}

extension TurnRecord {
    /// The wire turn; model requests are materialised from `history` when given.
    public func wire(modelRequests: [ModelRequest]? = nil) -> Wire.Turn {
        let requests: [Wire.ModelRequest]
        if let modelRequests {
            requests = zip(modelRequests, self.modelRequests).map { request, ref in
                Wire.ModelRequest(model: request.model, context: request.context.map(\.wire),
                                  tools: request.tools.map(\.wire), historyCount: UInt32(ref.contextCount))
            }
        } else {
            requests = []
        }
        return Wire.Turn(
            id: id, status: status.wire, error: error, startedAt: startedAt, completedAt: completedAt,
            items: items.map(\.wire), context: context.wire, modelRequests: requests)
    }

    /// The stored form: model requests keep only their model, tools and history count.
    public var storedWire: Wire.Turn {
        var turn = wire()
        turn.modelRequests = modelRequests.map {
            Wire.ModelRequest(model: $0.model, tools: $0.tools.map(\.wire), historyCount: UInt32($0.contextCount))
        }
        return turn
    }

    public init(storedWire turn: Wire.Turn, threadID: ThreadID, sequence: Int) {
        self.init(id: turn.id ?? "", threadID: threadID, sequence: sequence, startedAt: turn.startedAt ?? 0,
                  items: turn.items.map(ItemRecord.init(wire:)), context: TurnContext(wire: turn.context))
        status = TurnStatus(wire: turn.status)
        error = turn.error
        completedAt = turn.completedAt
        modelRequests = turn.modelRequests.map {
            ModelRequestRecord(model: $0.model ?? "", contextCount: Int($0.historyCount ?? 0), tools: $0.tools.map(ToolSpec.init(wire:)))
        }
    }
}

extension ThreadStatus {
    public var wire: Wire.ThreadStatus {
        switch self {
        case .notLoaded: return Wire.ThreadStatus(type: .notLoaded)
        case .idle: return Wire.ThreadStatus(type: .idle)
        case let .active(turn): return Wire.ThreadStatus(type: .active, activeTurnId: turn)
        }
    }
}

extension ThreadSourceKind {
    public var wire: Wire.ThreadSourceKind {
        switch self {
        case .appServer: return .appServer
        case .threadSpawn: return .threadSpawn
        case .review: return .review
        case .imported: return .imported
        }
    }
}

extension ThreadSettingsView {
    public var wire: Wire.ThreadSettings {
        Wire.ThreadSettings(model: model, cwd: cwd, multiAgentMode: selectedMode?.wire,
                            multiAgentRuntime: runtime?.wire ?? .unspecified)
    }
}

extension ThreadView {
    public func wire(baseInstructions: String) -> Wire.Thread {
        let r = record
        let turns = (self.turns ?? []).map { turn in
            turn.wire(modelRequests: history == nil ? nil : modelRequests(of: turn, baseInstructions: baseInstructions))
        }
        return Wire.Thread(
            id: r.id, sessionId: r.sessionID, forkedFromId: r.forkedFromID, parentThreadId: r.parentID,
            preview: r.preview, name: r.name, createdAt: r.createdAt, updatedAt: r.updatedAt, status: status.wire,
            source: Wire.ThreadSource(kind: r.source.wire, parentThreadId: r.parentID, depth: UInt32(r.depth),
                                      agentNickname: r.nickname, taskName: r.taskName),
            archived: r.archived, multiAgentRuntime: r.runtime?.wire ?? .unspecified,
            multiAgentMode: r.selectedMode?.wire, model: r.model, cwd: r.cwd, turns: turns)
    }

    public func lifecycleResult(baseInstructions: String) -> Wire.ThreadLifecycleResult {
        Wire.ThreadLifecycleResult(
            thread: wire(baseInstructions: baseInstructions), model: record.model,
            multiAgentRuntime: record.runtime?.wire ?? .unspecified, multiAgentMode: record.selectedMode?.wire,
            settings: settings.wire)
    }
}
