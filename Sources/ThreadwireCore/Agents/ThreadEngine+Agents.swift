import Foundation
import Synchronization

/// Child agents: spawning under the agent tree's gate and its caps.
extension ThreadEngine {

    /// Runs `body` holding the agent tree's gate. A tree's gate stays in the
    /// table only while someone holds it or waits for it, so the table does
    /// not grow with every tree the process has seen; a gate is replaced only
    /// when nobody uses it, so the exclusion holds.
    func withTreeGate<T>(_ sessionID: ThreadID, _ body: () async throws -> T) async throws -> T {
        let gate = treeGates.withLock { table -> AsyncGate in
            if let entry = table[sessionID] {
                table[sessionID] = TreeGateEntry(gate: entry.gate, users: entry.users + 1)
                return entry.gate
            }
            let gate = AsyncGate()
            table[sessionID] = TreeGateEntry(gate: gate, users: 1)
            return gate
        }
        defer {
            treeGates.withLock { table in
                guard let entry = table[sessionID] else { return }
                table[sessionID] = entry.users > 1 ? TreeGateEntry(gate: entry.gate, users: entry.users - 1) : nil
            }
        }
        await gate.lock()
        defer { gate.unlock() }
        return try await body()
    }

    /// Agent trees whose gate is in use now (a test checks the table shrinks).
    var treeGatesInUse: Int { treeGates.withLock { $0.count } }

    struct Spawned {
        var view: ThreadView
        var publications: [Publication]
    }

    /// Creates a child that inherits the parent's pinned runtime. Called with
    /// the parent's gate held; the slot is reserved under the tree's gate and
    /// counted from the stored registry, so concurrent spawns anywhere in the
    /// tree (API or tool) can never pass the cap, before or after a restart.
    func spawnChild(
        of parentOwner: ThreadOwner, _ parent: StoredThread, _ request: SpawnRequest, spawningMode: MultiAgentMode?,
        extraSubscriber: ConnectionID?
    ) async throws -> Spawned {
        let parentID = parent.record.id
        guard let parentRuntime = parent.record.runtime else {
            throw DomainError.failedPrecondition(
                "thread \(parentID) has not resolved its multi-agent runtime yet; run a turn first")
        }
        let depth = parent.record.depth + 1
        let session = parent.record.sessionID
        let model = try nonEmpty(request.model, field: "model")
        if !request.review {
            if parentRuntime == .disabled || parent.record.source == .review {
                throw DomainError.failedPrecondition("multi-agent collaboration is disabled for thread \(parentID)")
            }
            if depth > parentOwner.config.maxDepth {
                throw DomainError.failedPrecondition(
                    "agent depth limit reached: a child of thread \(parentID) would have depth \(depth) > agents.max_depth = \(parentOwner.config.maxDepth)")
            }
        }
        let record = try await withTreeGate(session) { () async throws -> ThreadRecord in
            let tree = try await store.agentTree(session).filter { $0.principal == parent.record.principal }
            if !request.review {
                let cap = parentOwner.config.childAgentCap(for: parentRuntime)
                let open = tree.filter { $0.source == .threadSpawn && !$0.agentClosed }.count
                if open >= cap.limit {
                    throw DomainError.resourceExhausted(
                        "agent limit reached: \(cap.limit) concurrent child agents (\(cap.name) = \(cap.limit)) for runtime \(parentRuntime.rawValue)")
                }
            }
            let siblings = tree.filter { $0.parentID == parentID }
            var child = ThreadRecord(
                id: newID(), sessionID: session, source: request.review ? .review : .threadSpawn, depth: depth,
                createdAt: nowMillis(), model: model ?? parent.record.model, cwd: parent.record.cwd)
            child.parentID = parentID
            child.principal = parent.record.principal
            child.configOverrides = parent.record.configOverrides
            child.baseInstructions = parent.record.baseInstructions
            // A child runs its parent's client tools (the tree's clients serve them).
            child.clientTools = parent.record.clientTools
            // A child asks as its parent does (the root's clients answer); they may lower it on the child.
            child.approvalPolicy = parent.record.approvalPolicy
            child.userInputEnabled = parent.record.userInputEnabled
            child.mcpServers = parent.record.mcpServers
            child.nickname = Self.nicknames[siblings.count % Self.nicknames.count]
            // Inherited, never re-resolved: a V2 parent keeps a V2 child whatever the child's model says.
            child.runtime = RuntimeResolver.resolveAtLoad(
                inherited: request.review ? .disabled : parentRuntime, recorded: nil, origin: .new)
            if !request.review { child.agentStatus = .pendingInit }
            if child.runtime == .v2 {
                let prefix = parent.record.taskName ?? "/root"
                let taken = Set(tree.compactMap(\.taskName))
                if let name = request.taskName.flatMap({ $0.isEmpty ? nil : $0 }) {
                    guard !name.contains("/") || name.hasPrefix(prefix + "/") else {
                        throw DomainError.invalidArgument("task_name '\(name)' must be a plain name or a path under \(prefix)/")
                    }
                    let path = name.hasPrefix("/") ? name : prefix + "/" + name
                    guard !taken.contains(path) else {
                        throw DomainError.alreadyExists("task name \(path) is already used in this agent tree; choose another")
                    }
                    child.taskName = path
                } else {
                    var n = siblings.count + 1
                    while taken.contains(prefix + "/task\(n)") { n += 1 }
                    child.taskName = prefix + "/task\(n)"
                }
                // A V2 child takes the spawning turn's effective mode as its selection.
                child.selectedMode = spawningMode
            }
            // thread/started is the child's first event, kept with its creation.
            let (_, kept) = numberEvents([Delivery(event: .threadStarted(ThreadView(stored: StoredThread(record: child, history: [], turns: []),
                                                                                      includeTurns: false)), recipients: [])], record: &child)
            try await commitCreation(child.principal, [.putThread(child)] + kept, fence: parentOwner.fence)
            return child
        }
        // The child joins its parent's agent tree, held under the same lease.
        if let fence = parentOwner.fence { _ = heldTrees.join(fence.tree, record.id) }
        let owner = adopt(StoredThread(record: record, history: [], turns: []), config: parentOwner.config, subscriber: extraSubscriber,
                          fence: parentOwner.fence)
        owner.subscribe(like: parentOwner)
        let view = ThreadView(stored: owner.current, includeTurns: false)
        var publications = [owner.publisher.ticket([Delivery(event: .threadStarted(view), recipients: owner.subscribers,
                                                             threadSequence: record.eventSequence)])]
        if let message = request.message, !message.isEmpty {
            await owner.gate.lock()
            defer { owner.gate.unlock() }
            publications.append(try await beginTurn(owner, TurnRequest(input: [message])).1)
        }
        return Spawned(view: ThreadView(stored: owner.current, includeTurns: false), publications: publications)
    }

    static let nicknames = ["Ada", "Brook", "Cyd", "Dale", "Eli", "Fern", "Gale", "Hale"]
}

func jsonText(_ object: Any) -> String {
    guard let data = try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys]) else { return "{}" }
    return String(decoding: data, as: UTF8.self)
}
