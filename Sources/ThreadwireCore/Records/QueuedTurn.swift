/// A turn waiting in a thread's durable queue (turn/start with
/// when_busy = enqueue): kept in the thread's record, so it commits, fences
/// and survives kill -9 and failover with the thread; started in order as
/// each turn ends (`ThreadEngine.startQueuedTurn`).
public struct QueuedTurn: Sendable, Equatable, Codable {
    public var id: String
    public var input: [String]
    public var model: String?
    /// The request's sticky settings, applied when it starts.
    public var mode: String?
    public var clearMode: Bool?
    public var approvalPolicy: ApprovalPolicy?
    public var reasoningEffort: String?
    public var reasoningSummary: String?
    public var createdAt: Millis

    public init(id: String, input: [String], model: String?, createdAt: Millis) {
        self.id = id
        self.input = input
        self.model = model
        self.createdAt = createdAt
    }
}

/// What turn/start does while a turn runs.
public enum WhenBusy: Sendable, Equatable {
    case reject, enqueue, interrupt, steer
}
