import Crypto
import Foundation

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
        /// The rollout's own thread id when another principal's thread has
        /// it: the thread was imported under `record.id` instead.
        public var rolloutThreadID: ThreadID? = nil
    }

    /// Stores `parsed` (from `RolloutParser`) as a thread of `principal`:
    /// its record, history and turns, which content it came from (`digest`
    /// of the file's lines), and, when it is a child, its place in its
    /// parent's tree. A child whose parent is not imported yet waits in a
    /// tree named by the parent's id; the parent's import moves it (and its
    /// own children) into the parent's tree in the same commit.
    ///
    /// Principals stay apart: nothing tells one principal that another holds
    /// an id. A rollout whose id another principal's thread has is imported
    /// under this principal's alias of that id (`importAlias`), and a child
    /// names that alias as its parent, so a thread's parent is always its own
    /// principal's (or not imported yet). A parent's import links only its
    /// principal's waiting children; another principal's move on to wait for
    /// their own principal's alias of it.
    public func importThread(_ parsed: StoredThread, principal: Principal, digest: [UInt8], lines: Int) async throws -> Imported {
        var record = parsed.record
        let rolloutID = record.id
        let id = try await importID(for: rolloutID, principal: principal)
        if let before = try await store.importRecord(id) {
            // importID gave an id that is free or this principal's; another's
            // record here would be a bug, answered as any taken id is.
            guard before.principal == principal else { throw DomainError.alreadyExists("thread \(rolloutID) cannot be imported: no free id was found for it") }
            guard before.digest == digest, let stored = try await store.threadRecord(id) else {
                throw DomainError.alreadyExists(
                    "thread \(id) was imported before from other content (\(before.lines) lines); importing it again would change it")
            }
            return Imported(record: stored, outcome: .unchanged, linkedChildren: 0, rolloutThreadID: id == rolloutID ? nil : rolloutID)
        }
        if try await store.threadRecord(id) != nil { throw DomainError.alreadyExists("thread \(id) already exists") }
        record.id = id
        record.sessionID = id
        record.principal = principal
        if let rolloutParent = record.parentID {
            let parentID = try await importID(for: rolloutParent, principal: principal)
            record.parentID = parentID
            // Not imported yet: wait in a tree named by the parent's id.
            record.sessionID = try await store.threadRecord(parentID)?.sessionID ?? parentID
        }
        var turns = parsed.turns.array
        var receivers: [ThreadID: ThreadID] = [:]
        for turn in turns.indices {
            turns[turn].threadID = id
            // A spawned agent named by its rollout id is, for this principal,
            // that id's import under this principal (its alias if another
            // principal holds the id), not another principal's thread.
            for item in turns[turn].items.indices {
                guard let receiver = turns[turn].items[item].receiverThreadID else { continue }
                if receivers[receiver] == nil { receivers[receiver] = try await importID(for: receiver, principal: principal) }
                turns[turn].items[item].receiverThreadID = receivers[receiver]
            }
        }
        // Waiting for this thread (under the id it got): this principal's
        // children join its tree; others' go on waiting for their own alias.
        var waiting: [ThreadRecord] = []
        var moved: [StoreOperation] = []
        for candidate in try await store.agentTree(id) where candidate.id != id {
            if candidate.principal == principal {
                waiting.append(candidate)
                continue
            }
            var other = candidate
            let alias = Self.importAlias(of: id, for: other.principal)
            if other.parentID == id { other.parentID = alias }
            other.sessionID = alias
            other.version += 1
            moved.append(.putThread(other))
        }
        let fence = try await claimTree(record.sessionID, thread: id)
        defer { leaveTree(fence, thread: id) }
        var operations: [StoreOperation] = moved + [.putThread(record), .appendHistory(id, firstSequence: 0, items: Array(parsed.history))]
        operations += turns.map { .putTurn($0) }
        operations.append(.recordImport(ImportRecord(threadID: id, principal: principal, digest: digest, lines: lines, importedAt: nowMillis())))
        if record.sessionID != id, !waiting.isEmpty { operations.append(.relinkTree(from: id, to: record.sessionID)) }
        try await commitCreation(principal, operations, fence: fence)
        return Imported(record: record, outcome: .imported, linkedChildren: waiting.count, rolloutThreadID: id == rolloutID ? nil : rolloutID)
    }

    /// The id a rollout's thread id `rolloutID` has for `principal`: itself,
    /// unless another principal's thread has it; then the first of its
    /// aliases (`importAlias`, again and again) that no other principal's
    /// thread has.
    private func importID(for rolloutID: ThreadID, principal: Principal) async throws -> ThreadID {
        var candidate = rolloutID
        for _ in 0..<8 {
            guard let holder = try await store.threadRecord(candidate), holder.principal != principal else { return candidate }
            candidate = Self.importAlias(of: candidate, for: principal)
        }
        // Only ids chosen to collide get here; the answer names no one.
        throw DomainError.alreadyExists("thread \(rolloutID) cannot be imported: no free id was found for it")
    }

    /// A principal's own id for a thread id another principal holds: the
    /// same for every import of that principal, so its children find it.
    static func importAlias(of id: ThreadID, for principal: Principal) -> ThreadID {
        var hasher = SHA256()
        hasher.update(data: Array("threadwire import alias\u{0}\(principal)\u{0}\(id)".utf8))
        var bytes = Array(hasher.finalize().prefix(16))
        bytes[6] = (bytes[6] & 0x0F) | 0x80  // version 8 (custom), RFC 9562
        bytes[8] = (bytes[8] & 0x3F) | 0x80
        let hex = bytes.map { String(format: "%02x", $0) }.joined()
        let parts = [hex.prefix(8), hex.dropFirst(8).prefix(4), hex.dropFirst(12).prefix(4), hex.dropFirst(16).prefix(4), hex.dropFirst(20)]
        return parts.joined(separator: "-")
    }

    /// The threads of `caller`'s agent tree that are its principal's. Agent
    /// tools look trees up only through here: a tree never reaches across
    /// principals, whatever links a store holds (an import before principals
    /// were kept apart could leave one).
    func agentTree(of caller: ThreadRecord) async throws -> [ThreadRecord] {
        try await store.agentTree(caller.sessionID).filter { $0.principal == caller.principal }
    }

    /// The thread is not loaded here: its tree's lease goes when nothing else holds it.
    func leaveTree(_ fence: LeaseFence?, thread: ThreadID) {
        guard let fence, let coordinator, let released = heldTrees.leave(fence, thread) else { return }
        tasks.spawn { await coordinator.release([released]) }
    }
}
