/// thread/import: a parsed codex rollout becomes a thread of the importing
/// principal, in one commit, on any store and any instance.
extension ThreadEngine {
    public enum ImportOutcome: Sendable, Equatable {
        case imported
        /// The same content was imported before; nothing changed.
        case unchanged
    }

    public struct Imported: Sendable {
        public var record: ThreadRecord
        public var outcome: ImportOutcome
        /// Children imported before this thread, now in its tree.
        public var linkedChildren: Int
    }

    /// Stores `parsed` (from `RolloutParser`) as a thread of `principal`:
    /// its record, history and turns, which content it came from (`digest`
    /// of the file's lines), and, when it is a child, its place in its
    /// parent's tree. A child whose parent is not imported yet waits in a
    /// tree named by the parent's id; the parent's import moves it (and its
    /// own children) into the parent's tree in the same commit.
    public func importThread(_ parsed: StoredThread, principal: Principal, digest: [UInt8], lines: Int) async throws -> Imported {
        var record = parsed.record
        let id = record.id
        if let before = try await store.importRecord(id) {
            guard before.principal == principal else { throw DomainError.alreadyExists("thread \(id) already exists") }
            guard before.digest == digest, let stored = try await store.threadRecord(id) else {
                throw DomainError.alreadyExists(
                    "thread \(id) was imported before from other content (\(before.lines) lines); importing it again would change it")
            }
            return Imported(record: stored, outcome: .unchanged, linkedChildren: 0)
        }
        if try await store.threadRecord(id) != nil { throw DomainError.alreadyExists("thread \(id) already exists") }
        record.principal = principal
        if let parentID = record.parentID {
            if let parent = try await store.threadRecord(parentID) {
                guard parent.principal == principal else {
                    throw DomainError.failedPrecondition("the parent of thread \(id), thread \(parentID), is another principal's")
                }
                record.sessionID = parent.sessionID
            } else {
                record.sessionID = parentID  // until the parent arrives
            }
        }
        let waiting = try await store.agentTree(id).filter { $0.id != id }.count
        let fence = try await claimTree(record.sessionID, thread: id)
        defer { leaveTree(fence, thread: id) }
        var operations: [StoreOperation] = [.putThread(record), .appendHistory(id, firstSequence: 0, items: Array(parsed.history))]
        operations += parsed.turns.map { .putTurn($0) }
        operations.append(.recordImport(ImportRecord(threadID: id, principal: principal, digest: digest, lines: lines, importedAt: nowMillis())))
        if record.sessionID != id { operations.append(.relinkTree(from: id, to: record.sessionID)) }
        try await commitCreation(principal, operations, fence: fence)
        return Imported(record: record, outcome: .imported, linkedChildren: waiting)
    }

    /// The thread is not loaded here: its tree's lease goes when nothing else holds it.
    func leaveTree(_ fence: LeaseFence?, thread: ThreadID) {
        guard let fence, let coordinator, let released = heldTrees.leave(fence, thread) else { return }
        tasks.spawn { await coordinator.release([released]) }
    }
}
