/// thread/delete: a root and its agent tree leave the store in one
/// transaction, and this instance's memory with them.
extension ThreadEngine {
    public func deleteThread(_ id: ThreadID, force: Bool) async throws -> Outcome<[ThreadID]> {
        let members: [ThreadID] = try await withOwner(id) { owner in
            let record = owner.current.record
            if record.source == .threadSpawn, let parent = record.parentID {
                throw DomainError.failedPrecondition(
                    "thread \(id) is a child agent (of \(parent)); delete its root \(record.sessionID): the whole tree goes as one")
            }
            return [id] + (try await store.agentTree(record.sessionID)).map(\.id).filter { $0 != id }
        }
        // The tree's running turns: refused, or interrupted first with force.
        let running = members.compactMap { member in directory.snapshot(member)?.activeTurn.map { (member, $0.id) } }
        if let (thread, turn) = running.first, !force {
            throw DomainError.failedPrecondition(
                "turn \(turn) of thread \(thread) (in the tree of \(id)) is running; interrupt it, or delete with force")
        }
        for (thread, turn) in running {
            (try? await interruptTurn(thread, turnID: turn))?.publish()
        }
        let deleted: [ThreadID] = try await withOwner(id) { owner in
            if let busy = members.first(where: { directory.snapshot($0)?.activeTurn != nil }), !force {
                throw DomainError.failedPrecondition("a turn of thread \(busy) started meanwhile; interrupt it, or delete with force")
            }
            let gone: [ThreadID]
            do {
                gone = try await store.deleteTree(id, fence: owner.fence)
            } catch let error as StoreError {
                throw error.domainError
            }
            owner.publisher.ticket([Delivery(event: .deleted(id), recipients: owner.subscribers + owner.formerSubscribers)]).publish()
            drop(owner, retiring: true)
            return gone
        }
        // The children loaded here leave memory too, each under its own gate.
        for member in deleted.dropFirst() {
            guard let owner = directory.existing(member) else { continue }
            await owner.gate.lock()
            if !owner.retired {
                owner.publisher.ticket([Delivery(event: .deleted(member), recipients: owner.subscribers + owner.formerSubscribers)]).publish()
                drop(owner, retiring: true)
            }
            owner.gate.unlock()
        }
        for member in deleted { changes.changed(member) }
        return Outcome(deleted)
    }
}
