/// One durable change. A commit applies a list of them atomically.
public enum StoreOperation: Sendable {
    /// Insert or replace a thread's metadata.
    case putThread(ThreadRecord)
    /// Append history items; `firstSequence` is the index of the first one.
    case appendHistory(ThreadID, firstSequence: Int, items: [ContextItem])
    /// Insert or replace a turn (with its items, context and model requests).
    case putTurn(TurnRecord)
    /// Pin a legacy thread's runtime if none is recorded, touching nothing else
    /// (not the history, not the timestamps).
    case setRuntimeIfUnset(ThreadID, MultiAgentRuntime)
}

public struct ThreadListQuery: Sendable, Equatable {
    public enum SortKey: Sendable { case createdAt, updatedAt }
    public var sortKey: SortKey = .createdAt
    public var ascending = false
    public var limit = 50
    public var cursor: String?
    public var parentID: ThreadID?
    public var archived = false
    public init() {}
}

/// Where threads live. Implementations make a commit durable before returning
/// and never block the caller's thread on I/O. Nothing outside the store
/// knows how it stores (no SQL leaves it).
public protocol ThreadStore: Sendable {
    func commit(_ operations: [StoreOperation]) async throws
    func loadThread(_ id: ThreadID) async throws -> StoredThread?
    func threadRecord(_ id: ThreadID) async throws -> ThreadRecord?
    /// A page of records and the cursor of the next page (nil on the last).
    func listThreads(_ query: ThreadListQuery) async throws -> (records: [ThreadRecord], nextCursor: String?)
}
