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
    /// Only threads of this principal (nil: every thread, for a server
    /// without authentication).
    public var owner: Principal?
    public init() {}

    /// The cursor of the page that starts after `record` (keyset: sort value, id).
    public func cursor(after record: ThreadRecord) -> String {
        "\(sortKey == .createdAt ? record.createdAt : record.updatedAt)|\(record.id)"
    }
}

/// Where threads live. Implementations make a commit durable before returning
/// and never block the caller's thread on I/O. Nothing outside the store
/// knows how it stores (no SQL leaves it).
public protocol ThreadStore: Sendable {
    func commit(_ operations: [StoreOperation]) async throws
    /// A commit applied only while `fence` is the current lease of its agent
    /// tree (several instances on one store); throws `LeaseLost` otherwise.
    /// Stores that one process owns alone never receive a fence.
    func commit(_ operations: [StoreOperation], fence: LeaseFence?) async throws
    func loadThread(_ id: ThreadID) async throws -> StoredThread?
    func threadRecord(_ id: ThreadID) async throws -> ThreadRecord?
    /// A page of records and the cursor of the next page (nil on the last).
    func listThreads(_ query: ThreadListQuery) async throws -> (records: [ThreadRecord], nextCursor: String?)
    /// Up to `limit` turns of a thread in sequence order (newest first when
    /// `descending`), strictly after `afterSequence` in that order; nil if
    /// the thread does not exist.
    func turnsPage(_ id: ThreadID, afterSequence: Int?, limit: Int, descending: Bool) async throws -> [TurnRecord]?
    /// Every spawned thread of an agent tree (the root's session id), any depth.
    func agentTree(_ sessionID: ThreadID) async throws -> [ThreadRecord]
    /// Undelivered mailbox items for a thread, oldest first, with their sequence.
    func pendingMailbox(_ recipient: ThreadID) async throws -> [(sequence: Int64, item: ContextItem)]
    /// Threads with a turn stored as in progress (left by a process that died).
    func threadsWithRunningTurns() async throws -> [ThreadID]
    /// Throws unless a commit would succeed now (disk full, I/O error):
    /// health and readiness follow it.
    func probe() async throws
}

extension ThreadStore {
    public func probe() async throws {}

    public func commit(_ operations: [StoreOperation], fence: LeaseFence?) async throws {
        guard fence == nil else {
            throw DomainError.internal("this store cannot check lease fences; it serves one instance only")
        }
        try await commit(operations)
    }
}

/// Turn page cursors: opaque to clients, a turn sequence to the server.
public enum TurnCursor {
    public static func encode(sequence: Int) -> String { "turn:\(sequence)" }

    public static func decode(_ cursor: String) throws -> Int {
        guard cursor.hasPrefix("turn:"), let sequence = Int(cursor.dropFirst(5)), sequence >= 0 else {
            throw DomainError.invalidArgument("cursor '\(cursor)' is not a turn cursor this server returned")
        }
        return sequence
    }
}

extension Array where Element == TurnRecord {
    /// The in-memory equivalent of `ThreadStore.turnsPage` (turns sorted by sequence).
    public func page(afterSequence: Int?, limit: Int, descending: Bool) -> [TurnRecord] {
        if descending {
            let upper = afterSequence.map { bound in self.firstIndex { $0.sequence >= bound } ?? count } ?? count
            return Array(self[..<upper].suffix(limit).reversed())
        }
        let lower = afterSequence.map { bound in self.firstIndex { $0.sequence > bound } ?? count } ?? 0
        return Array(self[lower...].prefix(limit))
    }
}
