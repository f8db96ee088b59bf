import Foundation

/// The engine's side of calls from the server to a client (the turn's side
/// is `TurnRunner+ClientCalls.swift`): who is asked, answers taken, tree
/// approvals, client tools and MCP servers as a thread's settings.
extension ThreadEngine {
    /// Who is asked: the thread's subscribers and its tree root's.
    func requestRecipients(_ owner: ThreadOwner) -> [ConnectionID] {
        let root = owner.current.record.sessionID
        guard root != owner.id, let rootOwner = directory.existing(root) else { return owner.participants }
        return Array(Set(owner.participants).union(rootOwner.participants))
    }

    /// server_request/resolved is a kept event of the thread: every
    /// subscriber hears it (as it would in a replay), and so does whoever
    /// was sent the request.
    func resolutionRecipients(_ owner: ThreadOwner) -> [ConnectionID] {
        Array(Set(owner.subscribers).union(requestRecipients(owner)))
    }


    /// Records that a client approved `tool` for the rest of root's agent tree.
    func grantForTree(root: ThreadID, tool: String) async {
        _ = try? await withOwner(root) { rootOwner in
            defer { scheduleUnloadIfIdle(rootOwner) }
            guard !rootOwner.current.record.treeApprovals.contains(tool) else { return }
            var next = rootOwner.current
            next.record.treeApprovals.append(tool)
            try await install(rootOwner, next, [.putThread(next.record.bumped())])
        }
    }

    /// A client's answer to request `requestID` of thread `threadID`. The
    /// first answer counts; the turn records it (and the answering
    /// connection hears server_request/resolved) once it is committed.
    public func answerServerRequest(threadID: ThreadID, requestID: String, _ answer: ServerRequestAnswer) throws(AnswerRefusal) {
        if let expected = pendingAnswers.capability(requestID), !answer.fits(expected) {
            throw AnswerRefusal(.pending, "request \(requestID) is \(expected.method) and this answer's result is for another method; it still waits for an answer")
        }
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
            guard let index = turn.items.firstIndex(where: { $0.id == request.kind.itemID }) else { continue }
            turn.items[index].status = .failed
            turn.items[index].toolOutput = jsonText(["error": reason])
        }
        turn.pendingRequests = []
        turn.deferredOutputs = []
        return abandoned
    }

    /// model/list: the catalog, and the default model.
    public var modelCatalog: (entries: [ModelCatalog.Entry], defaultModel: String) {
        (settings.catalog.entries, settings.defaultModel)
    }

    /// mcp_server/list: the servers `principal` may use.
    public func toolServerStatuses(for principal: Principal) -> [ToolServerStatus] {
        (toolServers?.statuses(principal: principal) ?? []).filter { toolServers?.allows($0.name, principal: principal) == true }
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
