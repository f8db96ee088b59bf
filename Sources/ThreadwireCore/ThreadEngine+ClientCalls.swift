import Foundation

/// Calls from the server to a client inside a turn (client tools): offered
/// to the thread's eligible connections, waited for with no gate held, and
/// stored with the turn so a turn that only waits for a client survives a
/// restart and goes on with the answer.
extension ThreadEngine {
    enum ClientCallStart {
        /// The turn ended meanwhile.
        case notRunning
        /// Settled without a client (the arguments did not fit the schema).
        case settled
        /// Stored and offered; the turn now waits for it.
        case waiting
    }

    /// Client tools are offered with the empty namespace, so the model's call
    /// of one is told apart from a built-in tool's by the offered spec.
    static func clientTool(_ output: ModelOutput, offered: [ToolSpec]) -> ToolSpec? {
        guard case let .toolCall(name, _, _) = output else { return nil }
        return offered.first { $0.name == name && $0.namespace.isEmpty }
    }

    /// With no gate held: starts the model's call of client tool `spec`,
    /// storing it as the turn's pending request together with the outputs of
    /// the same model response that follow it (`deferred`).
    func startClientCall(
        _ owner: ThreadOwner, turnID: TurnID, spec: ToolSpec, arguments: String, callID: String,
        deferred: ArraySlice<ModelOutput>, usage: TokenUsage?
    ) async -> ClientCallStart {
        await locked(owner) {
            _ = owner.messageStream?.close()
            owner.messageStream = nil
            guard let state = owner.state, let at = state.activeTurnIndex, state.turns[at].id == turnID else { return .notRunning }
            var next = state
            if let usage, !next.turns[at].modelRequests.isEmpty {
                next.turns[at].modelRequests[next.turns[at].modelRequests.count - 1].usage = usage
            }
            var item = ItemRecord(type: .toolCall)
            item.toolName = spec.name
            item.toolArguments = arguments
            item.toolSource = .client
            let call = ContextItem(role: .assistant, kind: .toolCall, text: arguments, toolName: spec.name, callID: callID)
            let first = next.history.count
            var deliveries: [Delivery] = []
            let outcome: ClientCallStart
            if let fault = ClientToolRules.argumentFault(arguments, tool: spec) {
                // The model reads what was wrong; no client is asked.
                let output = jsonText(["error": fault])
                item.toolOutput = output
                item.status = .failed
                item.durationMs = 0
                next.history += [call, ContextItem(role: .tool, kind: .toolOutput, text: output, toolName: spec.name, callID: callID)]
                next.turns[at].items.append(item)
                deliveries += itemEvents(owner, turnID: turnID, item)
                outcome = .settled
            } else {
                item.status = .inProgress
                let now = nowMillis()
                let request = ServerRequestRecord(
                    threadID: owner.id, turnID: turnID,
                    kind: .toolCall(itemID: item.id, tool: spec.name, arguments: arguments, callID: callID),
                    createdAt: now, deadlineAt: now + Millis(owner.config.clientRequestTimeoutMs))
                next.history.append(call)
                next.turns[at].items.append(item)
                next.turns[at].pendingRequests = [request]
                next.turns[at].deferredOutputs = deferred.map(\.contextItem)
                let recipients = owner.subscribers
                deliveries += [
                    Delivery(event: .itemStarted(owner.id, turnID, item), recipients: recipients),
                    Delivery(event: .statusChanged(owner.id, .active(turnID, waitingOn: .clientTool)), recipients: recipients),
                    Delivery(event: .serverRequest(request), recipients: recipients),
                ]
                outcome = .waiting
            }
            do {
                try await install(owner, next, [.appendHistory(owner.id, firstSequence: first, items: Array(next.history[first...])),
                                                .putTurn(next.turns[at])])
            } catch {
                await failTurn(owner, turnID: turnID, error: "\(error)", reason: .internalError)
                return .notRunning
            }
            if case .waiting = outcome, let request = next.turns[at].pendingRequests.first {
                // Registered before it is offered: an answer never finds nobody ready for it.
                pendingAnswers.register(request.id)
            }
            owner.publisher.ticket(deliveries).publish()
            return outcome
        }
    }

    /// Waits (no gate held) for the answer of the turn's pending request, or
    /// its deadline, then records the output. Returns the outputs of the
    /// model response still to apply and the tools that response was offered;
    /// nil when the turn is no longer running (interrupted, or the process
    /// is stopping, which leaves the request stored for the next one).
    func finishClientCall(_ owner: ThreadOwner, turnID: TurnID) async -> (deferred: [ModelOutput], tools: [ToolSpec], runtime: MultiAgentRuntime?)? {
        guard let snapshot = directory.snapshot(owner.id), let at = snapshot.activeTurnIndex, snapshot.turns[at].id == turnID,
              let request = snapshot.turns[at].pendingRequests.first else { return nil }
        pendingAnswers.register(request.id)
        let left = max(0, request.deadlineAt - nowMillis())
        let answer = await pendingAnswers.wait(request.id, until: .now + .milliseconds(left))
        if Task.isCancelled { return nil }
        return await locked(owner) {
            guard let state = owner.state, let at = state.activeTurnIndex, state.turns[at].id == turnID,
                  state.turns[at].pendingRequests.first?.id == request.id,
                  case let .toolCall(itemID, tool, _, callID) = request.kind else { return nil }
            var next = state
            let output: String
            let status: ItemStatus
            let outcome: ServerRequestOutcome
            switch answer {
            case nil:
                let waited = max(0, request.deadlineAt - request.createdAt)
                output = jsonText(["error": "the client tool \(tool) timed out: no client answered within \(waited) ms"])
                status = .timedOut
                outcome = .timedOut
            case let .toolOutput(text, isError)?:
                output = text
                status = isError ? .failed : .completed
                outcome = .answered
            case let .failed(code, message)?:
                output = jsonText(["error": "the client could not run \(tool) (status \(code)): \(message)"])
                status = .failed
                outcome = .answered
            }
            var completed: ItemRecord?
            if let index = next.turns[at].items.firstIndex(where: { $0.id == itemID }) {
                next.turns[at].items[index].toolOutput = output
                next.turns[at].items[index].status = status
                next.turns[at].items[index].durationMs = UInt64(max(0, nowMillis() - request.createdAt))
                completed = next.turns[at].items[index]
            }
            let first = next.history.count
            next.history.append(ContextItem(role: .tool, kind: .toolOutput, text: output, toolName: tool, callID: callID))
            let deferred = next.turns[at].deferredOutputs
            next.turns[at].pendingRequests = []
            next.turns[at].deferredOutputs = []
            do {
                try await install(owner, next, [.appendHistory(owner.id, firstSequence: first, items: [next.history[first]]),
                                                .putTurn(next.turns[at])])
            } catch {
                await failTurn(owner, turnID: turnID, error: "\(error)", reason: .internalError)
                return nil
            }
            let recipients = owner.subscribers
            var deliveries: [Delivery] = []
            if let completed { deliveries.append(Delivery(event: .itemCompleted(owner.id, turnID, completed), recipients: recipients)) }
            deliveries += [
                Delivery(event: .serverRequestResolved(owner.id, requestID: request.id, outcome), recipients: recipients),
                Delivery(event: .statusChanged(owner.id, .active(turnID)), recipients: recipients),
            ]
            owner.publisher.ticket(deliveries).publish()
            return (deferred.compactMap(\.modelOutput), next.turns[at].modelRequests.last?.tools ?? [], next.record.runtime)
        }
    }

    /// A client's answer to request `requestID` of thread `threadID`. The
    /// first answer counts; the turn records it (and the answering
    /// connection hears server_request/resolved) once it is committed.
    public func answerServerRequest(threadID: ThreadID, requestID: String, _ answer: ServerRequestAnswer) throws(AnswerRefusal) {
        guard pendingAnswers.resolve(requestID, answer) else {
            throw AnswerRefusal(nil, "request \(requestID) is no longer pending (answered, timed out or withdrawn); this answer changed nothing")
        }
    }

    /// The requests a thread's active turn waits for (offered again to a
    /// connection that subscribes).
    func pendingRequests(_ stored: StoredThread) -> [ServerRequestRecord] {
        stored.activeTurnIndex.map { stored.turns[$0].pendingRequests } ?? []
    }

    /// Ends turn `index`'s pending requests (the turn ends without their
    /// answers): their items fail, nothing waits any more. Returns them.
    static func abandonPendingRequests(_ turn: inout TurnRecord, reason: String) -> [ServerRequestRecord] {
        let abandoned = turn.pendingRequests
        for request in abandoned {
            guard case let .toolCall(itemID, _, _, _) = request.kind,
                  let index = turn.items.firstIndex(where: { $0.id == itemID }) else { continue }
            turn.items[index].status = .failed
            turn.items[index].toolOutput = jsonText(["error": reason])
        }
        turn.pendingRequests = []
        turn.deferredOutputs = []
        return abandoned
    }

    /// thread/tools/update: the thread's client tools for its next model calls.
    public func updateClientTools(_ id: ThreadID, _ tools: [ToolSpec]) async throws -> [ToolSpec] {
        let validated = try ClientToolRules.validated(tools)
        return try await withOwner(id) { owner in
            defer { scheduleUnloadIfIdle(owner) }
            guard owner.current.record.clientTools != validated else { return validated }
            var next = owner.current
            next.record.clientTools = validated
            next.record.updatedAt = nowMillis()
            try await install(owner, next, [.putThread(next.record.bumped())])
            return validated
        }
    }
}

extension ModelOutput {
    /// How an output waits in a stored turn (`deferredOutputs`).
    var contextItem: ContextItem {
        switch self {
        case let .message(text): return ContextItem(role: .assistant, kind: .assistantMessage, text: text)
        case let .toolCall(name, arguments, callID):
            return ContextItem(role: .assistant, kind: .toolCall, text: arguments, toolName: name, callID: callID)
        }
    }
}

extension ContextItem {
    var modelOutput: ModelOutput? {
        switch kind {
        case .assistantMessage: return .message(text)
        case .toolCall: return .toolCall(name: toolName ?? "", arguments: text, callID: callID ?? "")
        default: return nil
        }
    }
}
