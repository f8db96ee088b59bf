import Tracing
public import ThreadwireCore

/// A store whose commits are spans (tracing on): the backend and how many
/// operations the commit carries. Reads pass straight through.
public struct TracedThreadStore: ThreadStore {
    public let inner: any ThreadStore
    /// As OpenTelemetry's `db.system` names it: "sqlite", "postgresql".
    public let backend: String

    public init(_ inner: any ThreadStore, backend: String) {
        self.inner = inner
        self.backend = backend
    }

    public func commit(_ operations: [StoreOperation]) async throws {
        try await traced(operations, fence: nil) { try await inner.commit(operations) }
    }

    public func commit(_ operations: [StoreOperation], fence: LeaseFence?) async throws {
        try await traced(operations, fence: fence) { try await inner.commit(operations, fence: fence) }
    }

    private func traced(_ operations: [StoreOperation], fence: LeaseFence?, _ body: () async throws -> Void) async throws {
        try await ThreadTracing.span("store.commit", kind: .client, attributes: [
            "db.system": .string(backend), "threadwire.store.operations": .int64(Int64(operations.count)),
            "threadwire.store.fenced": .bool(fence != nil),
        ]) { span in
            try await body()
        }
    }

    public func loadThread(_ id: ThreadID) async throws -> StoredThread? { try await inner.loadThread(id) }
    public func threadRecord(_ id: ThreadID) async throws -> ThreadRecord? { try await inner.threadRecord(id) }
    public func listThreads(_ query: ThreadListQuery) async throws -> (records: [ThreadRecord], nextCursor: String?) {
        try await inner.listThreads(query)
    }
    public func turnsPage(_ id: ThreadID, afterSequence: Int?, limit: Int, descending: Bool) async throws -> [TurnRecord]? {
        try await inner.turnsPage(id, afterSequence: afterSequence, limit: limit, descending: descending)
    }
    public func agentTree(_ sessionID: ThreadID) async throws -> [ThreadRecord] { try await inner.agentTree(sessionID) }
    public func pendingMailbox(_ recipient: ThreadID) async throws -> [(sequence: Int64, item: ContextItem)] {
        try await inner.pendingMailbox(recipient)
    }
    public func threadsWithRunningTurns() async throws -> [ThreadID] { try await inner.threadsWithRunningTurns() }
    public func threadsWithQueuedTurns() async throws -> [ThreadID] { try await inner.threadsWithQueuedTurns() }
    public func deleteTree(_ root: ThreadID, fence: LeaseFence?) async throws -> [ThreadID] { try await inner.deleteTree(root, fence: fence) }
    public func events(_ thread: ThreadID, after: Int64, limit: Int) async throws -> [StoredEvent] {
        try await inner.events(thread, after: after, limit: limit)
    }
    public func trimEvents(keep: Int64, createdBefore: Millis) async throws -> Int {
        try await inner.trimEvents(keep: keep, createdBefore: createdBefore)
    }
    public func probe() async throws { try await inner.probe() }
    public func storedBytes(of principal: Principal) async throws -> Int64 {
        try await inner.storedBytes(of: principal)
    }
    public func idempotencyRecord(_ key: IdempotencyKey) async throws -> IdempotencyRecord? { try await inner.idempotencyRecord(key) }
    public func importRecord(_ thread: ThreadID) async throws -> ImportRecord? { try await inner.importRecord(thread) }
    public func purgeIdempotencyRecords(createdBefore millis: Int64) async throws -> Int {
        try await inner.purgeIdempotencyRecords(createdBefore: millis)
    }
}
