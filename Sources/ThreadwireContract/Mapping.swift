public import ThreadwireCore
public import ThreadwireWire

// Domain <-> wire mapping, in one place for the store (records) and the
// server (responses and notifications).

/// One table per enum pair, read in both directions, so each correspondence
/// is written once. `MappingTests` checks every domain case is in its table.
struct EnumMapping<Domain: Equatable & Sendable, WireValue: Equatable & Sendable>: Sendable {
    let pairs: [(Domain, WireValue)]

    func wire(_ domain: Domain) -> WireValue {
        pairs.first { $0.0 == domain }!.1
    }

    /// nil for a wire value with no domain meaning (UNSPECIFIED, or absent).
    func domain(_ wire: WireValue?) -> Domain? {
        pairs.first { $0.1 == wire }?.0
    }
}

enum Mappings {
    static let runtime = EnumMapping<MultiAgentRuntime, Wire.MultiAgentRuntime>(pairs: [(.disabled, .disabled), (.v1, .v1), (.v2, .v2)])
    static let mode = EnumMapping<MultiAgentMode, Wire.MultiAgentMode>(pairs: [(.explicitRequestOnly, .explicitRequestOnly), (.proactive, .proactive)])
    static let role = EnumMapping<ContextRole, Wire.ContextRole>(pairs: [
        (.system, .system), (.developer, .developer), (.user, .user), (.assistant, .assistant), (.tool, .tool),
    ])
    static let kind = EnumMapping<ContextKind, Wire.ContextKind>(pairs: [
        (.baseInstructions, .baseInstructions), (.usageHint, .usageHint), (.multiAgentMode, .multiAgentMode),
        (.userInput, .userInput), (.assistantMessage, .assistantMessage), (.toolCall, .toolCall),
        (.toolOutput, .toolOutput), (.subagentNotification, .subagentNotification), (.mailbox, .mailbox),
        (.interruptionMarker, .interruptionMarker), (.developerMessage, .developerMessage),
        (.compactionSummary, .compactionSummary), (.rollbackMarker, .rollbackMarker), (.historyReplaced, .historyReplaced),
    ])
    static let itemType = EnumMapping<ItemType, Wire.ItemType>(pairs: [
        (.userMessage, .userMessage), (.agentMessage, .agentMessage), (.collabToolCall, .collabToolCall), (.toolCall, .toolCall),
        (.contextCompaction, .contextCompaction), (.reasoning, .reasoning),
    ])
    static let toolSource = EnumMapping<ToolSource, Wire.ToolSource>(pairs: [(.client, .client), (.mcp, .mcp), (.builtin, .builtin)])
    static let approvalPolicy = EnumMapping<ApprovalPolicy, Wire.ApprovalPolicy>(pairs: [
        (.never, .never), (.onRequest, .onRequest), (.always, .always),
    ])
    static let decision = EnumMapping<ApprovalDecision, Wire.ApprovalDecision>(pairs: [
        (.approve, .approve), (.approveForTree, .approveForTree), (.decline, .decline), (.cancel, .cancel),
    ])
    static let itemStatus = EnumMapping<ItemStatus, Wire.ItemStatus>(pairs: [
        (.inProgress, .inProgress), (.completed, .completed), (.failed, .failed), (.declined, .declined), (.timedOut, .timedOut),
    ])
    static let outcome = EnumMapping<ServerRequestOutcome, Wire.ServerRequestOutcome>(pairs: [
        (.answered, .answered), (.timedOut, .timedOut), (.withdrawn, .withdrawn), (.pending, .pending),
    ])
    static func activeFlag(_ reason: WaitingReason) -> Wire.ThreadActiveFlag {
        switch reason {
        case .clientTool: return .waitingOnClientTool
        case .approval: return .waitingOnApproval
        case .userInput: return .waitingOnUserInput
        case .continueAfterTools: return .pausedAfterTools
        }
    }
    static let turnStatus = EnumMapping<TurnStatus, Wire.TurnStatus>(pairs: [
        (.inProgress, .inProgress), (.completed, .completed), (.interrupted, .interrupted), (.failed, .failed),
    ])
    static let source = EnumMapping<ThreadSourceKind, Wire.ThreadSourceKind>(pairs: [
        (.appServer, .appServer), (.threadSpawn, .threadSpawn), (.review, .review), (.imported, .imported),
    ])
}

extension MultiAgentRuntime {
    public var wire: Wire.MultiAgentRuntime { Mappings.runtime.wire(self) }
    public init?(wire: Wire.MultiAgentRuntime?) {
        guard let value = Mappings.runtime.domain(wire) else { return nil }
        self = value
    }
}

extension MultiAgentMode {
    public var wire: Wire.MultiAgentMode { Mappings.mode.wire(self) }
    public init?(wire: Wire.MultiAgentMode?) {
        guard let value = Mappings.mode.domain(wire) else { return nil }
        self = value
    }
}

extension ContextItem {
    public var wire: Wire.ContextItem {
        Wire.ContextItem(role: Mappings.role.wire(role), kind: Mappings.kind.wire(kind), text: text, toolName: toolName, callId: callID,
                         rollsBackFrom: rollsBackFrom.map { UInt64($0) })
    }

    public init(wire: Wire.ContextItem) {
        self.init(role: Mappings.role.domain(wire.role) ?? .user, kind: Mappings.kind.domain(wire.kind) ?? .userInput,
                  text: wire.text ?? "", toolName: wire.toolName, callID: wire.callId)
        rollsBackFrom = wire.rollsBackFrom.map { Int(clamping: $0) }
    }
}

extension ToolSpec {
    public var wire: Wire.ToolSpec {
        Wire.ToolSpec(name: name, toolNamespace: namespace, description: description,
                      parametersJsonSchema: parametersSchema.isEmpty ? nil : parametersSchema,
                      requiresApproval: requiresApproval ? true : nil)
    }
    public init(wire: Wire.ToolSpec) {
        self.init(name: wire.name ?? "", namespace: wire.toolNamespace ?? "", description: wire.description ?? "",
                  parametersSchema: wire.parametersJsonSchema ?? "", requiresApproval: wire.requiresApproval ?? false)
    }
}

extension TokenUsage {
    public var wire: Wire.TokenUsage {
        Wire.TokenUsage(inputTokens: UInt64(max(0, inputTokens)), outputTokens: UInt64(max(0, outputTokens)),
                        totalTokens: UInt64(max(0, totalTokens)))
    }
    public init(wire: Wire.TokenUsage) {
        self.init(inputTokens: Int(clamping: wire.inputTokens ?? 0), outputTokens: Int(clamping: wire.outputTokens ?? 0),
                  totalTokens: Int(clamping: wire.totalTokens ?? 0))
    }
}

extension TurnFailureReason {
    public var wire: Wire.TurnFailureReason {
        switch self {
        case .rateLimited: return .rateLimited
        case .providerError: return .providerError
        case .timeout: return .timeout
        case .badResponse: return .badResponse
        case .internalError: return .internalError
        }
    }
    public init?(wire: Wire.TurnFailureReason?) {
        switch wire {
        case .rateLimited?: self = .rateLimited
        case .providerError?: self = .providerError
        case .timeout?: self = .timeout
        case .badResponse?: self = .badResponse
        case .internalError?: self = .internalError
        case .unspecified?, nil: return nil
        }
    }
}

extension ItemRecord {
    public var wire: Wire.ThreadItem {
        Wire.ThreadItem(id: id, type: Mappings.itemType.wire(type), text: text, toolName: toolName,
                        toolArguments: toolArguments, toolOutput: toolOutput, receiverThreadId: receiverThreadID,
                        toolSource: toolSource.map(Mappings.toolSource.wire), status: status.map(Mappings.itemStatus.wire),
                        durationMs: durationMs, toolServer: toolServer)
    }

    public init(wire: Wire.ThreadItem) {
        self.init(id: wire.id ?? newID(), type: Mappings.itemType.domain(wire.type) ?? .userMessage, text: wire.text)
        toolName = wire.toolName
        toolArguments = wire.toolArguments
        toolOutput = wire.toolOutput
        receiverThreadID = wire.receiverThreadId
        toolSource = Mappings.toolSource.domain(wire.toolSource)
        status = Mappings.itemStatus.domain(wire.status)
        durationMs = wire.durationMs
        toolServer = wire.toolServer
    }
}

extension TurnStatus {
    public var wire: Wire.TurnStatus { Mappings.turnStatus.wire(self) }
    /// A stored turn without a status was in progress when written.
    public init(wire: Wire.TurnStatus?) { self = Mappings.turnStatus.domain(wire) ?? .inProgress }
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
                                  tools: request.tools.map(\.wire), historyCount: UInt32(ref.contextCount), usage: ref.usage?.wire,
                                  compactionPrompt: ref.compactionPrompt, reasoningEffort: ref.reasoning.effort,
                                  reasoningSummary: ref.reasoning.summary)
            }
        } else {
            requests = []
        }
        var turn = Wire.Turn(
            id: id, status: status.wire, error: error, startedAt: startedAt, completedAt: completedAt,
            items: items.map(\.wire), context: context.wire, modelRequests: requests, failureReason: failureReason?.wire,
            pendingRequests: pendingRequests.map { $0.wire() }, rolledBack: rolledBack ? true : nil)
        turn.pausedAfterTools = pausedAfterTools ? true : nil
        return turn
    }

    /// The stored form: model requests keep only their model, tools and history count.
    public var storedWire: Wire.Turn {
        var turn = wire()
        turn.modelRequests = modelRequests.map {
            Wire.ModelRequest(model: $0.model, tools: $0.tools.map(\.wire), historyCount: UInt32($0.contextCount), usage: $0.usage?.wire,
                              compactionPrompt: $0.compactionPrompt, reasoningEffort: $0.reasoning.effort, reasoningSummary: $0.reasoning.summary)
        }
        turn.deferredOutputs = deferredOutputs.map(\.wire)
        turn.historyStart = historyStart.map { UInt64($0) }
        turn.pendingInput = pendingInput.map(\.wire)
        return turn
    }

    public init(storedWire turn: Wire.Turn, threadID: ThreadID, sequence: Int) {
        self.init(id: turn.id ?? "", threadID: threadID, sequence: sequence, startedAt: turn.startedAt ?? 0,
                  items: turn.items.map(ItemRecord.init(wire:)), context: TurnContext(wire: turn.context))
        status = TurnStatus(wire: turn.status)
        error = turn.error
        failureReason = TurnFailureReason(wire: turn.failureReason)
        completedAt = turn.completedAt
        pendingRequests = turn.pendingRequests.compactMap { ServerRequestRecord(wire: $0, threadID: threadID) }
        deferredOutputs = turn.deferredOutputs.map(ContextItem.init(wire:))
        rolledBack = turn.rolledBack ?? false
        historyStart = turn.historyStart.map { Int(clamping: $0) }
        pendingInput = turn.pendingInput.map(ContextItem.init(wire:))
        pausedAfterTools = turn.pausedAfterTools ?? false
        modelRequests = turn.modelRequests.map {
            ModelRequestRecord(model: $0.model ?? "", contextCount: Int($0.historyCount ?? 0), tools: $0.tools.map(ToolSpec.init(wire:)),
                               usage: $0.usage.map(TokenUsage.init(wire:)), compactionPrompt: $0.compactionPrompt,
                               reasoning: Reasoning(effort: $0.reasoningEffort, summary: $0.reasoningSummary))
        }
    }
}

extension ThreadStatus {
    public var wire: Wire.ThreadStatus {
        switch self {
        case .notLoaded: return Wire.ThreadStatus(type: .notLoaded)
        case .idle: return Wire.ThreadStatus(type: .idle)
        case let .active(turn, waiting):
            return Wire.ThreadStatus(type: .active, activeTurnId: turn, activeFlags: waiting.map { [Mappings.activeFlag($0)] } ?? [])
        }
    }
}

extension ThreadSourceKind {
    public var wire: Wire.ThreadSourceKind { Mappings.source.wire(self) }
}

extension ThreadSettingsView {
    public var wire: Wire.ThreadSettings {
        var settings = Wire.ThreadSettings(
            model: model, cwd: cwd, multiAgentMode: selectedMode?.wire,
            multiAgentRuntime: runtime?.wire ?? .unspecified, approvalPolicy: approvalPolicy.wire, userInput: userInput,
            mcpServers: mcpServers, reasoningEffort: reasoning.effort, reasoningSummary: reasoning.summary)
        settings.pauseAfterTools = pauseAfterTools ? true : nil
        return settings
    }
}

extension ThreadView {
    public func wire(baseInstructions: String) -> Wire.Thread {
        let r = record
        let turns = (self.turns ?? []).map { turn in
            turn.wire(modelRequests: history == nil ? nil : modelRequests(of: turn, baseInstructions: baseInstructions))
        }
        var thread = Wire.Thread(
            id: r.id, sessionId: r.sessionID, forkedFromId: r.forkedFromID, parentThreadId: r.parentID,
            preview: r.preview, name: r.name, createdAt: r.createdAt, updatedAt: r.updatedAt, status: status.wire,
            source: Wire.ThreadSource(kind: r.source.wire, parentThreadId: r.parentID, depth: UInt32(r.depth),
                                      agentNickname: r.nickname, taskName: r.taskName, agentRole: r.agentRole),
            archived: r.archived, multiAgentRuntime: r.runtime?.wire ?? .unspecified,
            multiAgentMode: r.selectedMode?.wire, model: r.model, cwd: r.cwd, turns: turns,
            // Absent before the thread's first kept event (threads stored
            // before events were kept read as they did).
            threadSequence: r.eventSequence > 0 ? UInt64(r.eventSequence) : nil)
        thread.forkedAtTurnId = r.forkedAtTurnID
        // Absent means true (the field's default): only the exception is sent.
        thread.canAcceptDirectInput = r.acceptsDirectInput ? nil : false
        return thread
    }

    public func lifecycleResult(baseInstructions: String) -> Wire.ThreadLifecycleResult {
        Wire.ThreadLifecycleResult(
            thread: wire(baseInstructions: baseInstructions), model: record.model,
            multiAgentRuntime: record.runtime?.wire ?? .unspecified, multiAgentMode: record.selectedMode?.wire,
            settings: settings.wire, clientTools: record.clientTools.map(\.wire), approvalPolicy: record.approvalPolicy.wire)
    }
}

extension ServerRequestRecord {
    /// The frame's request; `now` sets the time left.
    public func wire(now: Millis? = nil) -> Wire.ServerRequest {
        let params: Wire.ServerRequest.Params
        switch kind {
        case let .toolCall(itemID, tool, arguments, callID):
            params = .itemToolCall(Wire.ToolCallParams(itemId: itemID, tool: tool, arguments: arguments, callId: callID))
        case let .approval(itemID, tool, arguments, callID, source, server):
            params = .itemToolRequestApproval(Wire.ApprovalParams(
                itemId: itemID, tool: tool, arguments: arguments, callId: callID, source: Mappings.toolSource.wire(source), server: server))
        case let .userInput(itemID, question, choices, callID):
            params = .itemToolRequestUserInput(Wire.UserInputParams(itemId: itemID, question: question, choices: choices, callId: callID))
        }
        let left = now.map { UInt32(clamping: max(0, deadlineAt - $0)) }
        return Wire.ServerRequest(id: id, threadId: threadID, turnId: turnID, timeoutMs: left, deadlineAt: deadlineAt,
                                  createdAt: createdAt, rootThreadId: rootID, taskPath: taskPath, params: params)
    }

    /// nil for a stored request of a kind this server does not know.
    public init?(wire: Wire.ServerRequest, threadID: ThreadID) {
        guard let id = wire.id, let params = wire.params else { return nil }
        let kind: Kind
        switch params {
        case let .itemToolCall(call):
            kind = .toolCall(itemID: call.itemId ?? "", tool: call.tool ?? "", arguments: call.arguments ?? "{}", callID: call.callId ?? "")
        case let .itemToolRequestApproval(approval):
            guard let source = Mappings.toolSource.domain(approval.source) else { return nil }
            kind = .approval(itemID: approval.itemId ?? "", tool: approval.tool ?? "", arguments: approval.arguments ?? "{}",
                             callID: approval.callId ?? "", source: source, server: approval.server)
        case let .itemToolRequestUserInput(input):
            kind = .userInput(itemID: input.itemId ?? "", question: input.question ?? "", choices: input.choices, callID: input.callId ?? "")
        }
        self.init(id: id, threadID: threadID, turnID: wire.turnId ?? "", kind: kind, createdAt: wire.createdAt ?? 0,
                  deadlineAt: wire.deadlineAt ?? 0, rootID: wire.rootThreadId, taskPath: wire.taskPath)
    }
}

extension ServerRequestAnswer {
    /// A client's answer as the engine reads it, or why it cannot be read.
    public init(wire: Wire.ServerRequestAnswer) throws(AnswerRefusal) {
        let code = wire.code ?? 0
        if code != 0 {
            self = .failed(code: code, message: wire.message ?? "")
            return
        }
        switch wire.result {
        case let .itemToolCall(result)?:
            self = .toolOutput(result.output ?? "", isError: result.isError ?? false)
        case let .itemToolRequestApproval(result)?:
            guard let decision = Mappings.decision.domain(result.decision) else {
                throw AnswerRefusal(.pending, "an approval answer needs a decision (APPROVE, APPROVE_FOR_TREE, DECLINE or CANCEL)")
            }
            self = .approval(decision, reason: result.reason ?? "")
        case let .itemToolRequestUserInput(result)?:
            self = .userInput(result.answer ?? "")
        case nil:
            throw AnswerRefusal(.pending, "an answer with code 0 (OK) needs a result")
        }
    }
}

extension ToolServerStatus {
    public var wire: Wire.McpServer {
        let state: Wire.McpServerState
        switch self.state {
        case .starting: state = .starting
        case .ready: state = .ready
        case .restarting: state = .restarting
        case .stopped: state = .stopped
        }
        return Wire.McpServer(name: name, state: state, pid: pid, restarts: UInt32(clamping: restarts), lastError: lastError,
                              tools: tools.map(\.wire), requireApproval: requireApproval)
    }
}

extension ApprovalPolicy {
    public var wire: Wire.ApprovalPolicy { Mappings.approvalPolicy.wire(self) }
    /// nil for UNSPECIFIED or absent (keep the current policy).
    public init?(wire: Wire.ApprovalPolicy?) {
        guard let value = Mappings.approvalPolicy.domain(wire) else { return nil }
        self = value
    }
}

extension ServerRequestOutcome {
    public var wire: Wire.ServerRequestOutcome { Mappings.outcome.wire(self) }
}

extension QueuedTurn {
    public var wire: Wire.QueuedTurn {
        Wire.QueuedTurn(id: id, input: input, model: model, createdAt: createdAt)
    }
}
