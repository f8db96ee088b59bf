import Foundation

/// What keeps a long thread inside its model's context window, and what lets
/// a client change the context between and during turns: compaction,
/// rollback, steering, and names. History stays append-only throughout (see
/// `ModelContext`): each of these appends, nothing is rewritten.
extension ThreadEngine {
    /// thread/compact/start: a turn that only compacts.
    public func startCompaction(_ id: ThreadID, connection: ConnectionID?) async throws -> Outcome<TurnRecord> {
        try await withOwner(id) { owner in
            if let connection { owner.subscribe(connection) }
            owner.cancelUnload()
            defer { scheduleUnloadIfIdle(owner) }
            let current = owner.current
            try checkCanStartTurn(owner)
            guard !ModelContext.visible(current.history[...]).isEmpty else {
                throw DomainError.failedPrecondition("thread \(id) has no context to compact yet (start a turn first)")
            }
            let runtime = current.record.runtime ?? RuntimeResolver.resolveAtFirstTurn(
                catalogSelector: settings.catalog.selector(forModel: current.record.model), flags: owner.config.flags)
            let effective = ModeRules.effective(
                selected: current.record.selectedMode, runtime: runtime, usageHintEnabled: owner.config.usageHintEnabled,
                source: current.record.source, gateEnabled: owner.config.flags.multiAgentMode)
            var next = current
            next.record.runtime = runtime
            next.record.updatedAt = nowMillis()
            var turn = TurnRecord(
                id: newID(), threadID: id, sequence: current.turns.count, startedAt: next.record.updatedAt, items: [],
                context: TurnContext(model: next.record.model, runtime: runtime, effectiveMode: effective, cwd: next.record.cwd))
            turn.historyStart = next.history.count
            next.turns.append(turn)
            let slot = try directory.runningTurns.reserve(next.record.principal, limit: principalLimits.current.runningTurns)
            defer { directory.runningTurns.release(next.record.principal, slot) }
            let recipients = owner.subscribers
            var deliveries = [
                Delivery(event: .turnStarted(id, turn), recipients: recipients),
                Delivery(event: .statusChanged(id, .active(turn.id)), recipients: recipients),
            ]
            try await withSharedTurnSlot(on: id, of: next.record.principal) {
                deliveries = try await install(owner, next, [.putThread(next.record.bumped()), .putTurn(turn)], events: deliveries)
            }
            changes.changed(id)
            let publication = owner.publisher.ticket(deliveries)
            let turnID = turn.id
            owner.runner = tasks.spawn { [self] in
                guard await TurnRunner(engine: self).compactContext(owner, turnID: turnID) else { return }
                await owner.locked {
                    guard owner.state?.activeTurn?.id == turnID else { return }
                    (try? await endActiveTurn(owner, status: .completed, error: nil))?.publish()
                }
            }
            return Outcome(turn, publications: [publication])
        }
    }

    /// The refusals every turn start shares.
    func checkCanStartTurn(_ owner: ThreadOwner) throws {
        let current = owner.current
        if stopping.load(ordering: .acquiring) {
            throw DomainError.unavailable("the server is shutting down; start the turn again after it restarts")
        }
        if let active = current.activeTurn {
            throw DomainError.failedPrecondition("thread \(owner.id) already has an active turn (\(active.id))")
        }
        if current.record.archived {
            throw DomainError.failedPrecondition("thread \(owner.id) is archived; unarchive it first")
        }
        if current.record.agentClosed {
            throw DomainError.failedPrecondition("agent \(current.record.taskName ?? owner.id) is closed; resume it first")
        }
    }

    // MARK: - Rollback

    /// thread/rollback: the last `numTurns` turns still in the model's
    /// context leave it, by a marker appended to history, and are marked in
    /// the transcript, in one commit.
    public func rollback(_ id: ThreadID, numTurns: Int) async throws -> Outcome<[TurnID]> {
        guard numTurns >= 1 else { throw DomainError.invalidArgument("num_turns must be at least 1") }
        return try await takeBack(id, verb: "rolling back", marker: "thread/rollback: \(numTurns) turn(s)") { turns in
            let live = turns.indices.filter { !turns[$0].rolledBack }
            guard numTurns <= live.count else {
                throw DomainError.invalidArgument(
                    "num_turns \(numTurns) is more than the \(live.count) turn(s) of thread \(id) that are not rolled back")
            }
            return Array(live.suffix(numTurns))
        } event: { .rolledBack(id, $0) }
    }

    /// Where thread/revert starts taking turns back.
    public enum RevertBoundary: Sendable {
        /// This turn and every later one.
        case before(TurnID)
        /// Every turn after this one.
        case after(TurnID)
    }

    /// thread/revert: the turns from a boundary on leave the model's context
    /// as in a rollback (turns already rolled back stay as they are).
    public func revert(_ id: ThreadID, _ boundary: RevertBoundary) async throws -> Outcome<[TurnID]> {
        let (turnID, included) = switch boundary {
        case let .before(turn): (turn, true)
        case let .after(turn): (turn, false)
        }
        return try await takeBack(id, verb: "reverting", marker: "thread/revert: \(included ? "from" : "after") turn \(turnID)") { turns in
            guard let index = turns.firstIndex(where: { $0.id == turnID }) else {
                throw DomainError.notFound("turn \(turnID) is not a turn of thread \(id)")
            }
            guard !turns[index].rolledBack else {
                throw DomainError.failedPrecondition("turn \(turnID) is already rolled back; revert from a turn still in the context")
            }
            let first = included ? index : index + 1
            return (first..<turns.count).filter { !turns[$0].rolledBack }
        } event: { .reverted(id, $0) }
    }

    /// Takes the turns `targets` picks out of the model's context: a marker
    /// appended to history (from the first one's place on) and the turns
    /// marked, in one commit. No targets: nothing changes and nothing is sent.
    private func takeBack(_ id: ThreadID, verb: String, marker text: String,
                          targets pick: @Sendable (ChunkedArray<TurnRecord>) throws -> [Int],
                          event: @Sendable ([TurnID]) -> ThreadEvent) async throws -> Outcome<[TurnID]> {
        try await withOwner(id) { owner in
            defer { scheduleUnloadIfIdle(owner) }
            var next = owner.current
            if let active = next.activeTurn {
                throw DomainError.failedPrecondition(
                    "thread \(id) has a running turn (\(active.id)); interrupt it or let it end before \(verb)")
            }
            let targets = try pick(next.turns)
            guard let firstTarget = targets.first else { return Outcome([]) }
            guard let from = next.turns[firstTarget].historyStart else {
                throw DomainError.failedPrecondition(
                    "turn \(next.turns[firstTarget].id) was stored before rollback existed (its place in the history is unknown); it cannot be rolled back")
            }
            let marker = ContextItem(role: .developer, kind: .rollbackMarker, text: text, rollsBackFrom: from)
            var operations: [StoreOperation] = [.appendHistory(id, firstSequence: next.history.count, items: [marker])]
            next.history.append(marker)
            for index in targets {
                next.turns[index].rolledBack = true
                operations.append(.putTurn(next.turns[index]))
            }
            next.record.updatedAt = nowMillis()
            operations.insert(.putThread(next.record.bumped()), at: 0)
            let turnIDs = targets.map { next.turns[$0].id }
            let deliveries = try await install(owner, next, operations, events: [
                Delivery(event: event(turnIDs), recipients: owner.subscribers)])
            owner.usageTotal = nil
            changes.changed(id)
            return Outcome(turnIDs, publications: [owner.publisher.ticket(deliveries)])
        }
    }

    // MARK: - Steering

    /// turn/steer: the input joins the running turn as a user item now and
    /// reaches the model at its next model request.
    public func steer(_ id: ThreadID, expectedTurnID: TurnID, input: [String]) async throws -> Outcome<(TurnID, ItemRecord)> {
        let texts = input.filter { !$0.isEmpty }
        guard !texts.isEmpty else { throw DomainError.invalidArgument("input must contain at least one non-empty text") }
        return try await withOwner(id) { owner in
            defer { scheduleUnloadIfIdle(owner) }
            try checkAcceptsDirectInput(owner)
            return try await steerLocked(owner, expectedTurnID: expectedTurnID, texts: texts)
        }
    }

    /// A client's input (turn/start, turn/steer) on a V2 child is refused:
    /// its parent drives it.
    func checkAcceptsDirectInput(_ owner: ThreadOwner) throws {
        let record = owner.current.record
        guard record.acceptsDirectInput else {
            throw DomainError.failedPrecondition(
                "thread \(owner.id) is agent \(record.taskName ?? record.nickname ?? owner.id) of a v2 agent tree: its turns come from its parent "
                    + "(followup_task, send_message); give the input to the parent thread \(record.parentID ?? "?") instead")
        }
    }

    /// turn/steer with the gate held (also turn/start with when_busy = steer).
    func steerLocked(_ owner: ThreadOwner, expectedTurnID: TurnID, texts: [String]) async throws -> Outcome<(TurnID, ItemRecord)> {
        let id = owner.id
        do {
            let current = owner.current
            guard let index = current.activeTurnIndex else {
                if let turn = current.turns.first(where: { $0.id == expectedTurnID }) {
                    throw DomainError.failedPrecondition("turn \(expectedTurnID) has ended (\(turn.status.rawValue)); thread \(id) has no running turn")
                }
                throw DomainError.failedPrecondition("thread \(id) has no running turn (turn \(expectedTurnID) is not one of its turns)")
            }
            let active = current.turns[index]
            guard active.id == expectedTurnID else {
                let state = current.turns.first { $0.id == expectedTurnID }.map { "has ended (\($0.status.rawValue))" } ?? "is not a turn of this thread"
                throw DomainError.failedPrecondition("turn \(expectedTurnID) \(state); the running turn is \(active.id)")
            }
            // A compaction turn makes no model request the input could join.
            guard active.items.first?.type == .userMessage else {
                throw DomainError.failedPrecondition("turn \(expectedTurnID) is a compaction (thread/compact/start); steer the next turn instead")
            }
            let text = texts.joined(separator: "\n")
            var next = current
            let item = ItemRecord(type: .userMessage, text: text)
            next.turns[index].items.append(item)
            next.turns[index].pendingInput.append(ContextItem(role: .user, kind: .userInput, text: text))
            let deliveries = try await install(owner, next, [.putTurn(next.turns[index])],
                                               events: owner.itemEvents(turnID: active.id, item))
            return Outcome((active.id, item), publications: [owner.publisher.ticket(deliveries)])
        }
    }

    // MARK: - Names

    /// thread/name/set; an empty name clears it.
    public func setName(_ id: ThreadID, _ name: String) async throws -> Outcome<Void> {
        guard name.count <= 200 else { throw DomainError.invalidArgument("name must be at most 200 characters (got \(name.count))") }
        guard !name.contains(where: { $0.isNewline }) else { throw DomainError.invalidArgument("name must be one line") }
        return try await withOwner(id) { owner in
            defer { scheduleUnloadIfIdle(owner) }
            let value: String? = name.isEmpty ? nil : name
            guard owner.current.record.name != value else { return Outcome(()) }
            var next = owner.current
            next.record.name = value
            next.record.updatedAt = nowMillis()
            let deliveries = try await install(owner, next, [.putThread(next.record.bumped())], events: [
                Delivery(event: .nameUpdated(id, value), recipients: owner.subscribers)])
            changes.changed(id)
            return Outcome((), publications: [owner.publisher.ticket(deliveries)])
        }
    }
}
