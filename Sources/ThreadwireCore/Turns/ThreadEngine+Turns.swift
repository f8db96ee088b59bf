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
        let settingsChanged = next.record.model != current.record.model || next.record.selectedMode != current.record.selectedMode
            || next.record.approvalPolicy != current.record.approvalPolicy

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
        var added = openingContext(next.record, runtime: runtime, effective: effective, baseline: baseline, config: owner.config)
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
        try await storedBytes.check(next.record.principal, limit: settings.principalLimits.storedBytes, store: store, tasks: tasks)
        let slot = try directory.runningTurns.reserve(next.record.principal, limit: settings.principalLimits.runningTurns)
        defer { directory.runningTurns.release(next.record.principal, slot) }
        try await withSharedTurnSlot(on: id, of: next.record.principal) {
            try await install(owner, next, [
                .putThread(next.record.bumped()), .appendHistory(id, firstSequence: firstSequence, items: added), .putTurn(turn),
            ])
        }
        owner.cancelUnload()
        changes.changed(id)

        let recipients = owner.subscribers
        var deliveries: [Delivery] = []
        if settingsChanged {
            deliveries.append(Delivery(event: .settingsUpdated(id, owner.settingsView), recipients: recipients))
        }
        deliveries += [
            Delivery(event: .turnStarted(id, turn), recipients: recipients),
            Delivery(event: .statusChanged(id, .active(turn.id)), recipients: recipients),
            Delivery(event: .itemStarted(id, turn.id, userItem), recipients: recipients),
            Delivery(event: .itemCompleted(id, turn.id, userItem), recipients: recipients),
        ]
        let publication = owner.publisher.ticket(deliveries)
        let turnID = turn.id
        let threadID = owner.id
        owner.runner = tasks.spawn { [self] in
            // The turn's model and tool calls are this span's children (a
            // child of the request that started the turn).
            await ThreadTracing.span("turn", attributes: [
                "threadwire.thread.id": .string(threadID), "threadwire.turn.id": .string(turnID),
            ]) { span in
                await runTurn(owner, turnID: turnID)
            }
        }
        return (turn, publication)
    }

    /// Runs model calls until the model answers without tool calls. The gate
    /// is held for each step's bookkeeping, never while the model or a
    /// wait_agent runs, so the thread's other commands (interrupt, settings,
    /// reads) are never stuck behind a slow model.
    /// With `resuming`, the turn was stored waiting for a client (a restart
    /// came between): it waits for that answer first, then goes on.
    func runTurn(_ owner: ThreadOwner, turnID: TurnID, resuming: Bool = false) async {
        if resuming {
            guard let (deferred, tools, runtime) = await finishClientCall(owner, turnID: turnID),
                  await applyStep(owner, turnID: turnID, deferred[...], tools: tools, runtime: runtime, usage: nil, calledTools: true)
            else { return }
        }
        var justCompacted = false
        while true {
            // 1. Persist the model request before the model sees it, with the
            //    steering input that arrived since the last one.
            enum Prepared { case call(ModelRequest, [ToolSpec], MultiAgentRuntime?, MessageStream), compact, stop }
            let prepared: Prepared = await locked(owner) {
                guard let state = owner.state, let index = state.activeTurnIndex, state.turns[index].id == turnID else { return .stop }
                var next = state
                var operations: [StoreOperation] = []
                if !next.turns[index].pendingInput.isEmpty {
                    operations.append(.appendHistory(owner.id, firstSequence: next.history.count, items: next.turns[index].pendingInput))
                    next.history += next.turns[index].pendingInput
                    next.turns[index].pendingInput = []
                }
                if !justCompacted, needsCompaction(next, config: owner.config) {
                    if !operations.isEmpty {
                        operations.append(.putTurn(next.turns[index]))
                        do { try await install(owner, next, operations) } catch {
                            await failTurn(owner, turnID: turnID, error: "\(error)", reason: .internalError)
                            return .stop
                        }
                    }
                    return .compact
                }
                let tools = ToolCatalog.offered(
                    runtime: next.record.runtime, depth: next.record.depth, maxDepth: owner.config.maxDepth,
                    source: next.record.source) + next.record.clientTools
                    + (next.record.userInputEnabled ? [UserInputTool.spec] : [])
                    + (await toolServers?.tools(of: next.record.mcpServers.filter { toolServers?.allows($0, principal: next.record.principal) == true },
                                                principal: next.record.principal).map(\.spec) ?? [])
                let ref = ModelRequestRecord(model: next.record.model, contextCount: next.history.count, tools: tools)
                next.turns[index].modelRequests.append(ref)
                operations.append(.putTurn(next.turns[index]))
                do {
                    try await install(owner, next, operations)
                } catch {
                    await failTurn(owner, turnID: turnID, error: "\(error)", reason: .internalError)
                    return .stop
                }
                let request = ref.request(history: next.history, baseInstructions: settings.baseInstructions(for: next.record))
                let stream = MessageStream(owner: owner, turnID: turnID)
                owner.messageStream = stream
                return .call(request, tools, next.record.runtime, stream)
            }
            let request: ModelRequest, tools: [ToolSpec], runtime: MultiAgentRuntime?, stream: MessageStream
            switch prepared {
            case .stop: return
            case .compact:
                guard await compactContext(owner, turnID: turnID) else { return }
                justCompacted = true
                continue
            case let .call(r, t, m, s): (request, tools, runtime, stream) = (r, t, m, s)
            }
            justCompacted = false

            // 2. The model, with no gate held; its message text is published
            //    as it streams.
            let response: ModelResponse
            do {
                response = try await backend.respond(to: request, stream: ModelStream { stream.text($0) })
            } catch is CancellationError {
                return  // interrupted: whoever cancelled did the bookkeeping
            } catch let error as ModelCallError {
                await locked(owner) { await failTurn(owner, turnID: turnID, error: error.message, reason: error.reason) }
                return
            } catch {
                if Task.isCancelled { return }
                await locked(owner) { await failTurn(owner, turnID: turnID, error: "\(error)", reason: .providerError) }
                return
            }
            if let usage = response.usage { await reportUsage(owner, turnID: turnID, usage) }
            let outputs = response.outputs
            let calledTools = outputs.contains { if case .toolCall = $0 { true } else { false } }
            guard await applyStep(owner, turnID: turnID, outputs[...], tools: tools, runtime: runtime, usage: response.usage,
                                  calledTools: calledTools) else { return }
            // Still running without tool calls: steering input is waiting for the model.
            if !calledTools, await locked(owner, { owner.state?.activeTurn?.pendingInput.isEmpty ?? true }) { return }
        }
    }

    /// 3. Applies one model response's outputs in order, in as few commits
    /// as possible; a wait_agent or a client tool runs between commits with
    /// the gate released. With `calledTools` (the response called tools) the
    /// turn goes on to another model call; otherwise the last commit
    /// completes it. False when the turn is no longer running.
    func applyStep(
        _ owner: ThreadOwner, turnID: TurnID, _ outputs: ArraySlice<ModelOutput>, tools: [ToolSpec], runtime: MultiAgentRuntime?,
        usage: TokenUsage?, calledTools: Bool
    ) async -> Bool {
        // A tool of the phase beforeCommit (wait_agent) starts a new step.
        let runsBeforeCommit = { (output: ModelOutput) -> ToolDefinition? in
            guard case let .toolCall(name, _, _) = output,
                  let tool = ToolCatalog.offeredDefinition(name, runtime: runtime, offered: tools), tool.phase == .beforeCommit else { return nil }
            return tool
        }
        let startsStep = { (output: ModelOutput) in runsBeforeCommit(output) != nil || self.externalTool(output, offered: tools) != nil }
        var usage = usage
        var start = outputs.startIndex
        while start < outputs.endIndex {
            if let tool = externalTool(outputs[start], offered: tools), case let .toolCall(name, arguments, callID) = outputs[start] {
                let deferred = outputs[(start + 1)...]
                let callUsage = usage
                usage = nil
                let goesOn = await ThreadTracing.span("tool \(name)", attributes: [
                    "threadwire.tool.name": .string(name), "threadwire.tool.call_id": .string(callID),
                    "threadwire.tool.source": .string(tool.sourceName),
                ]) { span -> Bool in
                    let started = await startClientCall(
                        owner, turnID: turnID, tool: tool, arguments: arguments, callID: callID, deferred: deferred, usage: callUsage)
                    switch started {
                    case .notRunning: return false
                    case .settled: return true
                    case .waiting: return await finishClientCall(owner, turnID: turnID) != nil
                    case let .runHere(itemID):
                        guard case let .mcp(hosted) = tool,
                              case .done = await runHosted(owner, turnID: turnID, hosted, itemID: itemID, arguments: arguments, callID: callID)
                        else { return false }
                        return true
                    }
                }
                guard goesOn else { return false }
                start += 1
                continue
            }
            var waited: String?
            if let tool = runsBeforeCommit(outputs[start]), case let .toolCall(name, arguments, callID) = outputs[start] {
                guard let caller = directory.snapshot(owner.id), let index = caller.activeTurnIndex else { return false }
                waited = await ThreadTracing.span("tool \(name)", attributes: [
                    "threadwire.tool.name": .string(name), "threadwire.tool.call_id": .string(callID),
                    "threadwire.tool.source": "builtin",
                ]) { span in
                    do {
                        return try await tool.execute(self, ToolInvocation(owner: owner, caller: caller, turnIndex: index), arguments: arguments).output
                    } catch {
                        return jsonText(["error": "\(error)"])
                    }
                }
            }
            let end = outputs[(start + 1)...].firstIndex(where: startsStep) ?? outputs.endIndex
            let stillRunning = await applyOutputs(
                owner, turnID: turnID, outputs[start..<end], waited: waited, tools: tools,
                usage: usage, finish: end == outputs.endIndex && !calledTools)
            usage = nil
            guard stillRunning else { return false }
            start = end
        }
        return true
    }

    /// Applies outputs in one commit; with `finish`, the turn completes in the
    /// same commit. False when the turn is no longer running.
    func applyOutputs(
        _ owner: ThreadOwner, turnID: TurnID, _ outputs: ArraySlice<ModelOutput>, waited: String?, tools: [ToolSpec],
        usage: TokenUsage?, finish: Bool
    ) async -> Bool {
        await locked(owner) {
            // No delta of this call may follow what this commit publishes.
            var streamed = owner.messageStream.map { (itemID: $0.itemID, started: $0.close()) }
            owner.messageStream = nil
            guard let state = owner.state, let at = state.activeTurnIndex, state.turns[at].id == turnID else { return false }
            var next = state
            if let usage, !next.turns[at].modelRequests.isEmpty {
                next.turns[at].modelRequests[next.turns[at].modelRequests.count - 1].usage = usage
            }
            var added: [ContextItem] = []
            var deliveries: [Delivery] = []
            var publications: [Publication] = []
            for (offset, output) in outputs.enumerated() {
                switch output {
                case let .message(text):
                    added.append(ContextItem(role: .assistant, kind: .assistantMessage, text: text))
                    // The first message is the one whose text streamed (same item id).
                    let item = ItemRecord(id: streamed?.itemID ?? newID(), type: .agentMessage, text: text)
                    next.turns[at].items.append(item)
                    if streamed?.started == true {
                        deliveries.append(Delivery(event: .itemCompleted(owner.id, turnID, item), recipients: owner.subscribers))
                    } else {
                        deliveries += itemEvents(owner, turnID: turnID, item)
                    }
                    streamed = nil
                case let .toolCall(name, arguments, callID):
                    added.append(ContextItem(role: .assistant, kind: .toolCall, text: arguments, toolName: name, callID: callID))
                    var item = ItemRecord(type: .collabToolCall)
                    item.toolName = name
                    item.toolArguments = arguments
                    let result: ToolResult
                    if offset == 0, let waited {
                        result = ToolResult(output: waited)
                    } else {
                        result = await executeTool(owner, next, turnIndex: at, name: name, arguments: arguments, offered: tools)
                    }
                    item.toolOutput = result.output
                    item.receiverThreadID = result.receiver
                    publications += result.publications
                    added.append(ContextItem(role: .tool, kind: .toolOutput, text: result.output, toolName: name, callID: callID))
                    next.turns[at].items.append(item)
                    deliveries += itemEvents(owner, turnID: turnID, item)
                }
            }
            let first = next.history.count
            next.history += added
            var operations: [StoreOperation] = [.appendHistory(owner.id, firstSequence: first, items: added)]
            // Steering input that arrived during this call gets one more model request.
            let finished = finish && next.turns[at].pendingInput.isEmpty
            if finished {
                operations += self.finish(&next, index: at, status: .completed, error: nil)
                operations.insert(.putThread(next.record.bumped()), at: 0)
            } else {
                operations.append(.putTurn(next.turns[at]))
            }
            do {
                try await install(owner, next, operations)
            } catch {
                for publication in publications { publication.publish() }
                await failTurn(owner, turnID: turnID, error: "\(error)", reason: .internalError)
                return false
            }
            if finished { deliveries += afterFinish(owner, next.turns[at]) }
            for publication in publications { publication.publish() }
            owner.publisher.ticket(deliveries).publish()
            return !finished
        }
    }

    /// thread/token_usage/updated for a model call's usage, before its
    /// outputs are applied (the totals count every recorded call and this one).
    func reportUsage(_ owner: ThreadOwner, turnID: TurnID, _ usage: TokenUsage) async {
        await locked(owner) {
            guard let state = owner.state else { return }
            var total = owner.usageTotal ?? state.turns.lazy.flatMap(\.modelRequests).compactMap(\.usage)
                .reduce(TokenUsage(inputTokens: 0, outputTokens: 0, totalTokens: 0)) { $0.adding($1) }
            total = total.adding(usage)
            owner.usageTotal = total
            let report = TokenUsageReport(last: usage, total: total, contextWindow: settings.catalog.contextWindow(forModel: state.record.model))
            owner.publisher.ticket([Delivery(event: .tokenUsage(owner.id, turnID, report), recipients: owner.subscribers)]).publish()
        }
    }

    func itemEvents(_ owner: ThreadOwner, turnID: TurnID, _ item: ItemRecord) -> [Delivery] {
        let recipients = owner.subscribers
        return [
            Delivery(event: .itemStarted(owner.id, turnID, item), recipients: recipients),
            Delivery(event: .itemCompleted(owner.id, turnID, item), recipients: recipients),
        ]
    }

    func locked<T>(_ owner: ThreadOwner, _ body: () async -> T) async -> T {
        await owner.gate.lock()
        defer { owner.gate.unlock() }
        return await body()
    }
}
