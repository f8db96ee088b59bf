public import ThreadwireCore
import ThreadwireStorage

/// A ThreadStore in memory, for domain tests without disk. It passes the same
/// conformance suite as the SQLite and PostgreSQL stores (ThreadwireStoreTests):
/// the same compare-and-set, append-only history, keyset pages and atomic commits.
public actor InMemoryThreadStore: ThreadStore {
    private var records: [ThreadID: ThreadRecord] = [:]
    /// History items by sequence, and turns by id, kept like rows: apart
    /// from their thread's row.
    private var history: [ThreadID: [Int: ContextItem]] = [:]
    private var turns: [ThreadID: [TurnID: TurnRecord]] = [:]
    private var mailbox: [(sequence: Int64, recipient: ThreadID, item: ContextItem)] = []
    private var nextMailboxSequence: Int64 = 1
    private var keys: [IdempotencyKey: IdempotencyRecord] = [:]
    private var imports: [ThreadID: ImportRecord] = [:]
    private var events: [ThreadID: [Int64: StoredEvent]] = [:]
    public private(set) var commits = 0

    public init() {}

    /// All or nothing, like a transaction: a failing operation leaves no trace.
    public func commit(_ operations: [StoreOperation]) async throws {
        var records = self.records
        var history = self.history
        var turns = self.turns
        var mailbox = self.mailbox
        var nextSequence = nextMailboxSequence
        var keys = self.keys
        var imports = self.imports
        var events = self.events
        for operation in operations {
            switch operation {
            case let .putThread(record):
                if record.version <= 1 {
                    guard records[record.id] == nil else { throw StoreError.conflict(threadID: record.id, expectedVersion: 0) }
                } else {
                    guard let stored = records[record.id], stored.version == record.version - 1, stored.principal == record.principal else {
                        throw StoreError.conflict(threadID: record.id, expectedVersion: record.version - 1)
                    }
                }
                records[record.id] = record
            case let .appendHistory(id, first, items):
                for (offset, item) in items.enumerated() {
                    guard history[id]?[first + offset] == nil else {
                        throw StoreError.historySequenceTaken(threadID: id, sequence: first + offset)
                    }
                    history[id, default: [:]][first + offset] = item
                }
            case let .putTurn(turn):
                turns[turn.threadID, default: [:]][turn.id] = turn
            case let .enqueueMailbox(recipient, item):
                mailbox.append((nextSequence, recipient, item))
                nextSequence += 1
            case let .removeMailbox(recipient, through):
                mailbox.removeAll { $0.recipient == recipient && $0.sequence <= through }
            case let .claimIdempotencyKey(claim, response):
                guard keys[claim.key] == nil else { throw StoreError.idempotencyKeyTaken(claim.key) }
                keys[claim.key] = IdempotencyRecord(claim: claim, response: response)
            case let .recordIdempotentResponse(claim, response):
                var record = keys[claim.key] ?? IdempotencyRecord(claim: claim, response: nil)
                if record.response == nil { record.response = response }
                keys[claim.key] = record
            case let .recordImport(record):
                imports[record.threadID] = record
            case let .relinkTree(from, to):
                for (id, record) in records where record.sessionID == from && id != from {
                    var moved = record
                    moved.sessionID = to
                    moved.version += 1
                    records[id] = moved
                }
            case let .appendEvents(id, kept):
                for event in kept {
                    guard events[id]?[event.sequence] == nil else {
                        throw StoreError.historySequenceTaken(threadID: id, sequence: Int(event.sequence))
                    }
                    events[id, default: [:]][event.sequence] = event
                }
            }
        }
        self.events = events
        commits += 1
        self.keys = keys
        self.imports = imports
        self.records = records
        self.history = history
        self.turns = turns
        self.mailbox = mailbox
        nextMailboxSequence = nextSequence
    }

    private func sortedTurns(_ id: ThreadID) -> [TurnRecord] {
        (turns[id]?.values).map { $0.sorted { $0.sequence < $1.sequence } } ?? []
    }

    public func loadThread(_ id: ThreadID) async throws -> StoredThread? {
        guard let record = records[id] else { return nil }
        let items = (history[id] ?? [:]).sorted { $0.key < $1.key }.map(\.value)
        return StoredThread(record: record, history: items, turns: sortedTurns(id))
    }

    public func threadRecord(_ id: ThreadID) async throws -> ThreadRecord? { records[id] }

    public func listThreads(_ query: ThreadListQuery) async throws -> (records: [ThreadRecord], nextCursor: String?) {
        let key: (ThreadRecord) -> Millis = query.sortKey == .createdAt ? { $0.createdAt } : { $0.updatedAt }
        let after = try query.position().map { ($0.sortValue, $0.id) }
        let sorted = records.values
            .filter { $0.archived == query.archived && (query.parentID == nil || $0.parentID == query.parentID) && (query.principal == nil || $0.principal == query.principal) && query.matchesSearch($0) }
            .filter { record in
                guard let after else { return true }
                return query.ascending ? (key(record), record.id) > after : (key(record), record.id) < after
            }
            .sorted { query.ascending ? (key($0), $0.id) < (key($1), $1.id) : (key($0), $0.id) > (key($1), $1.id) }
        let page = Array(sorted.prefix(query.limit))
        return (page, sorted.count > query.limit ? page.last.map(query.cursor(after:)) : nil)
    }

    public func agentTree(_ sessionID: ThreadID) async throws -> [ThreadRecord] {
        records.values.filter { $0.sessionID == sessionID && $0.parentID != nil }
            .sorted { ($0.createdAt, $0.id) < ($1.createdAt, $1.id) }
    }

    public func pendingMailbox(_ recipient: ThreadID) async throws -> [(sequence: Int64, item: ContextItem)] {
        mailbox.filter { $0.recipient == recipient }.map { (sequence: $0.sequence, item: $0.item) }
    }

    public func turnsPage(_ id: ThreadID, afterSequence: Int?, limit: Int, descending: Bool) async throws -> [TurnRecord]? {
        guard records[id] != nil else { return nil }
        return sortedTurns(id).page(afterSequence: afterSequence, limit: limit, descending: descending)
    }

    /// Measured as the SQL stores measure: the bytes of each record as stored.
    public func storedBytes(of principal: Principal) async throws -> Int64 {
        var bytes = 0
        for (id, record) in records where record.principal == principal {
            bytes += turns[id, default: [:]].values.reduce(0) { $0 + StoredRecords.encode($1).count }
            bytes += history[id, default: [:]].values.reduce(0) { $0 + StoredRecords.encode($1).count }
        }
        return Int64(bytes)
    }

    public func threadsWithRunningTurns() async throws -> [ThreadID] {
        turns.filter { $0.value.values.contains { $0.status == .inProgress } }.map(\.key).sorted()
    }

    public func deleteTree(_ root: ThreadID, fence: LeaseFence?) async throws -> [ThreadID] {
        guard records[root] != nil else { return [] }
        let members = [root] + records.values.filter { $0.sessionID == root && $0.id != root }.map(\.id).sorted()
        for member in members {
            records[member] = nil
            history[member] = nil
            turns[member] = nil
            imports[member] = nil
            events[member] = nil
        }
        mailbox.removeAll { members.contains($0.recipient) }
        keys = keys.filter { !members.contains($0.value.claim.threadID ?? "") }
        return members
    }

    public func threadsWithQueuedTurns() async throws -> [ThreadID] {
        records.filter { !$0.value.queue.isEmpty }.map(\.key).sorted()
    }

    public func idempotencyRecord(_ key: IdempotencyKey) async throws -> IdempotencyRecord? { keys[key] }

    public func trimEvents(keep: Int64, createdBefore: Millis) async throws -> Int {
        var forgotten = 0
        for (id, kept) in events {
            let newest = records[id]?.eventSequence ?? 0
            let left = kept.filter { $0.key >= newest || ($0.key > newest - keep && $0.value.createdAt >= createdBefore) }
            forgotten += kept.count - left.count
            events[id] = left
        }
        return forgotten
    }

    public func events(_ thread: ThreadID, after: Int64, limit: Int) async throws -> [StoredEvent] {
        Array((events[thread].map { Array($0.values) } ?? []).filter { $0.sequence > after }.sorted { $0.sequence < $1.sequence }.prefix(limit))
    }

    public func importRecord(_ thread: ThreadID) async throws -> ImportRecord? { imports[thread] }

    public func purgeIdempotencyRecords(createdBefore millis: Int64) async throws -> Int {
        let before = keys.count
        keys = keys.filter { $0.value.claim.createdAtMillis >= millis }
        return before - keys.count
    }

    /// Test hook: put a stored thread as-is (e.g. a legacy import).
    public func seed(_ thread: StoredThread) {
        let id = thread.record.id
        records[id] = thread.record
        history[id] = Dictionary(uniqueKeysWithValues: thread.history.enumerated().map { ($0.offset, $0.element) })
        turns[id] = Dictionary(uniqueKeysWithValues: thread.turns.map { ($0.id, $0) })
    }
}

/// Collects deliveries, for assertions.
public final class RecordingSink: EventSink, @unchecked Sendable {
    private let lock = NSLockLite()
    private var stored: [Delivery] = []
    public init() {}
    public func deliver(_ deliveries: [Delivery]) { lock.withLock { stored += deliveries } }
    public var deliveries: [Delivery] { lock.withLock { stored } }
}

/// A tiny lock so this module needs no Foundation.
final class NSLockLite: @unchecked Sendable {
    private var mutex = pthread_mutex_t()
    init() { pthread_mutex_init(&mutex, nil) }
    func withLock<T>(_ body: () -> T) -> T {
        pthread_mutex_lock(&mutex)
        defer { pthread_mutex_unlock(&mutex) }
        return body()
    }
}

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
