import Foundation

extension ThreadEngine {
    struct ToolResult {
        var output: String
        var receiver: ThreadID?
        var publications: [Publication] = []
    }

    /// Executes a collaboration tool call with the caller's gate held.
    /// Failures become tool output the model can read, as a real model would
    /// see them. Children are found in the stored registry, so they stay
    /// reachable after a restart, an unsubscribe or an idle unload.
    func executeTool(
        _ owner: ThreadOwner, _ caller: StoredThread, turnIndex: Int, name: String, arguments: String, offered: [ToolSpec]
    ) async -> ToolResult {
        let runtime = caller.record.runtime ?? .disabled
        guard offered.contains(where: { $0.name == name }), let tool = ToolCatalog.definition(name, runtime: runtime) else {
            return ToolResult(output: jsonText(["error": "tool '\(name)' is not available in this thread"]))
        }
        do {
            switch name {
            case "spawn_agent":
                let args = try tool.decode(arguments, as: ToolArguments.Spawn.self)
                var request = SpawnRequest()
                request.message = args.message
                request.model = args.model
                request.taskName = args.task_name
                let spawned = try await spawnChild(
                    of: owner, caller, request, spawningMode: caller.turns[turnIndex].context.effectiveMode, extraSubscriber: nil)
                let child = spawned.view.record
                let output = runtime == .v2
                    ? jsonText(["task_name": child.taskName ?? "", "nickname": child.nickname ?? ""])
                    : jsonText(["agent_id": child.id, "nickname": child.nickname ?? ""])
                return ToolResult(output: output, receiver: child.id, publications: spawned.publications)
            case "send_input", "followup_task":
                let args = try tool.decode(arguments, as: ToolArguments.TargetedMessage.self)
                guard let target = try await target(of: caller.record, args.target) else { return unknownTarget(args.target) }
                let message = args.message
                let (turn, publication) = try await withOwner(target.id) { child in
                    try await beginTurn(child, TurnRequest(input: [message]))
                }
                return ToolResult(output: jsonText(["submission_id": turn.id]), receiver: target.id, publications: [publication])
            case "send_message":
                let args = try tool.decode(arguments, as: ToolArguments.TargetedMessage.self)
                guard let target = try await target(of: caller.record, args.target) else { return unknownTarget(args.target) }
                let item = ContextItem(role: .user, kind: .mailbox, text: jsonText([
                    "from": caller.record.taskName ?? "/root", "message": args.message,
                ]))
                try await withOwner(target.id) { child in
                    var next = child.state!
                    let first = next.history.count
                    next.history.append(item)
                    try await install(child, next, [.appendHistory(target.id, firstSequence: first, items: [item])])
                }
                return ToolResult(output: jsonText(["queued": "true"]), receiver: target.id)
            case "list_agents":
                let prefix = try tool.decode(arguments, as: ToolArguments.List.self).path_prefix
                let agents = try await descendants(of: caller.record)
                    .filter { prefix == nil || ($0.taskName ?? "").hasPrefix(prefix!) }
                    .map { agent -> [String: String] in
                        var entry = ["thread_id": agent.id, "task_name": agent.taskName ?? "", "nickname": agent.nickname ?? "",
                                     "model": agent.model, "status": Self.reportedStatus(agent)]
                        if let message = agent.agentFinalMessage { entry["final_message"] = message }
                        return entry
                    }
                return ToolResult(output: jsonText(["agents": agents]))
            case "close_agent":
                let key = try tool.decode(arguments, as: ToolArguments.Target.self).target
                guard let target = try await target(of: caller.record, key) else { return unknownTarget(key) }
                let publication = try await withOwner(target.id) { child -> Publication? in
                    guard !child.state!.record.agentClosed else { return nil }
                    var publication: Publication?
                    if child.state!.activeTurnIndex != nil {
                        publication = try await endActiveTurn(child, status: .interrupted, error: "interrupted: the agent was closed")
                    }
                    var next = child.state!
                    next.record.agentClosed = true
                    try await install(child, next, [.putThread(next.record.bumped())])
                    changes.changed(target.id)
                    return publication
                }
                return ToolResult(output: jsonText(["status": "shutdown"]), receiver: target.id,
                                  publications: publication.map { [$0] } ?? [])
            case "resume_agent":
                let key = try tool.decode(arguments, as: ToolArguments.Resume.self).id
                guard let target = try await target(of: caller.record, key) else { return unknownTarget(key) }
                let status = try await withOwner(target.id) { child -> String in
                    guard child.state!.record.agentClosed else { return Self.reportedStatus(child.state!.record) }
                    // Reopening takes a slot: reserved under the tree's gate like a spawn.
                    return try await withTreeGate(caller.record.sessionID) {
                        let cap = owner.config.childAgentCap(for: runtime)
                        let open = try await store.agentTree(caller.record.sessionID)
                            .filter { $0.source == .threadSpawn && !$0.agentClosed }.count
                        if open >= cap.limit {
                            throw DomainError.resourceExhausted("agent limit reached: \(cap.name) = \(cap.limit)")
                        }
                        var next = child.state!
                        next.record.agentClosed = false
                        try await install(child, next, [.putThread(next.record.bumped())])
                        changes.changed(target.id)
                        return Self.reportedStatus(next.record)
                    }
                }
                return ToolResult(output: jsonText(["status": status]), receiver: target.id)
            default:
                // wait_agent runs before the commit (waitForAgents), with no gate held.
                return ToolResult(output: jsonText(["error": "tool '\(name)' is not implemented"]))
            }
        } catch {
            return ToolResult(output: jsonText(["error": "\(error)"]))
        }
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
        return try await store.agentTree(caller.sessionID).first {
            $0.parentID == caller.id && $0.source == .threadSpawn
                && ($0.id == key || $0.taskName == key || $0.taskName?.hasSuffix("/" + key) == true)
        }
    }

    /// Every spawned agent below `caller`, from the stored registry.
    func descendants(of caller: ThreadRecord) async throws -> [ThreadRecord] {
        let tree = try await store.agentTree(caller.sessionID).filter { $0.source == .threadSpawn }
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
    func waitForAgents(caller: ThreadRecord, arguments: String) async -> String {
        let args: ToolArguments.Wait
        do {
            args = try ToolCatalog.definition("wait_agent", runtime: caller.runtime)!.decode(arguments)
        } catch {
            return jsonText(["error": "\(error)"])
        }
        var timeoutMs = settings.agentWaitDefaultMs
        if let asked = args.timeout_ms { timeoutMs = max(0, min(asked, settings.agentWaitMaxMs)) }
        let deadline = ContinuousClock.now + .milliseconds(timeoutMs)
        let names = args.targets
        do {
            while true {
                let children = try await store.agentTree(caller.sessionID).filter { $0.parentID == caller.id && $0.source == .threadSpawn }
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
                let fresh = try await store.agentTree(caller.sessionID).filter { record in awaited.contains { $0.id == record.id } }
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
