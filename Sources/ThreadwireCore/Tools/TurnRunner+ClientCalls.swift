import Foundation

/// Calls from the server to a client inside a turn (client tools, approvals,
/// user input) and MCP tool calls: offered to the thread's eligible
/// connections, waited for with no gate held, and stored with the turn so a
/// turn that only waits for a client survives a restart and goes on with
/// the answer.
extension TurnRunner {
    enum ClientCallStart {
        /// The turn ended meanwhile.
        case notRunning
        /// Settled without a client (the arguments did not fit the schema).
        case settled
        /// Stored and offered; the turn now waits for it.
        case waiting
        /// Started with nothing to wait for: the server runs it (an MCP tool).
        case runHere(itemID: String)
    }

    /// How a settled answer leaves the turn.
    enum Settled {
        /// The call's item is complete; the turn goes on.
        case done(deferred: [ModelOutput], tools: [ToolSpec], runtime: MultiAgentRuntime?)
        /// Another request now waits (an approved client tool's call).
        case waiting
        /// Approved, and the server runs it (an MCP tool).
        case runHere(HostedTool, itemID: String, arguments: String, callID: String)
        /// The turn no longer runs (cancelled, interrupted, or gone).
        case stopped
    }

    /// The tools the model's call may be of that a client (or the user) serves.
    func externalTool(_ output: ModelOutput, offered: [ToolSpec]) -> ExternalTool? {
        guard case let .toolCall(name, _, _) = output,
              let spec = offered.first(where: { $0.name == name && $0.namespace.isEmpty }) else { return nil }
        if name == UserInputTool.name { return .userInput }
        if name.hasPrefix(HostedTool.prefix) {
            guard let hosted = HostedTool(offered: spec) else { return nil }
            return .mcp(hosted)
        }
        return .client(spec)
    }

    /// Whether a call of `tool` by `record`'s thread waits for an approval:
    /// its policy asks for it and no client approved the tool for the tree.
    func approvalNeeded(_ record: ThreadRecord, _ tool: ExternalTool) async -> Bool {
        switch record.approvalPolicy {
        case .never: return false
        case .onRequest: guard tool.requiresApproval else { return false }
        case .always: guard tool.source != .builtin else { return false }
        }
        var root: ThreadRecord? = record
        if record.sessionID != record.id {
            root = await engine.record(of: record.sessionID)
        }
        return !(root?.treeApprovals.contains(tool.spec.name) ?? false)
    }

    func makeRequest(_ owner: ThreadOwner, turnID: TurnID, _ kind: ServerRequestRecord.Kind) -> ServerRequestRecord {
        let now = nowMillis()
        let record = owner.current.record
        return ServerRequestRecord(threadID: owner.id, turnID: turnID, kind: kind, createdAt: now,
                                   deadlineAt: now + Millis(owner.config.clientRequestTimeoutMs),
                                   rootID: record.sessionID, taskPath: record.taskName)
    }

    /// Ready for answers before anyone is offered the request.
    func expect(_ request: ServerRequestRecord) {
        pendingAnswers.register(request)
        treeRequests.add(request)
    }

    /// A request that was never stored: no answer is taken for it.
    func forget(_ request: ServerRequestRecord) {
        pendingAnswers.withdraw(request.id)
        treeRequests.remove(request)
    }

    /// With no gate held: starts the model's call of `tool`, storing the
    /// request the turn now waits for (an approval first when the policy
    /// asks for one) together with the outputs of the same model response
    /// that follow it (`deferred`).
    func startClientCall(
        _ owner: ThreadOwner, turnID: TurnID, tool: ExternalTool, arguments: String, callID: String,
        deferred: ArraySlice<ModelOutput>, usage: TokenUsage?
    ) async -> ClientCallStart {
        await owner.locked {
            _ = owner.messageStream?.close()
            owner.messageStream = nil
            guard let state = owner.state, let at = state.activeTurnIndex, state.turns[at].id == turnID else { return .notRunning }
            var next = state
            if let usage, !next.turns[at].modelRequests.isEmpty {
                next.turns[at].modelRequests[next.turns[at].modelRequests.count - 1].usage = usage
            }
            let spec = tool.spec
            var item = ItemRecord(type: .toolCall)
            item.toolName = spec.name
            item.toolArguments = arguments
            item.toolSource = tool.source
            if case let .mcp(hosted) = tool { item.toolServer = hosted.server }
            let call = ContextItem(role: .assistant, kind: .toolCall, text: arguments, toolName: spec.name, callID: callID)
            let first = next.history.count
            var deliveries: [Delivery] = []
            var request: ServerRequestRecord?
            if let fault = ClientToolRules.argumentFault(arguments, tool: spec) {
                // The model reads what was wrong; no client is asked.
                let output = jsonText(["error": fault])
                item.toolOutput = output
                item.status = .failed
                item.durationMs = 0
                next.history += [call, ContextItem(role: .tool, kind: .toolOutput, text: output, toolName: spec.name, callID: callID)]
                next.turns[at].items.append(item)
                deliveries += owner.itemEvents(turnID: turnID, item)
            } else {
                item.status = .inProgress
                let kind: ServerRequestRecord.Kind
                if await approvalNeeded(state.record, tool) {
                    kind = .approval(itemID: item.id, tool: spec.name, arguments: arguments, callID: callID, source: tool.source,
                                     server: item.toolServer)
                } else if let first = tool.firstRequest(itemID: item.id, arguments: arguments, callID: callID) {
                    kind = first
                } else {
                    // The server runs it now: nothing to wait for, nothing stored but the call.
                    next.history.append(call)
                    next.turns[at].items.append(item)
                    let started: [Delivery]
                    do {
                        started = try await install(owner, next, [.appendHistory(owner.id, firstSequence: first, items: [call]), .putTurn(next.turns[at])],
                                                    events: [Delivery(event: .itemStarted(owner.id, turnID, item), recipients: owner.subscribers)])
                    } catch {
                        await failTurn(owner, turnID: turnID, error: "\(error)", reason: .internalError)
                        return .notRunning
                    }
                    owner.publisher.ticket(started).publish()
                    return .runHere(itemID: item.id)
                }
                let pending = makeRequest(owner, turnID: turnID, kind)
                request = pending
                // Before the recipients are read: a root's subscriber that comes
                // meanwhile is either one of them or finds it in `treeRequests`.
                expect(pending)
                next.history.append(call)
                next.turns[at].items.append(item)
                next.turns[at].pendingRequests = [pending]
                next.turns[at].deferredOutputs = deferred.map(\.contextItem)
                deliveries += [
                    Delivery(event: .itemStarted(owner.id, turnID, item), recipients: owner.subscribers),
                    Delivery(event: .statusChanged(owner.id, .active(turnID, waitingOn: kind.waitingReason)), recipients: owner.subscribers),
                    Delivery(event: .serverRequest(pending), recipients: engine.requestRecipients(owner)),
                ]
            }
            do {
                deliveries = try await install(owner, next, [.appendHistory(owner.id, firstSequence: first, items: Array(next.history[first...])),
                                                              .putTurn(next.turns[at])], events: deliveries)
            } catch {
                if let request { forget(request) }
                await failTurn(owner, turnID: turnID, error: "\(error)", reason: .internalError)
                return .notRunning
            }
            owner.publisher.ticket(deliveries).publish()
            return request == nil ? .settled : .waiting
        }
    }

    /// Waits (no gate held) for the answers the turn's pending requests get,
    /// or their deadlines, until the call's item is complete. Returns the
    /// outputs of the model response still to apply and the tools that
    /// response was offered; nil when the turn is no longer running
    /// (interrupted, cancelled, or the process is stopping, which leaves the
    /// request stored for the next one).
    func finishClientCall(_ owner: ThreadOwner, turnID: TurnID) async -> (deferred: [ModelOutput], tools: [ToolSpec], runtime: MultiAgentRuntime?)? {
        while true {
            guard let snapshot = engine.snapshot(owner.id), let at = snapshot.activeTurnIndex, snapshot.turns[at].id == turnID,
                  let request = snapshot.turns[at].pendingRequests.first else { return nil }
            expect(request)
            let left = max(0, request.deadlineAt - nowMillis())
            let answer = await pendingAnswers.wait(request.id, until: .now + .milliseconds(left))
            if Task.isCancelled { return nil }
            if case .approval(.approveForTree, _)? = answer, case let .approval(_, tool, _, _, _, _) = request.kind {
                // Before the call runs: a crash after it never asks the tree again for what a client allowed.
                await engine.grantForTree(root: request.rootID, tool: tool)
            }
            var settled = await settle(owner, turnID: turnID, request, answer)
            if case let .runHere(hosted, itemID, arguments, callID) = settled {
                settled = await runHosted(owner, turnID: turnID, hosted, itemID: itemID, arguments: arguments, callID: callID)
            }
            switch settled {
            case let .done(deferred, tools, runtime): return (deferred, tools, runtime)
            case .waiting: continue
            case .stopped, .runHere: return nil
            }
        }
    }

    /// With the gate taken here: records `answer` (nil: the deadline passed)
    /// of the turn's pending `request`.
    func settle(_ owner: ThreadOwner, turnID: TurnID, _ request: ServerRequestRecord, _ answer: ServerRequestAnswer?) async -> Settled {
        await owner.gate.lock()
        defer { owner.gate.unlock() }
        treeRequests.remove(request)
        guard let state = owner.state, let at = state.activeTurnIndex, state.turns[at].id == turnID,
              state.turns[at].pendingRequests.first?.id == request.id,
              let index = state.turns[at].items.firstIndex(where: { $0.id == request.kind.itemID }) else { return .stopped }
        var next = state
        let resolved = Delivery(event: .serverRequestResolved(owner.id, requestID: request.id, answer == nil ? .timedOut : .answered),
                                recipients: engine.resolutionRecipients(owner))

        // An approved call goes on to whoever runs it.
        if case let .approval(itemID, tool, arguments, callID, source, _) = request.kind, source == .client,
           case let .approval(decision, _)? = answer, decision == .approve || decision == .approveForTree {
            let call = makeRequest(owner, turnID: turnID, .toolCall(itemID: itemID, tool: tool, arguments: arguments, callID: callID))
            next.turns[at].pendingRequests = [call]
            // The item's duration counts the wait for the approval too.
            next.turns[at].items[index].durationMs = UInt64(max(0, call.createdAt - request.createdAt))
            expect(call)
            let deliveries: [Delivery]
            do {
                deliveries = try await install(owner, next, [.putTurn(next.turns[at])], events: [
                    resolved,
                    Delivery(event: .statusChanged(owner.id, .active(turnID, waitingOn: .clientTool)), recipients: owner.subscribers),
                    Delivery(event: .serverRequest(call), recipients: engine.requestRecipients(owner)),
                ])
            } catch {
                forget(call)
                await failTurn(owner, turnID: turnID, error: "\(error)", reason: .internalError)
                return .stopped
            }
            owner.publisher.ticket(deliveries).publish()
            return .waiting
        }

        if case let .approval(itemID, tool, arguments, callID, .mcp, _) = request.kind,
           case let .approval(decision, _)? = answer, decision == .approve || decision == .approveForTree {
            // The server runs it: nothing is stored as pending while it does.
            next.turns[at].pendingRequests = []
            next.turns[at].items[index].durationMs = UInt64(max(0, nowMillis() - request.createdAt))
            let deliveries: [Delivery]
            do {
                deliveries = try await install(owner, next, [.putTurn(next.turns[at])], events: [
                    resolved, Delivery(event: .statusChanged(owner.id, .active(turnID)), recipients: owner.subscribers),
                ])
            } catch {
                await failTurn(owner, turnID: turnID, error: "\(error)", reason: .internalError)
                return .stopped
            }
            owner.publisher.ticket(deliveries).publish()
            guard let hosted = toolServers?.resolve(tool, principal: next.record.principal) else {
                let output = jsonText(["error": "\(tool) did not run: its MCP server is no longer configured"])
                return await completeLocked(owner, turnID: turnID, itemID: itemID, tool: tool, callID: callID, output: output, status: .failed,
                                            since: nowMillis())
            }
            return .runHere(hosted, itemID: itemID, arguments: arguments, callID: callID)
        }

        let (output, status) = Self.outcome(of: request, answer, waited: max(0, request.deadlineAt - request.createdAt))
        let (tool, callID) = request.kind.toolAndCall
        var cancelled = false
        if case .approval(.cancel, _)? = answer { cancelled = true }
        return await completeLocked(owner, turnID: turnID, itemID: request.kind.itemID, tool: tool, callID: callID, output: output,
                                    status: status, since: request.createdAt, also: [resolved], thenInterrupt: cancelled)
    }

    /// Runs MCP tool call `itemID` (no gate held while the server works),
    /// then records its output.
    func runHosted(_ owner: ThreadOwner, turnID: TurnID, _ hosted: HostedTool, itemID: String, arguments: String, callID: String) async -> Settled {
        let started = nowMillis()
        // A thread's principal never changes; a thread running a turn is published.
        let result: HostedToolOutput
        if let toolServers, let principal = engine.snapshot(owner.id)?.record.principal {
            result = await toolServers.call(hosted, arguments: arguments, principal: principal)
        } else {
            result = HostedToolOutput(text: jsonText(["error": "no MCP server is configured"]), isError: true)
        }
        if Task.isCancelled { return .stopped }
        await owner.gate.lock()
        defer { owner.gate.unlock() }
        return await completeLocked(owner, turnID: turnID, itemID: itemID, tool: hosted.spec.name, callID: callID,
                                    output: result.text, status: result.isError ? .failed : .completed, since: started)
    }

    /// With the gate held: completes a call's item with `output` (what the
    /// turn waited for is settled), publishing `also` after item/completed.
    /// With `thenInterrupt` the turn ends there (a cancelled approval: the
    /// model never reads the refusal).
    func completeLocked(
        _ owner: ThreadOwner, turnID: TurnID, itemID: String, tool: String, callID: String, output: String, status: ItemStatus,
        since: Millis, also: [Delivery] = [], thenInterrupt: Bool = false
    ) async -> Settled {
        guard let state = owner.state, let at = state.activeTurnIndex, state.turns[at].id == turnID,
              let index = state.turns[at].items.firstIndex(where: { $0.id == itemID }) else { return .stopped }
        var next = state
        let wasWaiting = !next.turns[at].pendingRequests.isEmpty
        next.turns[at].items[index].toolOutput = output
        next.turns[at].items[index].status = status
        next.turns[at].items[index].durationMs = (next.turns[at].items[index].durationMs ?? 0) + UInt64(max(0, nowMillis() - since))
        let first = next.history.count
        next.history.append(ContextItem(role: .tool, kind: .toolOutput, text: output, toolName: tool, callID: callID))
        let deferred = next.turns[at].deferredOutputs
        next.turns[at].pendingRequests = []
        next.turns[at].deferredOutputs = []
        var deliveries = [Delivery(event: .itemCompleted(owner.id, turnID, next.turns[at].items[index]), recipients: owner.subscribers)] + also
        if wasWaiting && !thenInterrupt {
            deliveries.append(Delivery(event: .statusChanged(owner.id, .active(turnID)), recipients: owner.subscribers))
        }
        do {
            deliveries = try await install(owner, next, [.appendHistory(owner.id, firstSequence: first, items: [next.history[first]]),
                                                         .putTurn(next.turns[at])], events: deliveries)
        } catch {
            await failTurn(owner, turnID: turnID, error: "\(error)", reason: .internalError)
            return .stopped
        }
        if thenInterrupt {
            let ended = try? await engine.endActiveTurn(owner, status: .interrupted, error: "cancelled: a client refused to run \(tool) and cancelled the turn", reason: nil)
            owner.publisher.ticket(deliveries).publish()
            ended?.publish()
            return .stopped
        }
        owner.publisher.ticket(deliveries).publish()
        return .done(deferred: deferred.compactMap(\.modelOutput), tools: next.turns[at].modelRequests.last?.tools ?? [],
                     runtime: next.record.runtime)
    }

    /// What the model reads, and the item's status, for `request`'s answer.
    static func outcome(of request: ServerRequestRecord, _ answer: ServerRequestAnswer?, waited: Millis) -> (String, ItemStatus) {
        switch (request.kind, answer) {
        case let (.toolCall(_, tool, _, _), nil):
            return (jsonText(["error": "the client tool \(tool) timed out: no client answered within \(waited) ms"]), .timedOut)
        case (.userInput, nil):
            return (jsonText(["error": "the user did not answer within \(waited) ms"]), .timedOut)
        case let (.approval(_, tool, _, _, _, _), nil):
            return (jsonText(["error": "\(tool) did not run: no client approved it within \(waited) ms"]), .timedOut)
        case let (_, .toolOutput(text, isError)?):
            return (text, isError ? .failed : .completed)
        case let (_, .userInput(text)?):
            return (jsonText(["answer": text]), .completed)
        case let (.approval(_, tool, _, _, _, _), .approval(decision, reason)?):
            let why = reason.isEmpty ? "" : ": \(reason)"
            let verb = decision == .cancel ? "cancelled the turn instead of running" : "declined to run"
            return (jsonText(["error": "the user \(verb) \(tool)\(why)"]), .declined)
        case let (.approval(_, tool, _, _, _, _), .failed(code, message)?):
            return (jsonText(["error": "\(tool) did not run: the client could not ask for an approval (status \(code)): \(message)"]), .declined)
        case let (.userInput, .failed(code, message)?):
            return (jsonText(["error": "the client could not ask the user (status \(code)): \(message)"]), .failed)
        case let (.toolCall(_, tool, _, _), .failed(code, message)?):
            return (jsonText(["error": "the client could not run \(tool) (status \(code)): \(message)"]), .failed)
        case (_, .approval?):
            // `PendingAnswers` takes only answers that fit the request.
            return (jsonText(["error": "an approval answered a request that was not one"]), .failed)
        }
    }
}
