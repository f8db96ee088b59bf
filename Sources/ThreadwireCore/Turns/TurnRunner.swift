import Foundation

/// What a running turn needs of the engine, and all it gets: the thread's
/// owner (the gate and the publisher come with it), committing a change,
/// ending the turn, the backend and the tool hosts, the agent tools (they act
/// on other threads, which is the engine's), and the tables answers arrive
/// through. `ThreadEngine` is the one implementation; a turn never reaches
/// the directory's other threads, leases or the store except through it.
protocol TurnEngine: AnyObject, Sendable {
    var settings: ServerSettings { get }
    var backend: any ModelBackend { get }
    var toolServers: (any ToolServerHost)? { get }
    /// Answers of server requests, by request id.
    var pendingAnswers: PendingAnswers { get }
    /// Pending requests by agent tree root.
    var treeRequests: TreeRequests { get }

    /// A loaded thread's committed state as last published (no gate).
    func snapshot(_ id: ThreadID) -> StoredThread?
    /// A thread's record: its snapshot if loaded, else the store's.
    func record(of id: ThreadID) async -> ThreadRecord?
    /// With the owner's gate held: commits `operations` and installs `next`
    /// (nothing changes in memory if the commit fails); `events` are kept
    /// with the change and come back numbered (`ThreadEngine.numberEvents`).
    func install(_ owner: ThreadOwner, _ next: StoredThread, _ operations: [StoreOperation], events: [Delivery]) async throws -> [Delivery]
    /// With the gate held: ends turn `turnID` as failed and publishes it.
    func failTurn(_ owner: ThreadOwner, turnID: TurnID, error: String, reason: TurnFailureReason) async
    /// With the gate held: ends the active turn (its publication to send).
    func endActiveTurn(_ owner: ThreadOwner, status: TurnStatus, error: String?, reason: TurnFailureReason?) async throws -> Publication
    /// Marks turn `index` ended in `stored`: the operations that store it.
    func finish(_ stored: inout StoredThread, index: Int, status: TurnStatus, error: String?) -> [StoreOperation]
    /// After a finished turn's commit: what it tells beyond its own thread (a parent's mailbox, waiters).
    func afterFinish(_ owner: ThreadOwner)
    /// A finished turn's notifications, committed with its end.
    func finishEvents(_ owner: ThreadOwner, _ turn: TurnRecord) -> [Delivery]
    /// Who is asked a thread's server requests: its subscribers and its tree root's.
    func requestRecipients(_ owner: ThreadOwner) -> [ConnectionID]
    /// Who hears that a request was resolved.
    func resolutionRecipients(_ owner: ThreadOwner) -> [ConnectionID]
    /// Records that a client approved `tool` for the rest of root's agent tree.
    func grantForTree(root: ThreadID, tool: String) async
    /// Runs a collaboration tool of the phase `inCommit` (gate held).
    func executeTool(_ owner: ThreadOwner, _ caller: StoredThread, turnIndex: Int, name: String, arguments: String,
                     offered: [ToolSpec]) async -> ThreadEngine.ToolResult
    /// Runs a collaboration tool of the phase `beforeCommit` (wait_agent; no gate held).
    func executeBeforeCommit(_ tool: ToolDefinition, _ invocation: ToolInvocation, arguments: String) async throws -> ThreadEngine.ToolResult
}

/// A turn's life: the model request built and stored before the model sees
/// it, the answer streamed, tools run (built-in, client, MCP, agents),
/// the context compacted when it nears the window, usage reported, and the
/// outputs committed step by step until the model answers without tool
/// calls. The owner's gate is held for each step's bookkeeping, never while
/// the model, a client or a tool server works.
///
/// It holds nothing of its own: a turn's state is the thread's, stored with
/// each step, so a runner made again after a restart goes on where the
/// stored turn stands (`runTurn(resuming:)`).
struct TurnRunner: Sendable {
    typealias ToolResult = ThreadEngine.ToolResult
    let engine: any TurnEngine

    var settings: ServerSettings { engine.settings }
    var backend: any ModelBackend { engine.backend }
    var toolServers: (any ToolServerHost)? { engine.toolServers }
    var pendingAnswers: PendingAnswers { engine.pendingAnswers }
    var treeRequests: TreeRequests { engine.treeRequests }

    @discardableResult
    func install(_ owner: ThreadOwner, _ next: StoredThread, _ operations: [StoreOperation], events: [Delivery] = []) async throws -> [Delivery] {
        try await engine.install(owner, next, operations, events: events)
    }

    func failTurn(_ owner: ThreadOwner, turnID: TurnID, error: String, reason: TurnFailureReason) async {
        await engine.failTurn(owner, turnID: turnID, error: error, reason: reason)
    }
}

extension TurnRunner {
    /// Runs model calls until the model answers without tool calls. The gate
    /// is held for each step's bookkeeping, never while the model or a
    /// wait_agent runs, so the thread's other commands (interrupt, settings,
    /// reads) are never stuck behind a slow model.
    /// With `resuming`, the turn was stored waiting for a client (a restart
    /// came between): it waits for that answer first, then goes on.
    func runTurn(_ owner: ThreadOwner, turnID: TurnID, resuming: Bool = false) async {
        if resuming {
            guard let (deferred, tools, runtime) = await finishClientCall(owner, turnID: turnID),
                  await applyStep(owner, turnID: turnID, deferred[...], tools: tools, runtime: runtime, usage: nil, calledTools: true),
                  await !pausedAfterTools(owner, turnID: turnID)
            else { return }
        }
        var justCompacted = false
        while true {
            // 1. Persist the model request before the model sees it, with the
            //    steering input that arrived since the last one.
            enum Prepared { case call(ModelRequest, [ToolSpec], MultiAgentRuntime?, MessageStream), compact, stop }
            let prepared: Prepared = await owner.locked {
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
                let ref = ModelRequestRecord(model: next.record.model, contextCount: next.history.count, tools: tools,
                                             reasoning: next.record.reasoning)
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
                await owner.locked { await failTurn(owner, turnID: turnID, error: error.message, reason: error.reason) }
                return
            } catch {
                if Task.isCancelled { return }
                await owner.locked { await failTurn(owner, turnID: turnID, error: "\(error)", reason: .providerError) }
                return
            }
            if let usage = response.usage { await reportUsage(owner, turnID: turnID, usage) }
            let outputs = response.outputs
            let calledTools = outputs.contains { if case .toolCall = $0 { true } else { false } }
            guard await applyStep(owner, turnID: turnID, outputs[...], tools: tools, runtime: runtime, usage: response.usage,
                                  calledTools: calledTools) else { return }
            if calledTools, await pausedAfterTools(owner, turnID: turnID) { return }
            // Still running without tool calls: steering input is waiting for the model.
            if !calledTools, await owner.locked({ owner.state?.activeTurn?.pendingInput.isEmpty ?? true }) { return }
        }
    }

    /// After a batch of tool calls, on a thread set to pause after tools:
    /// the pause is committed with the turn (so it outlasts a restart like a
    /// pending approval) and the runner ends; turn/continue starts another.
    /// True when the turn paused (or is no longer running).
    func pausedAfterTools(_ owner: ThreadOwner, turnID: TurnID) async -> Bool {
        await owner.locked {
            guard let state = owner.state, let at = state.activeTurnIndex, state.turns[at].id == turnID else { return true }
            guard state.record.pauseAfterTools else { return false }
            var next = state
            next.turns[at].pausedAfterTools = true
            do {
                let deliveries = try await install(owner, next, [.putTurn(next.turns[at])], events: [
                    Delivery(event: .statusChanged(owner.id, .active(turnID, waitingOn: .continueAfterTools)), recipients: owner.subscribers)])
                owner.publisher.ticket(deliveries).publish()
            } catch {
                await failTurn(owner, turnID: turnID, error: "\(error)", reason: .internalError)
            }
            return true
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
                guard let caller = engine.snapshot(owner.id), let index = caller.activeTurnIndex else { return false }
                waited = await ThreadTracing.span("tool \(name)", attributes: [
                    "threadwire.tool.name": .string(name), "threadwire.tool.call_id": .string(callID),
                    "threadwire.tool.source": "builtin",
                ]) { span in
                    do {
                        return try await engine.executeBeforeCommit(tool, ToolInvocation(owner: owner, caller: caller, turnIndex: index), arguments: arguments).output
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
        await owner.locked {
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
                        deliveries += owner.itemEvents(turnID: turnID, item)
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
                        result = await engine.executeTool(owner, next, turnIndex: at, name: name, arguments: arguments, offered: tools)
                    }
                    item.toolOutput = result.output
                    item.receiverThreadID = result.receiver
                    publications += result.publications
                    added.append(ContextItem(role: .tool, kind: .toolOutput, text: result.output, toolName: name, callID: callID))
                    next.turns[at].items.append(item)
                    deliveries += owner.itemEvents(turnID: turnID, item)
                }
            }
            let first = next.history.count
            next.history += added
            var operations: [StoreOperation] = [.appendHistory(owner.id, firstSequence: first, items: added)]
            // Steering input that arrived during this call gets one more model request.
            let finished = finish && next.turns[at].pendingInput.isEmpty
            if finished {
                operations += engine.finish(&next, index: at, status: .completed, error: nil)
                operations.insert(.putThread(next.record.bumped()), at: 0)
            } else {
                operations.append(.putTurn(next.turns[at]))
            }
            if finished { deliveries += engine.finishEvents(owner, next.turns[at]) }
            do {
                deliveries = try await install(owner, next, operations, events: deliveries)
            } catch {
                for publication in publications { publication.publish() }
                await failTurn(owner, turnID: turnID, error: "\(error)", reason: .internalError)
                return false
            }
            if finished { engine.afterFinish(owner) }
            for publication in publications { publication.publish() }
            owner.publisher.ticket(deliveries).publish()
            return !finished
        }
    }

    /// thread/token_usage/updated for a model call's usage, before its
    /// outputs are applied (the totals count every recorded call and this one).
    func reportUsage(_ owner: ThreadOwner, turnID: TurnID, _ usage: TokenUsage) async {
        await owner.locked {
            guard let state = owner.state else { return }
            var total = owner.usageTotal ?? state.turns.lazy.flatMap(\.modelRequests).compactMap(\.usage)
                .reduce(TokenUsage(inputTokens: 0, outputTokens: 0, totalTokens: 0)) { $0.adding($1) }
            total = total.adding(usage)
            owner.usageTotal = total
            let report = TokenUsageReport(last: usage, total: total, contextWindow: settings.catalog.contextWindow(forModel: state.record.model))
            owner.publisher.ticket([Delivery(event: .tokenUsage(owner.id, turnID, report), recipients: owner.subscribers)]).publish()
        }
    }
}
