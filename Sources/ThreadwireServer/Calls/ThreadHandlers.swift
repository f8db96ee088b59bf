import ThreadwireContract
import ThreadwireCore
import ThreadwireWire

/// thread/* and agent/spawn. The dispatcher has required and authorized the
/// thread each names (`call.target()`) before these run.
enum ThreadHandlers {
    @Sendable static func start(_ p: Wire.ThreadStartParams, _ call: Call) async throws -> Outcome<Wire.Response.Result> {
        var request = ThreadEngine.StartRequest()
        request.model = p.model
        request.cwd = p.cwd
        request.name = p.name
        request.baseInstructions = p.baseInstructions
        request.config = try p.config.enumerated().map { index, entry in
            KeyValuePair(key: try MethodTable.required(entry.key, "config[\(index)].key"), value: entry.value ?? "")
        }
        if let mode = p.multiAgentMode {
            guard let selected = MultiAgentMode(wire: mode) else {
                throw RequestError(.invalidArgument, "multi_agent_mode must be EXPLICIT_REQUEST_ONLY or PROACTIVE (omit it for no selection)")
            }
            request.mode = selected
        }
        switch p.source {
        case nil, .unspecified?, .appServer?: break
        case .review?: request.review = true
        case let other?:
            throw RequestError(.invalidArgument, "source must be APP_SERVER or REVIEW, got \(other.protoValueName)")
        }
        request.principal = call.principal
        request.clientTools = p.clientTools.map(ToolSpec.init(wire:))
        request.approvalPolicy = ApprovalPolicy(wire: p.approvalPolicy)
        request.userInput = p.userInput ?? false
        request.reasoningEffort = p.reasoningEffort
        request.reasoningSummary = p.reasoningSummary
        request.pauseAfterTools = p.pauseAfterTools ?? false
        // Repeated fields have no presence: an empty list means "the defaults".
        request.mcpServers = p.mcpServers.isEmpty ? nil : p.mcpServers
        let outcome = try await call.engine.startThread(request, connection: call.connection.id)
        let base = call.baseInstructions(outcome.value.record)
        return Outcome(.threadStart(outcome.value.lifecycleResult(baseInstructions: base)), carrying: outcome)
    }

    @Sendable static func resume(_ p: Wire.ThreadResumeParams, _ call: Call) async throws -> Outcome<Wire.Response.Result> {
        try await lifecycle(call, wrap: { .threadResume($0) }) {
            try await call.engine.resumeThread(try call.target(), model: p.model, excludeTurns: p.excludeTurns ?? false,
                                               after: p.afterThreadSequence.map { Int64(clamping: $0) }, connection: call.connection.id)
        }
    }

    @Sendable static func subscribe(_ p: Wire.ThreadSubscribeParams, _ call: Call) async throws -> Outcome<Wire.Response.Result> {
        let outcome = try await call.engine.subscribeThread(try call.target(), after: p.afterThreadSequence.map { Int64(clamping: $0) },
                                                            connection: call.connection.id)
        let view = outcome.value
        let thread = view.wire(baseInstructions: call.baseInstructions(view.record))
        return Outcome(.threadSubscribe(Wire.ThreadSubscribeResult(thread: thread, settings: view.settings.wire)), carrying: outcome)
    }

    @Sendable static func fork(_ p: Wire.ThreadForkParams, _ call: Call) async throws -> Outcome<Wire.Response.Result> {
        try await lifecycle(call, wrap: { .threadFork($0) }) {
            let position: ThreadEngine.ForkPosition? = switch p.position {
            case let .atTurnId(turn)?: .at(turn)
            case let .beforeTurnId(turn)?: .before(turn)
            case nil: nil
            }
            return try await call.engine.forkThread(try call.target(), model: p.model, excludeTurns: p.excludeTurns ?? false,
                                                    position: position, connection: call.connection.id)
        }
    }

    /// A resumed or forked thread's answer, its turns paged to fit one frame.
    private static func lifecycle(_ call: Call, wrap: (Wire.ThreadLifecycleResult) -> Wire.Response.Result,
                                  _ command: () async throws -> Outcome<ThreadView>) async throws -> Outcome<Wire.Response.Result> {
        let outcome = try await command()
        let base = call.baseInstructions(outcome.value.record)
        let result = TurnPaging.fitLifecycle(outcome.value, baseInstructions: base, limits: call.server.limits, wrap: wrap)
        return Outcome(result, carrying: outcome)
    }

    @Sendable static func read(_ p: Wire.ThreadReadParams, _ call: Call) async throws -> Outcome<Wire.Response.Result> {
        let includeTurns = p.includeTurns ?? false
        let view = try await call.engine.readThread(
            try call.target(), includeTurns: includeTurns,
            includeModelRequests: includeTurns && (p.includeModelRequests ?? false),
            turnsLimit: try TurnPaging.limit(p.turnsLimit, field: "turns_limit", default: 100))
        return Outcome(readResult(view.keepingRolledBack(p.includeRolledBack ?? false), includeTurns: includeTurns, call))
    }

    /// A loaded thread's snapshot needs no suspension (the dispatcher has
    /// authorized it from the same snapshot).
    @Sendable static func readInline(_ p: Wire.ThreadReadParams, _ call: Call) throws -> InlineAnswer? {
        let includeTurns = p.includeTurns ?? false
        let turnsLimit = try TurnPaging.limit(p.turnsLimit, field: "turns_limit", default: 100)
        guard let published = call.engine.published(try call.target()) else { return nil }
        // An operator's read names the principal: not the snapshot's shared encoding.
        guard includeTurns || call.isOperator else {
            // The common read depends only on the snapshot: encoded once per commit.
            return .encoded(published.memo.value {
                Wire.EncodedResult(readResult(published.view(includeTurns: false, includeModelRequests: false), includeTurns: false, call))
            })
        }
        let view = published.view(includeTurns: includeTurns, includeModelRequests: includeTurns && (p.includeModelRequests ?? false),
                                  turnsLimit: turnsLimit)
        return .result(readResult(view.keepingRolledBack(p.includeRolledBack ?? false), includeTurns: includeTurns, call))
    }

    static func readResult(_ view: ThreadView, includeTurns: Bool, _ call: Call) -> Wire.Response.Result {
        let base = call.baseInstructions(view.record)
        var thread = view.wire(baseInstructions: base)
        if call.isOperator { thread.principal = view.record.principal }
        guard includeTurns else {
            // Nothing to page: the common read stays one encoding.
            return .threadRead(Wire.ThreadReadResult(thread: thread, settings: view.settings.wire, clientTools: view.record.clientTools.map(\.wire)))
        }
        let turns = thread.turns
        thread.turns = []
        var result = Wire.ThreadReadResult(thread: thread, settings: view.settings.wire, clientTools: view.record.clientTools.map(\.wire))
        let page = TurnPaging.newestThatFit(turns, records: view.turns ?? [], olderLeftOut: view.hasOlderTurns,
                                            around: .threadRead(result), limits: call.server.limits)
        result.thread?.turns = page.turns
        result.turnsNextCursor = page.nextCursor
        return .threadRead(result)
    }

    @Sendable static func turnsList(_ p: Wire.ThreadTurnsListParams, _ call: Call) async throws -> Outcome<Wire.Response.Result> {
        let descending = p.sortDirection != .ascending
        let limit = try TurnPaging.limit(p.limit, field: "limit", default: 25)
        let page = try await call.engine.listTurns(try call.target(), cursor: p.cursor, limit: limit, descending: descending)
        let fitted = try TurnPaging.inOrderThatFit(page.turns, more: page.more, limits: call.server.limits)
        return Outcome(.threadTurnsList(Wire.ThreadTurnsListResult(data: fitted.turns, nextCursor: fitted.nextCursor)))
    }

    @Sendable static func loadedList(_ p: Wire.ThreadLoadedListParams, _ call: Call) throws -> InlineAnswer? {
        let limit = try TurnPaging.limit(p.limit, field: "limit", default: 100)
        let after: ThreadID?
        if let cursor = p.cursor {
            guard cursor.hasPrefix("loaded:") else { throw RequestError(.invalidArgument, "cursor '\(cursor.prefix(60))' is not a cursor this server returned") }
            after = String(cursor.dropFirst("loaded:".count))
        } else {
            after = nil
        }
        let everyone = !call.server.authenticates || call.isOperator
        let page = call.engine.loadedThreads(principal: everyone ? nil : call.principal, after: after, limit: limit)
        return .result(.threadLoadedList(Wire.ThreadLoadedListResult(data: page.ids, nextCursor: page.more ? page.ids.last.map { "loaded:\($0)" } : nil)))
    }

    /// thread/items/list: items across turns, a few turns read at a time
    /// until the page is full. The cursor names the next item's turn and place.
    @Sendable static func itemsList(_ p: Wire.ThreadItemsListParams, _ call: Call) async throws -> Outcome<Wire.Response.Result> {
        let limit = try TurnPaging.limit(p.limit, field: "limit", default: 50)
        let descending = p.sortDirection == .descending
        let start = try p.cursor.map(ItemCursor.decode)
        // Turn cursors are exclusive: the cursor's own turn is read again.
        var turnCursor: String? = start.flatMap { start in
            descending ? TurnCursor.encode(sequence: start.turn + 1) : start.turn > 0 ? TurnCursor.encode(sequence: start.turn - 1) : nil
        }
        var page: [Wire.TurnItem] = []
        var positions: [(turn: Int, item: Int)] = []
        let id = try call.target()
        collecting: while true {
            let turns = try await call.engine.listTurns(id, cursor: turnCursor, limit: 16, descending: descending)
            for turn in turns.turns {
                turnCursor = TurnCursor.encode(sequence: turn.sequence)
                if turn.rolledBack && p.includeRolledBack != true { continue }
                let indices = descending ? Array(turn.items.indices.reversed()) : Array(turn.items.indices)
                for index in indices {
                    if let start {
                        let before = descending ? (turn.sequence, index) > (start.turn, start.item) : (turn.sequence, index) < (start.turn, start.item)
                        if before { continue }
                    }
                    positions.append((turn.sequence, index))
                    // One more than the page: its position is the next cursor.
                    if positions.count > limit { break collecting }
                    page.append(Wire.TurnItem(turnId: turn.id, item: turn.items[index].wire))
                }
            }
            if !turns.more { break }
        }
        // A page of large items is cut where the frame would overflow.
        let room = TurnPaging.budget(around: .threadItemsList(Wire.ThreadItemsListResult(nextCursor: TurnPaging.cursorRoom)), limits: call.server.limits)
        let fitted = TurnPaging.prefixThatFits(page, room: room)
        guard fitted > 0 || page.isEmpty else {
            throw RequestError(.resourceExhausted, "an item of thread \(id) is over max_frame_bytes (\(call.server.limits.maxFrameBytes)) even alone")
        }
        let next = fitted < positions.count ? ItemCursor.encode(positions[fitted]) : nil
        return Outcome(.threadItemsList(Wire.ThreadItemsListResult(data: Array(page.prefix(fitted)), nextCursor: next)))
    }

    @Sendable static func list(_ p: Wire.ThreadListParams, _ call: Call) async throws -> Outcome<Wire.Response.Result> {
        var query = ThreadListQuery()
        if let limit = p.limit {
            guard (1...1000).contains(limit) else { throw RequestError(.invalidArgument, "limit must be from 1 to 1000, got \(limit)") }
            query.limit = Int(limit)
        }
        query.sortKey = p.sortKey == .updatedAt ? .updatedAt : .createdAt
        query.ascending = p.sortDirection == .ascending
        query.cursor = p.cursor
        query.parentID = p.parentThreadId
        query.archived = p.archived ?? false
        if let term = p.searchTerm {
            guard term.count >= ThreadListQuery.minimumSearchTermLength else {
                throw RequestError(.invalidArgument,
                                   "search_term must be at least \(ThreadListQuery.minimumSearchTermLength) characters (a trigram index serves it), got \(term.count)")
            }
            guard term.count <= 200 else { throw RequestError(.invalidArgument, "search_term must be at most 200 characters, got \(term.count)") }
            query.searchTerm = term
        }
        if call.server.authenticates { query.principal = call.principal }
        let everyone = p.allPrincipals == true
        if everyone {
            guard call.isOperator else {
                throw RequestError(.permissionDenied, "all_principals is for operators (a tokens file line 'principal token operator')")
            }
            query.principal = nil
            call.services.logger.info("operator list", metadata: ["tw.operator": "\(call.principal)", "tw.method": "thread/list"])
        }
        let page = try await call.engine.listThreads(query)
        let threads = page.threads.map { view in
            var thread = view.wire(baseInstructions: "")
            if everyone { thread.principal = view.record.principal }
            return thread
        }
        // A page of large threads is cut where the frame would overflow.
        let room = TurnPaging.budget(around: .threadList(Wire.ThreadListResult(nextCursor: TurnPaging.cursorRoom)), limits: call.server.limits)
        let fitted = TurnPaging.prefixThatFits(threads, room: room)
        guard fitted < threads.count else {
            return Outcome(.threadList(Wire.ThreadListResult(data: threads, nextCursor: page.nextCursor)))
        }
        guard fitted > 0 else {
            throw RequestError(.resourceExhausted, "thread \(page.threads[0].record.id) is over max_frame_bytes (\(call.server.limits.maxFrameBytes)) even alone")
        }
        return Outcome(.threadList(Wire.ThreadListResult(
            data: Array(threads.prefix(fitted)), nextCursor: query.cursor(after: page.threads[fitted - 1].record))))
    }

    @Sendable static func compactStart(_ p: Wire.ThreadCompactStartParams, _ call: Call) async throws -> Outcome<Wire.Response.Result> {
        let outcome = try await call.engine.startCompaction(try call.target(), connection: call.connection.id)
        return Outcome(.threadCompactStart(Wire.ThreadCompactStartResult(turn: outcome.value.wire())), carrying: outcome)
    }

    @Sendable static func rollback(_ p: Wire.ThreadRollbackParams, _ call: Call) async throws -> Outcome<Wire.Response.Result> {
        guard let count = p.numTurns else { throw RequestError(.invalidArgument, "num_turns is required") }
        let outcome = try await call.engine.rollback(try call.target(), numTurns: Int(count))
        return Outcome(.threadRollback(Wire.ThreadRollbackResult(turnIds: outcome.value)), carrying: outcome)
    }

    @Sendable static func revert(_ p: Wire.ThreadRevertParams, _ call: Call) async throws -> Outcome<Wire.Response.Result> {
        let boundary: ThreadEngine.RevertBoundary = switch p.boundary {
        case let .beforeTurnId(turn)?: .before(turn)
        case let .afterTurnId(turn)?: .after(turn)
        case nil: throw RequestError(.invalidArgument, "before_turn_id or after_turn_id is required")
        }
        let outcome = try await call.engine.revert(try call.target(), boundary)
        return Outcome(.threadRevert(Wire.ThreadRevertResult(turnIds: outcome.value)), carrying: outcome)
    }

    @Sendable static func delete(_ p: Wire.ThreadDeleteParams, _ call: Call) async throws -> Outcome<Wire.Response.Result> {
        let outcome = try await call.engine.deleteThread(try call.target(), force: p.force ?? false)
        return Outcome(.threadDelete(Wire.ThreadDeleteResult(threadIds: outcome.value)), carrying: outcome)
    }

    @Sendable static func setName(_ p: Wire.ThreadNameSetParams, _ call: Call) async throws -> Outcome<Wire.Response.Result> {
        guard let name = p.name else { throw RequestError(.invalidArgument, "name is required (an empty name clears it)") }
        let outcome = try await call.engine.setName(try call.target(), name)
        return Outcome(.threadNameSet(Wire.ThreadNameSetResult()), carrying: outcome)
    }

    @Sendable static func archive(_ p: Wire.ThreadArchiveParams, _ call: Call) async throws -> Outcome<Wire.Response.Result> {
        let outcome = try await call.engine.setArchived(try call.target(), archived: true)
        return Outcome(.threadArchive(Wire.ThreadArchiveResult()), carrying: outcome)
    }

    @Sendable static func unarchive(_ p: Wire.ThreadUnarchiveParams, _ call: Call) async throws -> Outcome<Wire.Response.Result> {
        let outcome = try await call.engine.setArchived(try call.target(), archived: false)
        return Outcome(.threadUnarchive(Wire.ThreadUnarchiveResult(thread: outcome.value.wire(baseInstructions: ""))), carrying: outcome)
    }

    @Sendable static func unsubscribe(_ p: Wire.ThreadUnsubscribeParams, _ call: Call) async throws -> Outcome<Wire.Response.Result> {
        let was = try await call.engine.unsubscribe(try call.target(), connection: call.connection.id)
        return Outcome(.threadUnsubscribe(Wire.ThreadUnsubscribeResult(wasSubscribed: was)))
    }

    @Sendable static func updateSettings(_ p: Wire.ThreadSettingsUpdateParams, _ call: Call) async throws -> Outcome<Wire.Response.Result> {
        var update = ThreadEngine.SettingsUpdate()
        update.model = p.model
        update.cwd = p.cwd
        switch p.multiAgentModeUpdate {
        case nil: update.mode = .keep
        case let .multiAgentMode(mode)?: update.mode = try MethodTable.modeUpdate(.multiAgentMode(mode), field: "thread/settings/update")
        case let .clearMultiAgentMode(clear)?: update.mode = try MethodTable.modeUpdate(.clearMultiAgentMode(clear), field: "thread/settings/update")
        }
        update.approvalPolicy = ApprovalPolicy(wire: p.approvalPolicy)
        update.userInput = p.userInput
        update.reasoningEffort = p.reasoningEffort
        update.reasoningSummary = p.reasoningSummary
        update.pauseAfterTools = p.pauseAfterTools
        let outcome = try await call.engine.updateSettings(try call.target(), update)
        return Outcome(.threadSettingsUpdate(Wire.ThreadSettingsUpdateResult(
            settings: outcome.value.0.wire, changed: outcome.value.1)), carrying: outcome)
    }

    @Sendable static func updateTools(_ p: Wire.ThreadToolsUpdateParams, _ call: Call) async throws -> Outcome<Wire.Response.Result> {
        let tools = try await call.engine.updateClientTools(try call.target(), p.clientTools.map(ToolSpec.init(wire:)))
        return Outcome(.threadToolsUpdate(Wire.ThreadToolsUpdateResult(clientTools: tools.map(\.wire))))
    }

    @Sendable static func spawnAgent(_ p: Wire.AgentSpawnParams, _ call: Call) async throws -> Outcome<Wire.Response.Result> {
        var request = ThreadEngine.SpawnRequest()
        request.message = p.message
        request.model = p.model
        request.taskName = p.taskName
        request.review = p.review ?? false
        let outcome = try await call.engine.spawnAgent(parentID: try call.target(), request, connection: call.connection.id)
        let base = call.baseInstructions(outcome.value.record)
        return Outcome(.agentSpawn(outcome.value.lifecycleResult(baseInstructions: base)), carrying: outcome)
    }
}

/// turn/start and turn/interrupt.
enum TurnHandlers {
    @Sendable static func start(_ p: Wire.TurnStartParams, _ call: Call) async throws -> Outcome<Wire.Response.Result> {
        var request = ThreadEngine.TurnRequest(input: try inputTexts(p.input))
        request.model = p.model
        request.mode = try MethodTable.modeUpdate(p.multiAgentModeUpdate, field: "turn/start")
        request.reasoningEffort = p.reasoningEffort
        request.reasoningSummary = p.reasoningSummary
        request.approvalPolicy = ApprovalPolicy(wire: p.approvalPolicy)
        let whenBusy: WhenBusy = switch p.whenBusy {
        case nil, .unspecified?, .reject?: .reject
        case .enqueue?: .enqueue
        case .interrupt?: .interrupt
        case .steer?: .steer
        }
        let outcome = try await call.engine.startOrQueueTurn(try call.target(), request, whenBusy: whenBusy, connection: call.connection.id)
        switch outcome.value {
        case let .started(turn):
            return Outcome(.turnStart(Wire.TurnStartResult(turn: turn.wire())), carrying: outcome)
        case let .queued(entry):
            return Outcome(.turnStart(Wire.TurnStartResult(queued: entry.wire)), carrying: outcome)
        }
    }

    @Sendable static func queueList(_ p: Wire.ThreadQueueListParams, _ call: Call) async throws -> Outcome<Wire.Response.Result> {
        let queue = try await call.engine.queuedTurns(try call.target())
        return Outcome(.threadQueueList(Wire.ThreadQueueListResult(data: queue.map(\.wire))))
    }

    @Sendable static func queueUpdate(_ p: Wire.ThreadQueueUpdateParams, _ call: Call) async throws -> Outcome<Wire.Response.Result> {
        let queued = try MethodTable.required(p.queuedId, "queued_id")
        let outcome = try await call.engine.changeQueue(try call.target(), .update(queued, input: try inputTexts(p.input)))
        return Outcome(.threadQueueUpdate(Wire.ThreadQueueUpdateResult(data: outcome.value.map(\.wire))), carrying: outcome)
    }

    @Sendable static func queueDelete(_ p: Wire.ThreadQueueDeleteParams, _ call: Call) async throws -> Outcome<Wire.Response.Result> {
        let queued = try MethodTable.required(p.queuedId, "queued_id")
        let outcome = try await call.engine.changeQueue(try call.target(), .delete(queued))
        return Outcome(.threadQueueDelete(Wire.ThreadQueueDeleteResult(data: outcome.value.map(\.wire))), carrying: outcome)
    }

    @Sendable static func queueReorder(_ p: Wire.ThreadQueueReorderParams, _ call: Call) async throws -> Outcome<Wire.Response.Result> {
        let outcome = try await call.engine.changeQueue(try call.target(), .reorder(p.queuedIds))
        return Outcome(.threadQueueReorder(Wire.ThreadQueueReorderResult(data: outcome.value.map(\.wire))), carrying: outcome)
    }

    @Sendable static func interrupt(_ p: Wire.TurnInterruptParams, _ call: Call) async throws -> Outcome<Wire.Response.Result> {
        let turnID = try MethodTable.required(p.turnId, "turn_id")
        let outcome = try await call.engine.interruptTurn(try call.target(), turnID: turnID)
        return Outcome(.turnInterrupt(Wire.TurnInterruptResult()), carrying: outcome)
    }

    @Sendable static func continueTurn(_ p: Wire.TurnContinueParams, _ call: Call) async throws -> Outcome<Wire.Response.Result> {
        let turnID = try MethodTable.required(p.turnId, "turn_id")
        let outcome = try await call.engine.continueTurn(try call.target(), turnID: turnID)
        return Outcome(.turnContinue(Wire.TurnContinueResult()), carrying: outcome)
    }

    @Sendable static func steer(_ p: Wire.TurnSteerParams, _ call: Call) async throws -> Outcome<Wire.Response.Result> {
        let expected = try MethodTable.required(p.expectedTurnId, "expected_turn_id")
        let outcome = try await call.engine.steer(try call.target(), expectedTurnID: expected, input: try inputTexts(p.input))
        return Outcome(.turnSteer(Wire.TurnSteerResult(turnId: outcome.value.0, item: outcome.value.1.wire)), carrying: outcome)
    }

    /// turn/start's and turn/steer's input as text.
    static func inputTexts(_ input: [Wire.UserInput]) throws -> [String] {
        try input.enumerated().map { index, input in
            switch input.content {
            case let .text(text)?: return text
            case let .imageUrl(url)?: return "[image: \(url)]"
            case nil: throw RequestError(.invalidArgument, "input[\(index)] has no content (set text or image_url)")
            }
        }
    }
}

/// thread/items/list cursors: opaque to clients, an item's turn sequence and
/// place in that turn to the server.
enum ItemCursor {
    static func encode(_ position: (turn: Int, item: Int)) -> String { "item:\(position.turn):\(position.item)" }

    static func decode(_ cursor: String) throws -> (turn: Int, item: Int) {
        let parts = cursor.split(separator: ":")
        guard parts.count == 3, parts[0] == "item", let turn = Int(parts[1]), let item = Int(parts[2]), turn >= 0, item >= 0 else {
            throw RequestError(.invalidArgument, "cursor '\(cursor.prefix(60))' is not an item cursor this server returned")
        }
        return (turn, item)
    }
}
