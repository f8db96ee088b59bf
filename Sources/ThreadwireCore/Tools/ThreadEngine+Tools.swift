import Foundation

extension ThreadEngine {
    struct ToolResult {
        var output: String
        var receiver: ThreadID?
        var publications: [Publication] = []
    }

    /// Runs a collaboration tool call of the phase `inCommit`, with the
    /// caller's gate held. Failures become tool output the model can read,
    /// as a real model would see them. Children are found in the stored
    /// registry, so they stay reachable after a restart, an unsubscribe or an
    /// idle unload.
    func executeTool(
        _ owner: ThreadOwner, _ caller: StoredThread, turnIndex: Int, name: String, arguments: String, offered: [ToolSpec]
    ) async -> ToolResult {
        guard let tool = ToolCatalog.offeredDefinition(name, runtime: caller.record.runtime ?? .disabled, offered: offered) else {
            return ToolResult(output: jsonText(["error": "tool '\(name)' is not available in this thread"]))
        }
        return await ThreadTracing.span("tool \(name)", attributes: [
            "threadwire.tool.name": .string(name), "threadwire.tool.source": "builtin",
        ]) { span in
            do {
                return try await tool.execute(self, ToolInvocation(owner: owner, caller: caller, turnIndex: turnIndex), arguments: arguments)
            } catch {
                return ToolResult(output: jsonText(["error": "\(error)"]))
            }
        }
    }

    // MARK: The tools (ToolCatalog names which runs for which name)

    func spawnAgentTool(_ call: ToolInvocation, _ args: ToolArguments.Spawn) async throws -> ToolResult {
        var request = SpawnRequest()
        request.message = args.message
        request.model = args.model
        request.taskName = args.task_name
        let spawned = try await spawnChild(
            of: call.owner, call.caller, request, spawningMode: call.caller.turns[call.turnIndex].context.effectiveMode, extraSubscriber: nil)
        let child = spawned.view.record
        let output = call.runtime == .v2
            ? jsonText(["task_name": child.taskName ?? "", "nickname": child.nickname ?? ""])
            : jsonText(["agent_id": child.id, "nickname": child.nickname ?? ""])
        return ToolResult(output: output, receiver: child.id, publications: spawned.publications)
    }

    /// send_input (v1) and followup_task (v2): a message that starts the target's turn.
    func startTaskTool(_ call: ToolInvocation, _ args: ToolArguments.TargetedMessage) async throws -> ToolResult {
        guard let target = try await target(of: call.caller.record, args.target) else { return unknownTarget(args.target) }
        let message = args.message
        let (turn, publication) = try await withOwner(target.id) { child in
            try await beginTurn(child, TurnRequest(input: [message]))
        }
        return ToolResult(output: jsonText(["submission_id": turn.id]), receiver: target.id, publications: [publication])
    }

    func sendMessageTool(_ call: ToolInvocation, _ args: ToolArguments.TargetedMessage) async throws -> ToolResult {
        guard let target = try await target(of: call.caller.record, args.target) else { return unknownTarget(args.target) }
        let item = ContextItem(role: .user, kind: .mailbox, text: jsonText([
            "from": call.caller.record.taskName ?? "/root", "message": args.message,
        ]))
        try await withOwner(target.id) { child in
            var next = child.current
            let first = next.history.count
            next.history.append(item)
            try await install(child, next, [.appendHistory(target.id, firstSequence: first, items: [item])])
        }
        return ToolResult(output: jsonText(["queued": "true"]), receiver: target.id)
    }

    func listAgentsTool(_ call: ToolInvocation, _ args: ToolArguments.List) async throws -> ToolResult {
        let prefix = args.path_prefix
        let agents = try await descendants(of: call.caller.record)
            .filter { prefix == nil || ($0.taskName ?? "").hasPrefix(prefix!) }
            .map { agent -> [String: String] in
                var entry = ["thread_id": agent.id, "task_name": agent.taskName ?? "", "nickname": agent.nickname ?? "",
                             "model": agent.model, "status": Self.reportedStatus(agent)]
                if let message = agent.agentFinalMessage { entry["final_message"] = message }
                return entry
            }
        return ToolResult(output: jsonText(["agents": agents]))
    }

    func closeAgentTool(_ call: ToolInvocation, _ args: ToolArguments.Target) async throws -> ToolResult {
        guard let target = try await target(of: call.caller.record, args.target) else { return unknownTarget(args.target) }
        let publication = try await withOwner(target.id) { child -> Publication? in
            guard !child.current.record.agentClosed else { return nil }
            var publication: Publication?
            if child.current.activeTurnIndex != nil {
                publication = try await endActiveTurn(child, status: .interrupted, error: "interrupted: the agent was closed")
            }
            var next = child.current
            next.record.agentClosed = true
            try await install(child, next, [.putThread(next.record.bumped())])
            changes.changed(target.id)
            return publication
        }
        return ToolResult(output: jsonText(["status": "shutdown"]), receiver: target.id, publications: publication.map { [$0] } ?? [])
    }

    func resumeAgentTool(_ call: ToolInvocation, _ args: ToolArguments.Resume) async throws -> ToolResult {
        guard let target = try await target(of: call.caller.record, args.id) else { return unknownTarget(args.id) }
        let caller = call.caller.record
        let cap = call.owner.config.childAgentCap(for: call.runtime)
        let status = try await withOwner(target.id) { child -> String in
            guard child.current.record.agentClosed else { return Self.reportedStatus(child.current.record) }
            // Reopening takes a slot: reserved under the tree's gate like a spawn.
            return try await withTreeGate(caller.sessionID) {
                let open = try await agentTree(of: caller)
                    .filter { $0.source == .threadSpawn && !$0.agentClosed }.count
                if open >= cap.limit {
                    throw DomainError.resourceExhausted("agent limit reached: \(cap.name) = \(cap.limit)")
                }
                var next = child.current
                next.record.agentClosed = false
                try await install(child, next, [.putThread(next.record.bumped())])
                changes.changed(target.id)
                return Self.reportedStatus(next.record)
            }
        }
        return ToolResult(output: jsonText(["status": status]), receiver: target.id)
    }

    /// wait_agent (phase `beforeCommit`: no gate held while it waits).
    func waitAgentTool(_ call: ToolInvocation, _ args: ToolArguments.Wait) async -> ToolResult {
        ToolResult(output: await waitForAgents(caller: call.caller.record, args))
    }

    func unknownTarget(_ named: String) -> ToolResult {
        ToolResult(output: jsonText(["error": "unknown target '\(named)': not a child agent of this thread"]))
    }

    static func reportedStatus(_ record: ThreadRecord) -> String {
        record.agentClosed ? "shutdown" : (record.agentStatus ?? .pendingInit).toolName
    }

    /// A child of `caller` named by id, task path, or the last part of its path.
    func target(of caller: ThreadRecord, _ key: String) async throws -> ThreadRecord? {
        guard !key.isEmpty else { return nil }
        return try await agentTree(of: caller).first {
            $0.parentID == caller.id && $0.source == .threadSpawn
                && ($0.id == key || $0.taskName == key || $0.taskName?.hasSuffix("/" + key) == true)
        }
    }

    /// Every spawned agent below `caller`, from the stored registry.
    func descendants(of caller: ThreadRecord) async throws -> [ThreadRecord] {
        let tree = try await agentTree(of: caller).filter { $0.source == .threadSpawn }
        var below: Set<ThreadID> = [caller.id]
        var result: [ThreadRecord] = []
        // Records come in creation order, and a parent is always created before its children.
        for record in tree.sorted(by: { ($0.createdAt, $0.id) < ($1.createdAt, $1.id) }) {
            if let parent = record.parentID, below.contains(parent) {
                below.insert(record.id)
                result.append(record)
            }
        }
        return result
    }

    /// wait_agent: returns once every awaited child has a final status
    /// (completed, errored, interrupted, shutdown), at once if they already
    /// have (also across restarts: statuses are stored), or at the timeout.
    /// It wakes on status changes, never polls, and holds no gate.
    /// Arguments: `targets` (ids or task names; default: the caller's open
    /// children) and `timeout_ms` (default and maximum from the server config).
    func waitForAgents(caller: ThreadRecord, _ args: ToolArguments.Wait) async -> String {
        var timeoutMs = settings.agentWaitDefaultMs
        if let asked = args.timeout_ms { timeoutMs = max(0, min(asked, settings.agentWaitMaxMs)) }
        let deadline = ContinuousClock.now + .milliseconds(timeoutMs)
        let names = args.targets
        do {
            while true {
                let children = try await agentTree(of: caller).filter { $0.parentID == caller.id && $0.source == .threadSpawn }
                let awaited: [ThreadRecord]
                var unknown: [String] = []
                if let names {
                    awaited = names.compactMap { key in
                        let match = children.first { $0.id == key || $0.taskName == key || $0.taskName?.hasSuffix("/" + key) == true }
                        if match == nil { unknown.append(key) }
                        return match
                    }
                } else {
                    awaited = children.filter { !$0.agentClosed }
                }
                let waiter = changes.register(Set(awaited.map(\.id)))
                // Re-read after registering, so a change in between is seen.
                let fresh = try await agentTree(of: caller).filter { record in awaited.contains { $0.id == record.id } }
                let done = fresh.allSatisfy { $0.agentClosed || ($0.agentStatus?.isFinal ?? true) }
                if done || ContinuousClock.now >= deadline {
                    changes.remove(waiter)
                    var statuses: [String: String] = [:]
                    var messages: [String: String] = [:]
                    for record in fresh {
                        let key = record.taskName ?? record.id
                        statuses[key] = Self.reportedStatus(record)
                        if let message = record.agentFinalMessage { messages[key] = message }
                    }
                    for key in unknown { statuses[key] = "not_found" }
                    return jsonText(["status": statuses, "messages": messages, "timed_out": !done])
                }
                _ = await ChangeBoard.wait(waiter, until: deadline)
                changes.remove(waiter)
            }
        } catch {
            return jsonText(["error": "\(error)"])
        }
    }
}
