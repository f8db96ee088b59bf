import Foundation
import Synchronization

/// How a turn ends: completed, failed or interrupted, its item events and
/// what its end tells a parent agent.
extension ThreadEngine {
    /// With the gate held.
    func failTurn(_ owner: ThreadOwner, turnID: TurnID, error: String, reason: TurnFailureReason) async {
        guard let state = owner.state, let index = state.activeTurnIndex, state.turns[index].id == turnID else { return }
        do {
            try await endActiveTurn(owner, status: .failed, error: error, reason: reason).publish()
        } catch _ {
            // The store refused the end as well (a full disk, PostgreSQL
            // away): the turn has no runner now, and would stay IN_PROGRESS
            // for good, here and in the store. It is ended once the store
            // commits again.
            endWhenTheStoreCommits(owner, turnID: turnID, error: error, reason: reason)
        }
    }

    /// Retries failing the turn, backing off up to 5 s, until the end is
    /// committed or the turn is no longer this owner's to end (another end
    /// landed, the thread was unloaded, the engine stops).
    private func endWhenTheStoreCommits(_ owner: ThreadOwner, turnID: TurnID, error: String, reason: TurnFailureReason) {
        _ = tasks.spawn { [self] in
            var pause = Duration.milliseconds(250)
            while !stopping.load(ordering: .acquiring) {
                try? await Task.sleep(for: pause)
                let settled = await owner.locked { () -> Bool in
                    guard !owner.retired, let state = owner.state, let index = state.activeTurnIndex,
                          state.turns[index].id == turnID else { return true }
                    guard let ended = try? await endActiveTurn(owner, status: .failed, error: error, reason: reason) else { return false }
                    ended.publish()
                    return true
                }
                if settled { return }
                pause = min(pause * 2, .seconds(5))
            }
        }
    }

    /// Ends the active turn (gate held): cancels its runner, commits the end,
    /// and returns the notifications to publish.
    func endActiveTurn(_ owner: ThreadOwner, status: TurnStatus, error: String?, reason: TurnFailureReason? = nil) async throws -> Publication {
        var next = owner.current
        guard let index = next.activeTurnIndex else { return owner.publisher.ticket([]) }
        if status != .completed && status != .failed {
            owner.runner?.cancel()
        }
        owner.runner = nil
        // No delta may follow the turn's end.
        _ = owner.messageStream?.close()
        owner.messageStream = nil
        if status == .failed { next.turns[index].failureReason = reason ?? .internalError }
        let withdrawn = next.turns[index].pendingRequests
        var operations = finish(&next, index: index, status: status, error: error)
        operations.insert(.putThread(next.record.bumped()), at: 0)
        var events: [Delivery] = []
        for request in withdrawn {
            if let item = next.turns[index].items.first(where: { $0.id == request.kind.itemID }) {
                events.append(Delivery(event: .itemCompleted(owner.id, next.turns[index].id, item), recipients: owner.subscribers))
            }
            events.append(Delivery(event: .serverRequestResolved(owner.id, requestID: request.id, .withdrawn), recipients: resolutionRecipients(owner)))
        }
        let deliveries = try await install(owner, next, operations, events: events + finishEvents(owner, next.turns[index]))
        for request in withdrawn {
            pendingAnswers.withdraw(request.id)
            treeRequests.remove(request)
        }
        afterFinish(owner)
        return owner.publisher.ticket(deliveries)
    }

    /// Ends turn `index` in `stored` (no I/O) and returns what to commit
    /// besides the record: an interruption records the runtime's marker; a
    /// child's end updates its registry entry and queues its report to the
    /// parent (v1: <subagent_notification>; v2: a mailbox item) in the same
    /// transaction.
    func finish(_ stored: inout StoredThread, index: Int, status: TurnStatus, error: String?) -> [StoreOperation] {
        let id = stored.record.id
        let now = nowMillis()
        stored.turns[index].status = status
        stored.turns[index].error = error
        stored.turns[index].completedAt = now
        stored.turns[index].pausedAfterTools = false
        _ = Self.abandonPendingRequests(&stored.turns[index], reason: "the turn ended before a client answered (\(status.rawValue))")
        var operations: [StoreOperation] = []
        if status == .interrupted {
            let marker = Self.interruptionMarker(runtime: stored.record.runtime)
            operations.append(.appendHistory(id, firstSequence: stored.history.count, items: [marker]))
            stored.history.append(marker)
        }
        operations.append(.putTurn(stored.turns[index]))
        stored.record.updatedAt = now
        if stored.record.agentStatus != nil {
            let lastMessage = stored.turns[index].items.last { $0.type == .agentMessage }?.text
            switch status {
            case .completed:
                stored.record.agentStatus = .completed
                stored.record.agentFinalMessage = lastMessage
            case .failed:
                stored.record.agentStatus = .errored
                stored.record.agentFinalMessage = error
            case .interrupted:
                stored.record.agentStatus = .interrupted
                stored.record.agentFinalMessage = nil
            case .inProgress:
                break
            }
            if let parentID = stored.record.parentID, stored.record.source == .threadSpawn {
                operations.append(.enqueueMailbox(recipient: parentID, item: Self.report(of: stored.record, lastMessage: lastMessage)))
            }
        }
        return operations
    }

    /// After a turn's end is committed: wake waiters, hand the parent its
    /// report, let an idle thread unload.
    func afterFinish(_ owner: ThreadOwner) {
        let record = owner.current.record
        changes.changed(owner.id)
        if let parentID = record.parentID, record.source == .threadSpawn { scheduleMailboxDelivery(parentID) }
        if !record.queue.isEmpty { startQueuedTurn(owner.id) }
        scheduleUnloadIfIdle(owner)
    }

    /// A turn's end as notifications (committed with it).
    func finishEvents(_ owner: ThreadOwner, _ turn: TurnRecord) -> [Delivery] {
        let recipients = owner.subscribers
        return [
            Delivery(event: .turnCompleted(owner.id, turn), recipients: recipients),
            Delivery(event: .statusChanged(owner.id, .idle), recipients: recipients),
        ]
    }

    /// V1: a user-role <subagent_notification> message; V2: a mailbox item.
    static func report(of child: ThreadRecord, lastMessage: String?) -> ContextItem {
        let status = child.agentClosed ? "shutdown" : (child.agentStatus ?? .pendingInit).toolName
        if child.runtime == .v2 {
            let payload = jsonText(["from": child.taskName ?? child.id, "status": status, "message": lastMessage ?? ""])
            return ContextItem(role: .user, kind: .mailbox, text: payload)
        }
        let payload = jsonText(["agent_id": child.id, "status": status])
        return ContextItem(role: .user, kind: .subagentNotification, text: "<subagent_notification>\(payload)</subagent_notification>")
    }
}
