/// One durable change. A commit applies a list of them atomically.
public enum StoreOperation: Sendable {
    /// Insert a thread (version 1) or replace version `record.version - 1`
    /// of it; anything else fails with `StoreConflict` and changes nothing.
    case putThread(ThreadRecord)
    /// Append history items; `firstSequence` is the index of the first one.
    case appendHistory(ThreadID, firstSequence: Int, items: [ContextItem])
    /// Insert or replace a turn (with its items, context and model requests).
    case putTurn(TurnRecord)
    /// Queue a history item for another thread (a child's report to its
    /// parent); it is moved into that thread's history by its owner.
    case enqueueMailbox(recipient: ThreadID, item: ContextItem)
    /// Remove delivered mailbox items up to and including `throughSequence`.
    case removeMailbox(recipient: ThreadID, throughSequence: Int64)
}

/// A versioned write lost the race: the stored version is not the one the
/// writer started from. Never retried blindly: the owner reloads.
public struct StoreConflict: Error, CustomStringConvertible {
    public var threadID: ThreadID
    public var expectedVersion: Int64
    public init(threadID: ThreadID, expectedVersion: Int64) {
        self.threadID = threadID
        self.expectedVersion = expectedVersion
    }
    public var description: String {
        expectedVersion == 0
            ? "thread \(threadID) already exists"
            : "thread \(threadID) is no longer at version \(expectedVersion); a stale write was refused"
    }
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
    /// Every spawned thread of an agent tree (the root's session id), any depth.
    func agentTree(_ sessionID: ThreadID) async throws -> [ThreadRecord]
    /// Undelivered mailbox items for a thread, oldest first, with their sequence.
    func pendingMailbox(_ recipient: ThreadID) async throws -> [(sequence: Int64, item: ContextItem)]
    /// Threads with a turn stored as in progress (left by a process that died).
    func threadsWithRunningTurns() async throws -> [ThreadID]
}
