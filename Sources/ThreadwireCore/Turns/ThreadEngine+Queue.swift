import Foundation

/// A thread's durable turn queue: turn/start with when_busy, the
/// thread/queue/* commands, and starting the next queued turn as each turn
/// ends. The queue lives in the thread's record: every change to it is one
/// fenced, versioned commit of the thread, so it survives kill -9 and
/// failover, and two clients queueing at once both land (the owner's gate
/// orders them).
extension ThreadEngine {
    public enum TurnStart: Sendable {
        case started(TurnRecord)
        case queued(QueuedTurn)
    }

    /// turn/start as a client sends it: what to do while a turn runs is `whenBusy`'s.
    public func startOrQueueTurn(_ id: ThreadID, _ request: TurnRequest, whenBusy: WhenBusy,
                                 connection: ConnectionID?) async throws -> Outcome<TurnStart> {
        try await withOwner(id) { owner in
            try checkAcceptsDirectInput(owner)
            if let connection { owner.subscribe(connection) }
            owner.cancelUnload()
            defer { scheduleUnloadIfIdle(owner) }
            // Queued turns go first: an enqueue behind them waits its turn
            // even in the moment between one turn's end and the next's start.
            if whenBusy == .enqueue, owner.current.activeTurn == nil, !owner.current.record.queue.isEmpty {
                let queued = try await enqueue(owner, request)
                startQueuedTurn(id)
                return queued
            }
            if let active = owner.current.activeTurn {
                switch whenBusy {
                case .reject:
                    break  // beginTurn refuses it, as always
                case .enqueue:
                    return try await enqueue(owner, request)
                case .interrupt:
                    let ended = try await endActiveTurn(owner, status: .interrupted, error: nil)
                    let (turn, started) = try await beginTurn(owner, request)
                    return Outcome(.started(turn), publications: [ended, started])
                case .steer:
                    let texts = request.input.filter { !$0.isEmpty }
                    guard !texts.isEmpty else { throw DomainError.invalidArgument("input must contain at least one non-empty text") }
                    let steered = try await steerLocked(owner, expectedTurnID: active.id, texts: texts)
                    return Outcome(.started(owner.current.activeTurn ?? active), carrying: steered)
                }
            }
            let (turn, publication) = try await beginTurn(owner, request)
            return Outcome(.started(turn), publications: [publication])
        }
    }

    private func enqueue(_ owner: ThreadOwner, _ request: TurnRequest) async throws -> Outcome<TurnStart> {
        let texts = request.input.filter { !$0.isEmpty }
        guard !texts.isEmpty else { throw DomainError.invalidArgument("input must contain at least one non-empty text") }
        guard owner.current.record.queue.count < Self.maxQueuedTurns else {
            throw DomainError.resourceExhausted("thread \(owner.id) has \(Self.maxQueuedTurns) queued turns, the most it keeps; wait for one to start")
        }
        var entry = QueuedTurn(id: newID(), input: texts, model: try nonEmpty(request.model, field: "model"), createdAt: nowMillis())
        switch request.mode {
        case .keep: break
        case .clear: entry.clearMode = true
        case let .set(mode): entry.mode = mode.rawValue
        }
        entry.approvalPolicy = request.approvalPolicy
        entry.reasoningEffort = request.reasoningEffort
        entry.reasoningSummary = request.reasoningSummary
        var next = owner.current
        next.record.queue.append(entry)
        let publication = try await commitQueue(owner, next)
        return Outcome(.queued(entry), publications: [publication])
    }

    /// The most turns one thread's queue holds.
    static var maxQueuedTurns: Int { 100 }

    public func queuedTurns(_ id: ThreadID) async throws -> [QueuedTurn] {
        if let snapshot = liveSnapshot(id)?.stored { return snapshot.record.queue }
        return try await withOwner(id) { owner in
            defer { scheduleUnloadIfIdle(owner) }
            return owner.current.record.queue
        }
    }

    public enum QueueChange: Sendable {
        case update(String, input: [String])
        case delete(String)
        case reorder([String])
    }

    /// thread/queue/update, delete and reorder.
    public func changeQueue(_ id: ThreadID, _ change: QueueChange) async throws -> Outcome<[QueuedTurn]> {
        try await withOwner(id) { owner in
            defer { scheduleUnloadIfIdle(owner) }
            var next = owner.current
            var queue = next.record.queue
            func index(_ queued: String) throws -> Int {
                guard let index = queue.firstIndex(where: { $0.id == queued }) else {
                    throw DomainError.notFound("queued turn \(queued) is not in thread \(id)'s queue (started or deleted already?)")
                }
                return index
            }
            switch change {
            case let .update(queued, input):
                let texts = input.filter { !$0.isEmpty }
                guard !texts.isEmpty else { throw DomainError.invalidArgument("input must contain at least one non-empty text") }
                queue[try index(queued)].input = texts
            case let .delete(queued):
                queue.remove(at: try index(queued))
            case let .reorder(ids):
                guard ids.count == queue.count, Set(ids) == Set(queue.map(\.id)), Set(ids).count == ids.count else {
                    throw DomainError.failedPrecondition(
                        "queued_ids must name every queued turn of thread \(id) once (\(queue.count) now); read the queue again")
                }
                queue = ids.map { queued in queue.first { $0.id == queued }! }
            }
            next.record.queue = queue
            let publication = try await commitQueue(owner, next)
            return Outcome(queue, publications: [publication])
        }
    }

    private func commitQueue(_ owner: ThreadOwner, _ next: StoredThread) async throws -> Publication {
        var next = next
        next.record.updatedAt = nowMillis()
        let deliveries = try await install(owner, next, [.putThread(next.record.bumped())], events: [
            Delivery(event: .queueUpdated(owner.id, next.record.queue), recipients: owner.subscribers)])
        return owner.publisher.ticket(deliveries)
    }

    /// Starts the next queued turn once the thread is idle (a command of its
    /// own, after the turn that ended has committed). A queued turn that
    /// cannot start (the thread archived, its input refused) leaves the
    /// queue, so the rest go on.
    func startQueuedTurn(_ id: ThreadID) {
        tasks.spawn { [self] in
            _ = try? await withOwner(id) { owner in
                defer { scheduleUnloadIfIdle(owner) }
                guard !stopping.load(ordering: .acquiring), owner.current.activeTurn == nil,
                      let entry = owner.current.record.queue.first else { return }
                var request = TurnRequest(input: entry.input)
                request.model = entry.model
                if entry.clearMode == true { request.mode = .clear } else if let mode = entry.mode.flatMap(MultiAgentMode.init(rawValue:)) { request.mode = .set(mode) }
                request.approvalPolicy = entry.approvalPolicy
                request.reasoningEffort = entry.reasoningEffort
                request.reasoningSummary = entry.reasoningSummary
                request.dequeue = entry.id
                do {
                    let (_, publication) = try await beginTurn(owner, request)
                    publication.publish()
                } catch let error as DomainError where error.refusesQueuedTurn {
                    // Its queue/updated notification tells the clients it left.
                    var next = owner.current
                    next.record.queue.removeAll { $0.id == entry.id }
                    try await commitQueue(owner, next).publish()
                    if !next.record.queue.isEmpty { startQueuedTurn(id) }
                } catch {
                    // The store or the lease failed, not the turn: it stays
                    // queued (dropping it could lose an acknowledged enqueue
                    // while PostgreSQL restarts, the likely cause of a chaos
                    // run's lost one) and is tried again; a thread unloaded
                    // meanwhile starts it on load.
                    tasks.spawn { [self] in
                        try? await Task.sleep(for: .seconds(1))
                        startQueuedTurn(id)
                    }
                }
            }
        }
    }
}

extension DomainError {
    /// A refusal of the queued turn itself (archived thread, input refused):
    /// it leaves the queue. Unavailable, aborted and internal errors are the
    /// store's or the lease's, and a later try may succeed.
    var refusesQueuedTurn: Bool {
        switch self {
        case .unavailable, .aborted, .internal: false
        default: true
        }
    }
}
