import Foundation

extension ThreadEngine {
    /// Starts a turn: applies sticky overrides, resolves the runtime if this is
    /// the first turn, appends the context the turn adds, and commits it all in
    /// one transaction. The model runs afterwards (see `runTurn`).
    func beginTurn(_ thread: LoadedThread, _ request: TurnRequest) async throws -> Outcome<TurnRecord> {
        let id = thread.record.id
        if let active = thread.activeTurnIndex {
            throw DomainError.failedPrecondition("thread \(id) already has an active turn (\(thread.turns[active].id))")
        }
        if thread.record.archived {
            throw DomainError.failedPrecondition("thread \(id) is archived; unarchive it first")
        }
        let texts = request.input.filter { !$0.isEmpty }
        guard !texts.isEmpty else { throw DomainError.invalidArgument("input must contain at least one non-empty text") }

        var record = thread.record
        if let model = try nonEmpty(request.model, field: "model") { record.model = model }
        record.selectedMode = request.mode.applied(to: record.selectedMode)
        let settingsChanged = record.model != thread.record.model || record.selectedMode != thread.record.selectedMode

        // Set once, at the first turn: the catalog selector of this turn's model, else flags.
        let runtime = record.runtime ?? RuntimeResolver.resolveAtFirstTurn(
            catalogSelector: settings.catalog.selector(forModel: record.model), flags: thread.config.flags)
        record.runtime = runtime

        let effective = ModeRules.effective(
            selected: record.selectedMode, runtime: runtime, usageHintEnabled: thread.config.usageHintEnabled,
            source: record.source, gateEnabled: thread.config.flags.multiAgentMode)
        var added: [ContextItem] = []
        let baseline: ModeRules.Baseline = thread.turns.last.map { .previous($0.context.effectiveMode) } ?? .noPreviousTurn
        if baseline == .noPreviousTurn, runtime == .v2, thread.config.usageHintEnabled, record.source != .review {
            let hint = record.source == .threadSpawn ? settings.subagentUsageHint : settings.rootUsageHint
            added.append(ContextItem(role: .developer, kind: .usageHint, text: hint))
        }
        if let mode = ModeRules.fragmentToEmit(baseline: baseline, current: effective) {
            added.append(ContextItem(role: .developer, kind: .multiAgentMode, text: ModeRules.fragmentText(mode)))
        }
        let text = texts.joined(separator: "\n")
        added.append(ContextItem(role: .user, kind: .userInput, text: text))

        let now = nowMillis()
        if record.preview.isEmpty { record.preview = String(text.prefix(120)) }
        record.updatedAt = now
        let userItem = ItemRecord(type: .userMessage, text: text)
        let turn = TurnRecord(
            id: newID(), threadID: id, sequence: thread.turns.count, startedAt: now, items: [userItem],
            context: TurnContext(model: record.model, runtime: runtime, effectiveMode: effective, cwd: record.cwd))

        let firstSequence = thread.history.count
        thread.record = record
        thread.history += added
        thread.turns.append(turn)
        do {
            try await commit([.putThread(record), .appendHistory(id, firstSequence: firstSequence, items: added), .putTurn(turn)])
        } catch {
            // Not acknowledged: forget it so memory matches the store.
            loaded[id] = nil
            throw error
        }

        let recipients = Array(thread.subscribers)
        var deliveries: [Delivery] = []
        if settingsChanged {
            deliveries.append(Delivery(event: .settingsUpdated(id, settingsView(thread)), recipients: recipients))
        }
        deliveries += [
            Delivery(event: .turnStarted(id, turn), recipients: recipients),
            Delivery(event: .statusChanged(id, .active(turn.id)), recipients: recipients),
            Delivery(event: .itemStarted(id, turn.id, userItem), recipients: recipients),
            Delivery(event: .itemCompleted(id, turn.id, userItem), recipients: recipients),
        ]
        let turnID = turn.id
        return Outcome(turn, deliveries: deliveries, afterward: { [weak self] in
            await self?.launchRunner(id, turnID: turnID)
        })
    }

    func launchRunner(_ id: ThreadID, turnID: TurnID) {
        guard let thread = loaded[id], thread.activeTurnIndex.map({ thread.turns[$0].id }) == turnID else { return }
        thread.runner = Task { [weak self] in await self?.runTurn(id, turnID: turnID) }
    }

    /// Runs model calls until the model answers without tool calls. Every model
    /// request is persisted before the model sees it.
    func runTurn(_ id: ThreadID, turnID: TurnID) async {
        while true {
            guard let thread = loaded[id], let index = thread.activeTurnIndex, thread.turns[index].id == turnID else { return }
            let tools = ToolCatalog.offered(
                runtime: thread.record.runtime, depth: thread.record.depth, maxDepth: thread.config.maxDepth,
                source: thread.record.source)
            let ref = ModelRequestRecord(model: thread.record.model, contextCount: thread.history.count, tools: tools)
            thread.turns[index].modelRequests.append(ref)
            let request = ModelRequest(
                model: ref.model,
                context: [ContextItem(role: .system, kind: .baseInstructions, text: baseInstructions(for: thread.record))]
                    + thread.history,
                tools: tools)
            do {
                try await commit([.putTurn(thread.turns[index])])
            } catch {
                _ = try? await failActiveTurn(id, turnID: turnID, error: "\(error)")
                return
            }

            let outputs: [ModelOutput]
            do {
                outputs = try await backend.respond(to: request)
            } catch is CancellationError {
                return  // interrupted: turn/interrupt did the bookkeeping
            } catch {
                _ = try? await failActiveTurn(id, turnID: turnID, error: "\(error)")
                return
            }
            guard let current = loaded[id], let at = current.activeTurnIndex, current.turns[at].id == turnID else { return }

            var added: [ContextItem] = []
            var deliveries: [Delivery] = []
            var calledTools = false
            var afterwards: [@Sendable () async -> Void] = []
            for output in outputs {
                switch output {
                case let .message(text):
                    added.append(ContextItem(role: .assistant, kind: .assistantMessage, text: text))
                    let item = ItemRecord(type: .agentMessage, text: text)
                    current.turns[at].items.append(item)
                    deliveries += itemEvents(current, turnID: turnID, item)
                case let .toolCall(name, arguments, callID):
                    calledTools = true
                    added.append(ContextItem(role: .assistant, kind: .toolCall, text: arguments, toolName: name, callID: callID))
                    var item = ItemRecord(type: .collabToolCall)
                    item.toolName = name
                    item.toolArguments = arguments
                    let result = await executeTool(current, turnIndex: at, name: name, arguments: arguments, offered: tools)
                    item.toolOutput = result.output
                    item.receiverThreadID = result.receiver
                    deliveries += result.deliveries
                    if let afterward = result.afterward { afterwards.append(afterward) }
                    added.append(ContextItem(role: .tool, kind: .toolOutput, text: result.output, toolName: name, callID: callID))
                    current.turns[at].items.append(item)
                    deliveries += itemEvents(current, turnID: turnID, item)
                }
            }
            // Tools may have suspended (spawning commits); re-check before writing.
            guard let again = loaded[id], let final = again.activeTurnIndex, again.turns[final].id == turnID else { return }
            let firstSequence = again.history.count
            again.history += added
            do {
                try await commit([.appendHistory(id, firstSequence: firstSequence, items: added), .putTurn(again.turns[final])])
            } catch {
                _ = try? await failActiveTurn(id, turnID: turnID, error: "\(error)")
                return
            }
            sink.deliver(deliveries)
            for afterward in afterwards { await afterward() }
            if !calledTools {
                if let deliveries = try? await finishTurn(again, index: final, status: .completed, error: nil) {
                    sink.deliver(deliveries)
                }
                return
            }
        }
    }

    func itemEvents(_ thread: LoadedThread, turnID: TurnID, _ item: ItemRecord) -> [Delivery] {
        let recipients = Array(thread.subscribers)
        return [
            Delivery(event: .itemStarted(thread.record.id, turnID, item), recipients: recipients),
            Delivery(event: .itemCompleted(thread.record.id, turnID, item), recipients: recipients),
        ]
    }

    func failActiveTurn(_ id: ThreadID, turnID: TurnID, error: String) async throws {
        guard let thread = loaded[id], let index = thread.activeTurnIndex, thread.turns[index].id == turnID else { return }
        sink.deliver(try await finishTurn(thread, index: index, status: .failed, error: error))
    }

    /// Ends a turn. Interrupted turns record the runtime's interruption marker.
    /// A child's end is reported to its parent in the runtime's own way.
    func finishTurn(_ thread: LoadedThread, index: Int, status: TurnStatus, error: String?) async throws -> [Delivery] {
        let id = thread.record.id
        thread.turns[index].status = status
        thread.turns[index].error = error
        thread.turns[index].completedAt = nowMillis()
        var operations: [StoreOperation] = [.putTurn(thread.turns[index])]
        if status == .interrupted {
            let marker = Self.interruptionMarker(runtime: thread.record.runtime)
            operations.insert(.appendHistory(id, firstSequence: thread.history.count, items: [marker]), at: 0)
            thread.history.append(marker)
        }
        thread.record.updatedAt = nowMillis()
        operations.append(.putThread(thread.record))
        try await commit(operations)
        let turn = thread.turns[index]
        let recipients = Array(thread.subscribers)
        scheduleUnloadIfIdle(thread)
        if let parentID = thread.record.parentID, thread.record.source == .threadSpawn {
            try? await notifyParent(parentID, child: thread, turn: turn)
        }
        return [
            Delivery(event: .turnCompleted(id, turn), recipients: recipients),
            Delivery(event: .statusChanged(id, .idle), recipients: recipients),
        ]
    }

    /// V1: a user-role <subagent_notification> message; V2: a mailbox item.
    func notifyParent(_ parentID: ThreadID, child: LoadedThread, turn: TurnRecord) async throws {
        let parent = try await load(parentID)
        let last = turn.items.last { $0.type == .agentMessage }?.text
        let status = Self.agentStatus(of: child, closed: false)
        let item: ContextItem
        if child.record.runtime == .v2 {
            let payload = jsonText(["from": child.record.taskName ?? child.record.id, "status": status, "message": last ?? ""])
            item = ContextItem(role: .user, kind: .mailbox, text: payload)
        } else {
            let payload = jsonText(["agent_id": child.record.id, "status": status])
            item = ContextItem(role: .user, kind: .subagentNotification, text: "<subagent_notification>\(payload)</subagent_notification>")
        }
        let first = parent.history.count
        parent.history.append(item)
        try await commit([.appendHistory(parentID, firstSequence: first, items: [item])])
    }

    static func agentStatus(of thread: LoadedThread, closed: Bool) -> String {
        if closed { return "shutdown" }
        guard let last = thread.turns.last else { return "pending_init" }
        switch last.status {
        case .inProgress: return "running"
        case .completed: return "completed"
        case .interrupted: return "interrupted"
        case .failed: return "errored"
        }
    }

    // MARK: - Child agents

    /// Creates a child thread that inherits the parent's pinned runtime; the
    /// depth and concurrency gates come from the parent's config and runtime.
    func spawnChild(
        of parent: LoadedThread, _ request: SpawnRequest, spawningMode: MultiAgentMode?, extraSubscriber: ConnectionID?
    ) async throws -> (LoadedThread, [Delivery], (@Sendable () async -> Void)?) {
        let parentID = parent.record.id
        guard let parentRuntime = parent.record.runtime else {
            throw DomainError.failedPrecondition(
                "thread \(parentID) has not resolved its multi-agent runtime yet; run a turn first")
        }
        let depth = parent.record.depth + 1
        let session = parent.record.sessionID
        if !request.review {
            if parentRuntime == .disabled || parent.record.source == .review {
                throw DomainError.failedPrecondition("multi-agent collaboration is disabled for thread \(parentID)")
            }
            if depth > parent.config.maxDepth {
                throw DomainError.failedPrecondition(
                    "agent depth limit reached: a child of thread \(parentID) would have depth \(depth) > agents.max_depth = \(parent.config.maxDepth)")
            }
            let cap = parent.config.childAgentCap(for: parentRuntime)
            if openChildren[session, default: []].count >= cap.limit {
                throw DomainError.resourceExhausted(
                    "agent limit reached: \(cap.limit) concurrent child agents (\(cap.name) = \(cap.limit)) for runtime \(parentRuntime.rawValue)")
            }
        }
        let id = newID()
        var record = ThreadRecord(
            id: id, sessionID: session, source: request.review ? .review : .threadSpawn, depth: depth,
            createdAt: nowMillis(), model: try nonEmpty(request.model, field: "model") ?? parent.record.model,
            cwd: parent.record.cwd)
        record.parentID = parentID
        record.configOverrides = parent.record.configOverrides
        record.baseInstructions = parent.record.baseInstructions
        // Inherited, never re-resolved: a V2 parent keeps a V2 child whatever the child's model says.
        record.runtime = RuntimeResolver.resolveAtLoad(
            inherited: request.review ? .disabled : parentRuntime, recorded: nil, origin: .new)
        let siblings = children[parentID, default: []].count + 1
        record.nickname = Self.nicknames[(siblings - 1) % Self.nicknames.count]
        if record.runtime == .v2 {
            let name = request.taskName.flatMap { $0.isEmpty ? nil : $0 } ?? "task\(siblings)"
            let prefix = parent.record.taskName ?? "/root"
            record.taskName = name.hasPrefix("/") ? name : prefix + "/" + name
            // A V2 child takes the spawning turn's effective mode as its selection.
            record.selectedMode = spawningMode
        }
        try await commit([.putThread(record)])
        let child = LoadedThread(stored: StoredThread(record: record, history: [], turns: []), config: parent.config)
        child.subscribers = parent.subscribers
        if let extraSubscriber { child.subscribers.insert(extraSubscriber) }
        loaded[id] = child
        children[parentID, default: []].append(id)
        if !request.review { openChildren[session, default: []].insert(id) }
        var deliveries = [Delivery(event: .threadStarted(view(of: child, includeTurns: false)), recipients: Array(child.subscribers))]
        var afterward: (@Sendable () async -> Void)?
        if let message = request.message, !message.isEmpty {
            let outcome = try await beginTurn(child, TurnRequest(input: [message]))
            deliveries += outcome.deliveries
            afterward = outcome.afterward
        }
        return (child, deliveries, afterward)
    }

    static let nicknames = ["Ada", "Brook", "Cyd", "Dale", "Eli", "Fern", "Gale", "Hale"]

    struct ToolResult {
        var output: String
        var receiver: ThreadID?
        var deliveries: [Delivery] = []
        var afterward: (@Sendable () async -> Void)?
    }

    /// Executes a collaboration tool call. Failures become tool output the
    /// model can read, as a real model would see them.
    func executeTool(_ thread: LoadedThread, turnIndex: Int, name: String, arguments: String, offered: [ToolSpec]) async -> ToolResult {
        guard offered.contains(where: { $0.name == name }) else {
            return ToolResult(output: jsonText(["error": "tool '\(name)' is not available in this thread"]))
        }
        let args = (try? JSONSerialization.jsonObject(with: Data(arguments.utf8))) as? [String: Any] ?? [:]
        let runtime = thread.record.runtime ?? .disabled
        func target() -> LoadedThread? {
            guard let key = (args["target"] ?? args["id"]) as? String else { return nil }
            return children[thread.record.id, default: []].lazy.compactMap { self.loaded[$0] }.first {
                $0.record.id == key || $0.record.taskName == key || $0.record.taskName?.hasSuffix("/" + key) == true
            }
        }
        do {
            switch name {
            case "spawn_agent":
                var request = SpawnRequest()
                request.message = args["message"] as? String
                request.model = args["model"] as? String
                request.taskName = args["task_name"] as? String
                let (child, deliveries, afterward) = try await spawnChild(
                    of: thread, request, spawningMode: thread.turns[turnIndex].context.effectiveMode, extraSubscriber: nil)
                let output = runtime == .v2
                    ? jsonText(["task_name": child.record.taskName ?? "", "nickname": child.record.nickname ?? ""])
                    : jsonText(["agent_id": child.record.id, "nickname": child.record.nickname ?? ""])
                return ToolResult(output: output, receiver: child.record.id, deliveries: deliveries, afterward: afterward)
            case "send_input", "followup_task":
                guard let child = target() else { return ToolResult(output: jsonText(["error": "unknown target"])) }
                let outcome = try await beginTurn(child, TurnRequest(input: [args["message"] as? String ?? ""]))
                return ToolResult(output: jsonText(["submission_id": outcome.value.id]), receiver: child.record.id,
                                  deliveries: outcome.deliveries, afterward: outcome.afterward)
            case "send_message":
                guard let child = target() else { return ToolResult(output: jsonText(["error": "unknown target"])) }
                let item = ContextItem(role: .user, kind: .mailbox,
                                       text: jsonText(["from": thread.record.taskName ?? "/root", "message": args["message"] as? String ?? ""]))
                let first = child.history.count
                child.history.append(item)
                try await commit([.appendHistory(child.record.id, firstSequence: first, items: [item])])
                return ToolResult(output: jsonText(["queued": "true"]), receiver: child.record.id)
            case "wait_agent":
                let ids = children[thread.record.id, default: []]
                // The embedded backend finishes child turns quickly; bound the wait anyway.
                for _ in 0..<500 where ids.contains(where: { loaded[$0]?.activeTurnIndex != nil }) {
                    try await Task.sleep(for: .milliseconds(10))
                }
                var statuses: [String: String] = [:]
                let session = openChildren[thread.record.sessionID, default: []]
                for id in ids { if let child = loaded[id] { statuses[child.record.taskName ?? id] = Self.agentStatus(of: child, closed: !session.contains(id)) } }
                return ToolResult(output: jsonText(["status": statuses]))
            case "list_agents":
                let list = children[thread.record.id, default: []].compactMap { loaded[$0] }.map {
                    ["task_name": $0.record.taskName ?? "", "thread_id": $0.record.id, "status": Self.agentStatus(of: $0, closed: false)]
                }
                return ToolResult(output: jsonText(["agents": list]))
            case "close_agent":
                guard let child = target() else { return ToolResult(output: jsonText(["error": "unknown target"])) }
                openChildren[thread.record.sessionID]?.remove(child.record.id)
                return ToolResult(output: jsonText(["status": "shutdown"]), receiver: child.record.id)
            case "resume_agent":
                guard let child = target() else { return ToolResult(output: jsonText(["error": "unknown target"])) }
                let cap = thread.config.childAgentCap(for: runtime)
                if openChildren[thread.record.sessionID, default: []].count >= cap.limit {
                    throw DomainError.resourceExhausted("agent limit reached: \(cap.name) = \(cap.limit)")
                }
                openChildren[thread.record.sessionID, default: []].insert(child.record.id)
                return ToolResult(output: jsonText(["status": Self.agentStatus(of: child, closed: false)]), receiver: child.record.id)
            default:
                return ToolResult(output: jsonText(["error": "tool '\(name)' is not implemented"]))
            }
        } catch {
            return ToolResult(output: jsonText(["error": "\(error)"]))
        }
    }
}

func jsonText(_ object: Any) -> String {
    guard let data = try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys]) else { return "{}" }
    return String(decoding: data, as: UTF8.self)
}
