public import ThreadwireCore

/// A ThreadStore in memory, for domain tests without disk. It applies the same
/// operations with the same rules as the SQLite store (set-if-unset, append-only history).
public actor InMemoryThreadStore: ThreadStore {
    private var threads: [ThreadID: StoredThread] = [:]
    private var mailbox: [(sequence: Int64, recipient: ThreadID, item: ContextItem)] = []
    private var nextMailboxSequence: Int64 = 1
    public private(set) var commits = 0

    public init() {}

    /// All or nothing, like a transaction: a failing operation leaves no trace.
    public func commit(_ operations: [StoreOperation]) async throws {
        var threads = self.threads
        var mailbox = self.mailbox
        var nextSequence = nextMailboxSequence
        for operation in operations {
            switch operation {
            case let .putThread(record):
                if record.version <= 1 {
                    guard threads[record.id] == nil else { throw StoreConflict(threadID: record.id, expectedVersion: 0) }
                    threads[record.id] = StoredThread(record: record, history: [], turns: [])
                } else {
                    guard threads[record.id]?.record.version == record.version - 1 else {
                        throw StoreConflict(threadID: record.id, expectedVersion: record.version - 1)
                    }
                    threads[record.id]!.record = record
                }
            case let .appendHistory(id, first, items):
                guard threads[id]?.history.count == first else { throw DomainError.internal("history sequence mismatch for \(id)") }
                threads[id]!.history += items
            case let .putTurn(turn):
                guard threads[turn.threadID] != nil else { throw DomainError.internal("turn of unknown thread \(turn.threadID)") }
                if let index = threads[turn.threadID]!.turns.firstIndex(where: { $0.id == turn.id }) {
                    threads[turn.threadID]!.turns[index] = turn
                } else {
                    threads[turn.threadID]!.turns.append(turn)
                }
            case let .enqueueMailbox(recipient, item):
                mailbox.append((nextSequence, recipient, item))
                nextSequence += 1
            case let .removeMailbox(recipient, through):
                mailbox.removeAll { $0.recipient == recipient && $0.sequence <= through }
            }
        }
        commits += 1
        self.threads = threads
        self.mailbox = mailbox
        nextMailboxSequence = nextSequence
    }

    public func loadThread(_ id: ThreadID) async throws -> StoredThread? { threads[id] }

    public func threadRecord(_ id: ThreadID) async throws -> ThreadRecord? { threads[id]?.record }

    public func listThreads(_ query: ThreadListQuery) async throws -> (records: [ThreadRecord], nextCursor: String?) {
        let key: (ThreadRecord) -> Millis = query.sortKey == .createdAt ? { $0.createdAt } : { $0.updatedAt }
        let sorted = threads.values.map(\.record)
            .filter { $0.archived == query.archived && (query.parentID == nil || $0.parentID == query.parentID) && (query.owner == nil || $0.owner == query.owner) }
            .sorted { query.ascending ? (key($0), $0.id) < (key($1), $1.id) : (key($0), $0.id) > (key($1), $1.id) }
        return (Array(sorted.prefix(query.limit)), nil)
    }

    public func agentTree(_ sessionID: ThreadID) async throws -> [ThreadRecord] {
        threads.values.map(\.record).filter { $0.sessionID == sessionID && $0.parentID != nil }
            .sorted { ($0.createdAt, $0.id) < ($1.createdAt, $1.id) }
    }

    public func pendingMailbox(_ recipient: ThreadID) async throws -> [(sequence: Int64, item: ContextItem)] {
        mailbox.filter { $0.recipient == recipient }.map { (sequence: $0.sequence, item: $0.item) }
    }

    public func turnsPage(_ id: ThreadID, afterSequence: Int?, limit: Int, descending: Bool) async throws -> [TurnRecord]? {
        threads[id].map { $0.turns.page(afterSequence: afterSequence, limit: limit, descending: descending) }
    }

    public func threadsWithRunningTurns() async throws -> [ThreadID] {
        threads.values.filter { $0.turns.contains { $0.status == .inProgress } }.map(\.record.id).sorted()
    }

    /// Test hook: put a stored thread as-is (e.g. a legacy import).
    public func seed(_ thread: StoredThread) { threads[thread.record.id] = thread }
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
