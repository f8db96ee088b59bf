import Foundation
import Synchronization

extension ThreadEngine {
    /// Starts a turn, with the owner's gate held: applies sticky overrides,
    /// resolves the runtime if this is the first turn, appends the context the
    /// turn adds, and commits it all in one transaction. Then the runner
    /// starts; its notifications queue behind this command's publication.
    func beginTurn(_ owner: ThreadOwner, _ request: TurnRequest) async throws -> (TurnRecord, Publication) {
        let current = owner.current
        let id = owner.id
        try checkCanStartTurn(owner)
        let texts = request.input.filter { !$0.isEmpty }
        guard !texts.isEmpty else { throw DomainError.invalidArgument("input must contain at least one non-empty text") }

        var next = current
        if let model = try nonEmpty(request.model, field: "model") { next.record.model = model }
        next.record.selectedMode = request.mode.applied(to: next.record.selectedMode)
        if let policy = request.approvalPolicy { next.record.approvalPolicy = policy }
        next.record.reasoning = try next.record.reasoning.updated(effort: request.reasoningEffort, summary: request.reasoningSummary,
                                                                  model: next.record.model, catalog: settings.catalog)
        let settingsChanged = next.record.model != current.record.model || next.record.selectedMode != current.record.selectedMode
            || next.record.approvalPolicy != current.record.approvalPolicy || next.record.reasoning != current.record.reasoning
        if let dequeue = request.dequeue { next.record.queue.removeAll { $0.id == dequeue } }

        // Set once, at the first turn: the catalog selector of this turn's model, else flags.
        let runtime = next.record.runtime ?? RuntimeResolver.resolveAtFirstTurn(
            catalogSelector: settings.catalog.selector(forModel: next.record.model), flags: owner.config.flags)
        next.record.runtime = runtime

        let effective = ModeRules.effective(
            selected: next.record.selectedMode, runtime: runtime, usageHintEnabled: owner.config.usageHintEnabled,
            source: next.record.source, gateEnabled: owner.config.flags.multiAgentMode)
        // The baseline is what the model's context last carried: the newest
        // turn still in it (a rolled-back turn's fragment left with it).
        let baseline: ModeRules.Baseline = current.turns.last { !$0.rolledBack }.map { .previous($0.context.effectiveMode) } ?? .noPreviousTurn
        var added = TurnRunner(engine: self).openingContext(next.record, runtime: runtime, effective: effective, baseline: baseline, config: owner.config)
        let text = texts.joined(separator: "\n")
        added.append(ContextItem(role: .user, kind: .userInput, text: text))

        let now = nowMillis()
        if next.record.preview.isEmpty { next.record.preview = String(text.prefix(120)) }
        next.record.updatedAt = now
        if next.record.agentStatus != nil {
            next.record.agentStatus = .running
            next.record.agentFinalMessage = nil
        }
        let userItem = ItemRecord(type: .userMessage, text: text)
        var turn = TurnRecord(
            id: newID(), threadID: id, sequence: current.turns.count, startedAt: now, items: [userItem],
            context: TurnContext(model: next.record.model, runtime: runtime, effectiveMode: effective, cwd: next.record.cwd))
        let firstSequence = next.history.count
        turn.historyStart = firstSequence
        next.history += added
        next.turns.append(turn)
        // Held until the publish counts the turn as running.
        try await storedBytes.check(next.record.principal, limit: principalLimits.current.storedBytes, store: store, tasks: tasks)
        let slot = try directory.runningTurns.reserve(next.record.principal, limit: principalLimits.current.runningTurns)
        defer { directory.runningTurns.release(next.record.principal, slot) }
        let recipients = owner.subscribers
        var deliveries: [Delivery] = []
        if settingsChanged {
            deliveries.append(Delivery(event: .settingsUpdated(id, ThreadSettingsView(record: next.record)), recipients: recipients))
        }
        if request.dequeue != nil {
            deliveries.append(Delivery(event: .queueUpdated(id, next.record.queue), recipients: recipients))
        }
        deliveries += [
            Delivery(event: .turnStarted(id, turn), recipients: recipients),
            Delivery(event: .statusChanged(id, .active(turn.id)), recipients: recipients),
            Delivery(event: .itemStarted(id, turn.id, userItem), recipients: recipients),
            Delivery(event: .itemCompleted(id, turn.id, userItem), recipients: recipients),
        ]
        try await withSharedTurnSlot(on: id, of: next.record.principal) {
            deliveries = try await install(owner, next, [
                .putThread(next.record.bumped()), .appendHistory(id, firstSequence: firstSequence, items: added), .putTurn(turn),
            ], events: deliveries)
        }
        owner.cancelUnload()
        changes.changed(id)
        let publication = owner.publisher.ticket(deliveries)
        let turnID = turn.id
        let threadID = owner.id
        owner.runner = tasks.spawn { [self] in
            // The turn's model and tool calls are this span's children (a
            // child of the request that started the turn).
            await ThreadTracing.span("turn", attributes: [
                "threadwire.thread.id": .string(threadID), "threadwire.turn.id": .string(turnID),
            ]) { span in
                await TurnRunner(engine: self).runTurn(owner, turnID: turnID)
            }
        }
        return (turn, publication)
    }

    /// turn/continue: a turn paused after a batch of tool calls makes its next
    /// model request (with the input steered into it meanwhile). The pause's
    /// end is committed before the runner starts, so of two clients
    /// continuing at once exactly one does.
    public func continueTurn(_ id: ThreadID, turnID: TurnID) async throws -> Outcome<Void> {
        try await withOwner(id) { owner in
            defer { scheduleUnloadIfIdle(owner) }
            let current = owner.current
            guard let index = current.activeTurnIndex else {
                if let turn = current.turns.first(where: { $0.id == turnID }) {
                    throw DomainError.failedPrecondition("turn \(turnID) has ended (\(turn.status.rawValue)); thread \(id) has no paused turn")
                }
                throw DomainError.failedPrecondition("thread \(id) has no active turn (turn \(turnID) is not one of its turns)")
            }
            guard current.turns[index].id == turnID else {
                throw DomainError.failedPrecondition(
                    "turn \(turnID) is not the active turn of thread \(id) (active: \(current.turns[index].id))")
            }
            guard current.turns[index].pausedAfterTools else {
                throw DomainError.failedPrecondition("turn \(turnID) is not paused after tools: it is running, or was continued already")
            }
            if stopping.load(ordering: .acquiring) {
                throw DomainError.unavailable("the server is shutting down; continue the turn after it restarts")
            }
            var next = current
            next.turns[index].pausedAfterTools = false
            let deliveries = try await install(owner, next, [.putTurn(next.turns[index])], events: [
                Delivery(event: .statusChanged(id, .active(turnID)), recipients: owner.subscribers)])
            owner.cancelUnload()
            owner.runner = tasks.spawn { [self] in
                await ThreadTracing.span("turn", attributes: [
                    "threadwire.thread.id": .string(id), "threadwire.turn.id": .string(turnID),
                ]) { span in
                    await TurnRunner(engine: self).runTurn(owner, turnID: turnID)
                }
            }
            return Outcome((), publications: [owner.publisher.ticket(deliveries)])
        }
    }
}
