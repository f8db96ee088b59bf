/// One durable change. A commit applies a list of them atomically.
public enum StoreOperation: Sendable {
    /// Insert a thread (version 1) or replace version `record.version - 1`
    /// of it; anything else fails with `StoreError.conflict` and changes nothing.
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
    /// Store the key of a keyed change with the change, and the answer the
    /// change makes when it can be told from the change itself. If the key
    /// is stored already the whole commit fails with
    /// `StoreError.idempotencyKeyTaken` and writes nothing.
    case claimIdempotencyKey(IdempotencyClaim, response: [UInt8]?)
    /// The answer to a keyed request: added to its claim, or stored with the
    /// claim when the request changed nothing (a refusal, a no-op). An answer
    /// already stored is kept (the first counts).
    case recordIdempotentResponse(IdempotencyClaim, response: [UInt8])
    /// Remember which content a thread was imported from (thread/import).
    case recordImport(ImportRecord)
    /// Threads imported before their ancestor (their tree named by that
    /// ancestor's id, `from`) join its tree, `to`; each such row's version is
    /// bumped, so a stale copy of it cannot overwrite the change.
    case relinkTree(from: ThreadID, to: ThreadID)
    /// Keep a thread's events (numbered from its record's `eventSequence`);
    /// a number stored already fails the commit with
    /// `StoreError.historySequenceTaken` and writes nothing.
    case appendEvents(ThreadID, [StoredEvent])
}

/// One kept event: its number in its thread, when it was committed, and its
/// encoding (opaque to the store; the server's notification without its
/// per-connection fields).
public struct StoredEvent: Sendable, Equatable {
    public var sequence: Int64
    public var createdAt: Millis
    public var bytes: [UInt8]
    public init(sequence: Int64, createdAt: Millis, bytes: [UInt8]) {
        self.sequence = sequence
        self.createdAt = createdAt
        self.bytes = bytes
    }
}

/// Which content a thread was imported from: importing the same again
/// changes nothing.
public struct ImportRecord: Sendable, Equatable {
    public var threadID: ThreadID
    public var principal: Principal
    /// SHA-256 of the file's lines.
    public var digest: [UInt8]
    public var lines: Int
    public var importedAt: Millis
    public init(threadID: ThreadID, principal: Principal, digest: [UInt8], lines: Int, importedAt: Millis) {
        self.threadID = threadID
        self.principal = principal
        self.digest = digest
        self.lines = lines
        self.importedAt = importedAt
    }
}

/// Every way a store refuses or fails a call, for every store; mapped to
/// the client's status in one place (`domainError`).
public enum StoreError: Error, CustomStringConvertible, Equatable {
    /// A versioned write lost the race: the stored version is not the one
    /// the writer started from (0: the thread already exists). Never retried
    /// blindly: the owner reloads. Nothing of the commit was written.
    case conflict(threadID: ThreadID, expectedVersion: Int64)
    /// This instance's lease on the agent tree was taken over (several
    /// instances); nothing of the commit was written.
    case leaseLost(LeaseFence)
    /// The store could not do it now (I/O, the database unreachable, a
    /// timeout, a full disk); the message says what and what became of it.
    case unavailable(String)
    /// How the store was configured cannot work (a bad --store URL).
    case misconfigured(String)
    /// A commit's `claimIdempotencyKey` found the key stored already;
    /// nothing of the commit was written.
    case idempotencyKeyTaken(IdempotencyKey)
    /// The commit was sent and its answer never came (a timeout, a
    /// connection lost mid-commit): it may or may not have been applied.
    case outcomeUnknown(String)
    /// A history item's sequence is stored already: a writer appended on
    /// top of a history it had not read. Nothing of the commit was written.
    case historySequenceTaken(threadID: ThreadID, sequence: Int)

    public var description: String {
        switch self {
        case let .conflict(thread, 0): "thread \(thread) already exists"
        case let .conflict(thread, expected): "thread \(thread) is no longer at version \(expected); a stale write was refused"
        case let .leaseLost(fence):
            "this instance no longer owns agent tree \(fence.tree) (lease epoch \(fence.epoch) was taken over); the change was not made"
        case let .unavailable(message), let .misconfigured(message): message
        case let .idempotencyKeyTaken(key): IdempotencyKeyTaken(key: key).description
        case let .outcomeUnknown(reason): "the store did not confirm the commit (\(reason)): the change may or may not have been made"
        case let .historySequenceTaken(thread, sequence):
            "history item \(sequence) of thread \(thread) is already stored; a stale write was refused"
        }
    }

    /// What the client is told: the one mapping of store errors.
    public var domainError: DomainError {
        switch self {
        case .conflict(_, 0): .alreadyExists(description)
        case .conflict: .aborted(description + "; retry the request")
        case .leaseLost: .unavailable(description + "; retry, the request then reaches the new owner")
        case let .unavailable(message): .unavailable(message)
        case let .misconfigured(message): .invalidArgument(message)
        case .idempotencyKeyTaken: .aborted(description + "; repeat the request to get the first one's answer")
        case .outcomeUnknown: .unavailable(description + "; read the thread, or repeat the request with the same idempotency key")
        case .historySequenceTaken: .aborted(description + "; retry the request")
        }
    }

    /// Any error a store's driver threw, as a store error.
    public static func wrapping(_ error: any Error) -> StoreError {
        (error as? StoreError) ?? .unavailable("\(error)")
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
    public var principal: Principal?
    /// Only threads whose name or preview contains this (ignoring case);
    /// at least `minimumSearchTermLength` characters, so a trigram index serves it.
    public var searchTerm: String?
    public static let minimumSearchTermLength = 3
    public init() {}

    /// Whether `record` matches `searchTerm` (the stores' indexes answer the
    /// same question; this is the reference for the in-memory store).
    public func matchesSearch(_ record: ThreadRecord) -> Bool {
        guard let term = searchTerm?.lowercased() else { return true }
        return (record.name ?? "").lowercased().contains(term) || record.preview.lowercased().contains(term)
    }

    /// The cursor of the page that starts after `record` (keyset: sort value, id).
    public func cursor(after record: ThreadRecord) -> String {
        "\(sortKey == .createdAt ? record.createdAt : record.updatedAt)|\(record.id)"
    }

    /// Where the page starts: the sort value and id of the last thread of
    /// the previous page, read from `cursor` (nil for the first page). The
    /// one reader of what `cursor(after:)` writes.
    public func position() throws -> (sortValue: Int64, id: ThreadID)? {
        guard let cursor else { return nil }
        let parts = cursor.split(separator: "|", maxSplits: 1)
        guard parts.count == 2, let value = Int64(parts[0]) else {
            throw DomainError.invalidArgument("cursor '\(cursor)' is not a cursor this server returned")
        }
        return (value, String(parts[1]))
    }
}

/// A probe that could not look at the store: the process is out of file
/// descriptors, so it could not open its test file, while the store's open
/// connections still commit. It says nothing about the store.
public struct ProbeInconclusive: Error, CustomStringConvertible {
    public var description: String
    public init(_ description: String) { self.description = description }
}

/// Where threads live. Implementations make a commit durable before returning
/// and never block the caller's thread on I/O. Nothing outside the store
/// knows how it stores (no SQL leaves it).
public protocol ThreadStore: Sendable {
    func commit(_ operations: [StoreOperation]) async throws
    /// A commit applied only while `fence` is the current lease of its agent
    /// tree (several instances on one store); throws `StoreError.leaseLost` otherwise.
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
    /// Up to `limit` kept events of a thread numbered above `after`, oldest first.
    func events(_ thread: ThreadID, after: Int64, limit: Int) async throws -> [StoredEvent]
    /// Retention, for every thread: forgets the events numbered `keep` or
    /// more below the thread's newest, and those created before
    /// `createdBefore`, never a thread's newest. How many it forgot.
    func trimEvents(keep: Int64, createdBefore: Millis) async throws -> Int
    /// Threads with a turn stored as in progress (left by a process that died).
    func threadsWithRunningTurns() async throws -> [ThreadID]
    /// Threads whose queue holds turns (`ThreadRecord.queue`).
    func threadsWithQueuedTurns() async throws -> [ThreadID]
    /// thread/delete: the root and every thread of its agent tree (session
    /// `root`), with their history, turns, kept events, mailbox, import
    /// records and idempotency keys, in one transaction; applied only while
    /// `fence` is the tree's lease when given (else `StoreError.leaseLost`).
    /// The ids deleted, the root first (none when it is gone already).
    func deleteTree(_ root: ThreadID, fence: LeaseFence?) async throws -> [ThreadID]
    /// Throws unless a commit would succeed now (disk full, I/O error):
    /// health and readiness follow it. `ProbeInconclusive` when it could
    /// not look, which leaves health as it was.
    func probe() async throws
    /// The stored key of a keyed change or answer, if any.
    func idempotencyRecord(_ key: IdempotencyKey) async throws -> IdempotencyRecord?
    /// Forgets keys stored before `millis` (milliseconds since 1970); how many.
    func purgeIdempotencyRecords(createdBefore millis: Int64) async throws -> Int
    /// What a thread was imported from, if it was.
    func importRecord(_ thread: ThreadID) async throws -> ImportRecord?
    /// Bytes of stored turns and model history of the principal's threads
    /// (limits.max_stored_bytes); reads all of them, so callers cache it.
    func storedBytes(of principal: Principal) async throws -> Int64
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

extension RandomAccessCollection where Element == TurnRecord, Index == Int {
    /// The in-memory equivalent of `ThreadStore.turnsPage` (turns sorted by sequence).
    public func page(afterSequence: Int?, limit: Int, descending: Bool) -> [TurnRecord] {
        if descending {
            let upper = afterSequence.map { bound in self.firstIndex { $0.sequence >= bound } ?? endIndex } ?? endIndex
            return Array(self[..<upper].suffix(limit).reversed())
        }
        let lower = afterSequence.map { bound in self.firstIndex { $0.sequence > bound } ?? endIndex } ?? startIndex
        return Array(self[lower...].prefix(limit))
    }
}
