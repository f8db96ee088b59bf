/// Identifies one client connection to the engine.
public typealias ConnectionID = UInt64

/// Callers that have no connection to subscribe.
public enum Subscriber {
    /// A call made without a session (a unary gRPC call): it is answered,
    /// and subscribing it subscribes nobody. Connections are numbered from 1.
    public static let nobody: ConnectionID = 0

    /// The recipients of an event meant for one caller: none for nobody.
    static func only(_ connection: ConnectionID) -> [ConnectionID] {
        connection == nobody ? [] : [connection]
    }
}

public enum ThreadStatus: Sendable, Equatable {
    case notLoaded, idle
    /// A turn runs; `waitingOn` says what it waits for, if anything.
    case active(TurnID, waitingOn: WaitingReason? = nil)
}

/// What an active turn waits for, other than the model.
public enum WaitingReason: String, Sendable, Equatable {
    /// A client to run a client tool (item/tool/call).
    case clientTool
    /// A client's approval of a tool call (item/tool/request_approval).
    case approval
    /// The user's answer (item/tool/request_user_input).
    case userInput
    /// turn/continue, after a batch of tool calls (the thread's pause_after_tools).
    case continueAfterTools
}

/// A thread's sticky next-turn settings as reported to clients.
public struct ThreadSettingsView: Sendable, Equatable {
    public var model: String
    public var cwd: String
    public var selectedMode: MultiAgentMode?
    public var runtime: MultiAgentRuntime?
    public var approvalPolicy: ApprovalPolicy = .never
    public var userInput = false
    public var mcpServers: [String] = []
    public var reasoning = Reasoning()
    public var pauseAfterTools = false

    public init(record: ThreadRecord) {
        self.init(model: record.model, cwd: record.cwd, selectedMode: record.selectedMode, runtime: record.runtime,
                  approvalPolicy: record.approvalPolicy, userInput: record.userInputEnabled, mcpServers: record.mcpServers)
        reasoning = record.reasoning
        pauseAfterTools = record.pauseAfterTools
    }

    public init(model: String, cwd: String, selectedMode: MultiAgentMode?, runtime: MultiAgentRuntime?,
                approvalPolicy: ApprovalPolicy = .never, userInput: Bool = false, mcpServers: [String] = []) {
        self.model = model
        self.cwd = cwd
        self.selectedMode = selectedMode
        self.runtime = runtime
        self.approvalPolicy = approvalPolicy
        self.userInput = userInput
        self.mcpServers = mcpServers
    }
}

/// A thread as reported to clients.
public struct ThreadView: Sendable, Equatable {
    public var record: ThreadRecord
    public var status: ThreadStatus
    /// Filled only when turns were asked for.
    public var turns: [TurnRecord]?
    /// Filled only when model requests were asked for (they index into it).
    public var history: [ContextItem]?
    /// True when `turns` holds only the newest turns of the thread.
    public var hasOlderTurns = false

    /// The newest `limit` of `all` (sorted by sequence), oldest first.
    public mutating func setNewestTurns(_ all: some Collection<TurnRecord>, limit: Int) {
        turns = Array(all.suffix(limit))
        hasOlderTurns = all.count > limit
    }

    public var settings: ThreadSettingsView { ThreadSettingsView(record: record) }

    /// Without `include`, the view leaves out turns thread/rollback took back
    /// (the page was read before they were left out, so it may hold fewer).
    public func keepingRolledBack(_ include: Bool) -> ThreadView {
        guard !include, let turns, turns.contains(where: \.rolledBack) else { return self }
        var view = self
        view.turns = turns.filter { !$0.rolledBack }
        return view
    }

    /// The model requests of a turn, materialised from the append-only history.
    public func modelRequests(of turn: TurnRecord, baseInstructions: String) -> [ModelRequest] {
        guard let history else { return [] }
        return turn.modelRequests.map { $0.request(history: history, baseInstructions: baseInstructions) }
    }
}

public enum ThreadEvent: Sendable, Equatable {
    case threadStarted(ThreadView)
    case statusChanged(ThreadID, ThreadStatus)
    case archived(ThreadID)
    case unarchived(ThreadID)
    case closed(ThreadID)
    case settingsUpdated(ThreadID, ThreadSettingsView)
    case turnStarted(ThreadID, TurnRecord)
    case turnCompleted(ThreadID, TurnRecord)
    case itemStarted(ThreadID, TurnID, ItemRecord)
    case itemCompleted(ThreadID, TurnID, ItemRecord)
    /// Text of agent message `itemID` while the model streams it.
    case agentMessageDelta(ThreadID, TurnID, itemID: String, delta: String)
    /// A call to the recipients that declared its capability (the server filters).
    case serverRequest(ServerRequestRecord)
    /// Request `requestID` of the thread is no longer pending.
    case serverRequestResolved(ThreadID, requestID: String, ServerRequestOutcome)
    /// A model call's tokens, the thread's totals, and its model's window.
    case tokenUsage(ThreadID, TurnID, TokenUsageReport)
    /// thread/rollback took these turns (oldest first) out of the model's context.
    case rolledBack(ThreadID, [TurnID])
    /// thread/revert: the same change as a rollback, named after its boundary.
    case reverted(ThreadID, [TurnID])
    /// The thread's queue as it is after a change.
    case queueUpdated(ThreadID, [QueuedTurn])
    /// thread/delete: the thread is gone (with its tree).
    case deleted(ThreadID)
    /// nil: the name was cleared.
    case nameUpdated(ThreadID, String?)
    /// A kept event sent again to a client resuming after an earlier one
    /// (its stored encoding).
    case replayed(ThreadID, StoredEvent)

    /// The thread the event is about.
    public var threadID: ThreadID {
        switch self {
        case let .threadStarted(view): view.record.id
        case let .statusChanged(id, _), let .archived(id), let .unarchived(id), let .closed(id), let .settingsUpdated(id, _),
             let .turnStarted(id, _), let .turnCompleted(id, _), let .itemStarted(id, _, _), let .itemCompleted(id, _, _),
             let .agentMessageDelta(id, _, _, _), let .serverRequestResolved(id, _, _), let .tokenUsage(id, _, _),
             let .rolledBack(id, _), let .reverted(id, _), let .queueUpdated(id, _), let .deleted(id), let .nameUpdated(id, _),
             let .replayed(id, _):
            id
        case let .serverRequest(request): request.threadID
        }
    }

    /// Whether the event is numbered and kept with the change that causes it.
    /// Not kept: streaming deltas (the item's completion carries the text),
    /// live token usage (the turn's stored requests carry it), server
    /// requests (offered again to whoever subscribes while pending), and what
    /// tells of a subscription rather than a change (unloaded, closed).
    public var isKept: Bool {
        switch self {
        case .agentMessageDelta, .tokenUsage, .serverRequest, .closed, .statusChanged(_, .notLoaded), .replayed, .deleted: false
        default: true
        }
    }
}

/// What thread/token_usage/updated reports.
public struct TokenUsageReport: Sendable, Equatable {
    public var last: TokenUsage
    public var total: TokenUsage
    public var contextWindow: Int?
    /// The share of the window the next request uses at least (nil without a window).
    public var nextRequestShare: Double? {
        guard let contextWindow, contextWindow > 0 else { return nil }
        return Double(last.inputTokens + last.outputTokens) / Double(contextWindow)
    }
}

public struct Delivery: Sendable, Equatable {
    public var event: ThreadEvent
    public var recipients: [ConnectionID]
    /// The event's number in its thread, when it is kept (`ThreadEvent.isKept`).
    public var threadSequence: Int64?
    /// Its notification as kept (`EventSink.keptEncoding`): sent as it is
    /// when no per-delivery field (trace context) is added.
    public var encoded: [UInt8]?
    /// The trace of the request (or turn) that caused it, taken where the
    /// event is made: its notification carries it (nil with tracing off).
    public var trace: TraceCarrier? = ThreadTracing.currentContext()
}

/// Where the engine sends notifications. `deliver` must keep the order of
/// calls per recipient.
public protocol EventSink: Sendable {
    func deliver(_ deliveries: [Delivery])
    /// What is stored of a kept event: the bytes a replay sends again.
    func keptEncoding(_ event: ThreadEvent, threadSequence: Int64) -> [UInt8]
    /// Returns once `connection` can take `bytes` more of a replay without
    /// nearing its backlog limit; false once it is gone.
    func waitForReplayRoom(_ connection: ConnectionID, bytes: Int) async -> Bool
}

extension EventSink {
    public func keptEncoding(_ event: ThreadEvent, threadSequence: Int64) -> [UInt8] { [] }
    public func waitForReplayRoom(_ connection: ConnectionID, bytes: Int) async -> Bool { true }
}

/// A result plus the notifications it caused. The caller sends its response
/// first and then calls `publish()`, so a client always sees the response
/// before the events it caused; each thread's publications still go out in
/// commit order (see `OrderedPublisher`).
public struct Outcome<Value: Sendable>: Sendable {
    public var value: Value
    public var publications: [Publication]

    public init(_ value: Value, publications: [Publication] = []) {
        self.value = value
        self.publications = publications
    }

    /// The same notifications with another value (e.g. the wire result).
    public init<Other>(_ value: Value, carrying other: Outcome<Other>) {
        self.value = value
        self.publications = other.publications
    }

    public var deliveries: [Delivery] { publications.flatMap(\.deliveries) }

    public func publish() {
        for publication in publications { publication.publish() }
    }
}

/// How a request names a change to the selected mode: omitted keeps it.
public enum ModeUpdate: Sendable, Equatable {
    case keep, clear
    case set(MultiAgentMode)

    func applied(to current: MultiAgentMode?) -> MultiAgentMode? {
        switch self {
        case .keep: return current
        case .clear: return nil
        case let .set(mode): return mode
        }
    }
}
