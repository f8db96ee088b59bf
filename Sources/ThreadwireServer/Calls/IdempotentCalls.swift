// Over 400 lines: a keyed change's claim, replay and stored answer, and how
// each outcome of the first attempt is remembered, are one protocol.
import Crypto
import Foundation
import Logging
import Synchronization
import ThreadwireContract
import ThreadwireCore
import ThreadwireWire

/// Request.idempotency_key: a change sent again after a lost answer is
/// applied once, and the repeat gets the first attempt's answer.
///
/// The key is written in the change's own transaction (the engine adds the
/// claim to the first commit of the request's change, `IdempotentCommand`),
/// so a change is never durable without its key. So is the answer, where
/// the change alone tells it (`answerFromChange`: settings and tool
/// updates, turn starts, interrupts, names, archiving). Other answers (a
/// started thread's, which reads its model catalog and instructions) are
/// added to the key as they are sent, not waited for; until stored, a
/// repeat here is answered from memory. A repeat finds the key and is answered from it; one
/// that arrives while the first attempt runs here waits for it; one that
/// races the first on another instance loses at the key's insert (the
/// store refuses its whole commit) and then waits for the winner's answer.
/// An instance that died between the change and recording its answer
/// leaves a claim without one: the repeat is then answered from what the
/// claim names, as it is now (`rebuild`).
final class IdempotentCalls: Sendable {
    struct Settings: Sendable {
        /// Keys are kept at least this long.
        var retention: Duration = .seconds(24 * 3600)
        /// How long a repeat waits for the answer of a claim recorded
        /// without one (another instance may be about to record it) before
        /// rebuilding it: a lease, when several instances share the store.
        var answerWait: Duration = .zero
    }

    private let store: any ThreadStore
    private let settings: Settings
    private let logger: Logger
    /// Keyed requests running in this process, so a repeat waits for them.
    private let running = Mutex<[IdempotencyKey: Running]>([:])
    private let writes = TaskTracker()

    init(store: any ThreadStore, settings: Settings, logger: Logger) {
        self.store = store
        self.settings = settings
        self.logger = logger
    }

    /// Refusals a repeat gets again: what the request asked cannot be done
    /// (as it was asked, by this principal). Others (UNAVAILABLE,
    /// DEADLINE_EXCEEDED, ABORTED, RESOURCE_EXHAUSTED, CANCELLED, INTERNAL)
    /// may pass, so the repeat is carried out.
    static let rememberedRefusals: Set<StatusCode> = [
        .invalidArgument, .notFound, .alreadyExists, .permissionDenied, .failedPrecondition, .outOfRange, .unimplemented,
    ]

    /// Methods whose answer subscribes the connection: a repeat, whose
    /// connection is usually a new one, is subscribed too.
    static let subscribing: Set<String> = [
        "thread/start", "thread/resume", "thread/fork", "agent/spawn", "turn/start", "thread/compact/start",
    ]

    /// `execute` as the request's change, once per key. Not keyed, or not
    /// a mutation: just `execute`.
    func run(_ admitted: AdmittedCall, call: Call, execute: @Sendable () async throws -> Outcome<Wire.Response.Result>) async throws -> CallOutput {
        guard admitted.spec.mutates, let raw = admitted.request.idempotencyKey else { return .local(try await execute()) }
        try IdempotencyKey.validate(raw)
        // Cut off from the store, the key could not be looked up before the store's timeout.
        try call.engine.throwIfCutOff()
        let key = IdempotencyKey(principal: call.principal, key: raw)
        let request = Fingerprinted(admitted)
        while true {
            let (entry, first) = running.withLock { table -> (Running, Bool) in
                if let entry = table[key] { return (entry, false) }
                let entry = Running(method: request.method, fingerprint: request.fingerprint)
                table[key] = entry
                return (entry, true)
            }
            guard first else {
                try request.check(against: entry.method, entry.fingerprint, key: key)
                guard let answer = await entry.answer() else { continue }  // it ended with nothing remembered: go again
                return try await replay(answer, claim: nil, admitted, call: call)
            }
            let carried: Carried
            do {
                carried = try await carryOut(key, request, admitted, call: call, execute: execute)
            } catch {
                finish(key, entry, nil)
                throw error
            }
            // Repeats waiting here have their answer at once; the key stays
            // in `running` until the answer is stored, so a repeat meanwhile
            // is answered from memory rather than rebuilt.
            entry.finish(carried.answer)
            if let remembered = carried.remember {
                writes.spawn { [self] in
                    await remember(remembered.claim, remembered.answer)
                    finish(key, entry, carried.answer)
                }
            } else {
                finish(key, entry, carried.answer)
            }
            return try carried.output.get()
        }
    }

    private func finish(_ key: IdempotencyKey, _ entry: Running, _ answer: Wire.Response?) {
        running.withLock { table in if table[key] === entry { table[key] = nil } }
        entry.finish(answer)
    }

    /// What carrying a keyed request out came to: its output (or error),
    /// the answer repeats get (nil: none, they are carried out), and the
    /// answer to store with the key (not waited for: the change's own
    /// commit holds the key, and a repeat that finds no answer rebuilds it).
    struct Carried {
        var output: Result<CallOutput, any Error>
        var answer: Wire.Response?
        var remember: (claim: IdempotencyClaim, answer: Wire.Response)?
    }

    /// Answers still being stored (the drain waits for them).
    func waitForWrites() async { await writes.waitForAll(timeout: .seconds(10)) }

    /// Methods carried out before their key is looked up: they change one
    /// thread row in memory only once its commit, which carries the key,
    /// succeeds, and nothing else before it. A repeat's commit then fails
    /// at the key and writes nothing; a repeat that commits nothing (the
    /// change is there already) or is refused looks the key up after, and a
    /// stored answer wins. The first attempt, the common case, saves the
    /// store read a lookup costs.
    static let optimistic: Set<String> = ["thread/settings/update", "thread/tools/update", "thread/name/set"]

    /// Looks the key up (after, for `optimistic` methods); carries the
    /// request out if it is new.
    private func carryOut(_ key: IdempotencyKey, _ request: Fingerprinted, _ admitted: AdmittedCall, call: Call,
                          execute: @Sendable () async throws -> Outcome<Wire.Response.Result>) async throws -> Carried {
        let optimistic = Self.optimistic.contains(request.method)
        if !optimistic, let record = try await store.idempotencyRecord(key) {
            return try await answerFromRecord(record, request, key: key, admitted, call: call)
        }
        let command = IdempotentCommand(key: key, method: request.method, fingerprint: request.fingerprint, target: call.thread,
                                        answer: Self.answerFromChange(request.method, target: call.thread))
        defer { command.close() }
        let outcome: Outcome<Wire.Response.Result>
        do {
            outcome = try await IdempotentCommand.$current.withValue(command) { try await execute() }
            if optimistic, command.claim == nil, let record = try await store.idempotencyRecord(key) {
                outcome.publish()  // a change that changed nothing: no notification, its turn in the thread's order
                return try await answerFromRecord(record, request, key: key, admitted, call: call)
            }
        } catch is IdempotencyKeyTaken {
            // A repeat elsewhere committed first; this attempt changed nothing.
            guard let record = try await store.idempotencyRecord(key) else {
                throw RequestError(.aborted, "a request with idempotency key \(key) was applied and then forgotten; repeat it")
            }
            return try await answerFromRecord(record, request, key: key, admitted, call: call)
        } catch let elsewhere as OwnedElsewhere {
            throw elsewhere  // relayed: the owner keeps the key
        } catch {
            if optimistic, command.claim == nil, let record = try await store.idempotencyRecord(key) {
                return try await answerFromRecord(record, request, key: key, admitted, call: call)
            }
            let refusal = RequestError(error)
            guard Self.rememberedRefusals.contains(refusal.code) || command.claim != nil else { throw error }
            let answer = Wire.Response(code: refusal.code.rawValue, message: refusal.message)
            return Carried(output: .failure(error), answer: answer, remember: (command.claim ?? request.claim(key), answer))
        }
        let answer = Wire.Response(code: StatusCode.ok.rawValue, result: outcome.value)
        FaultInjection.point("idempotency.after-change")
        if let stored = command.storedAnswer {
            // Stored with the change. They agree by construction; should
            // they not, repeats get what the change's commit stored.
            if stored != answer.serializedBytes() {
                logger.error("an idempotent request's answer differs from the one stored with its change", metadata: [
                    "tw.method": "\(request.method)"])
            }
            return Carried(output: .success(.local(outcome)), answer: answer, remember: nil)
        }
        return Carried(output: .success(.local(outcome)), answer: answer, remember: (command.claim ?? request.claim(key), answer))
    }

    /// The answer of `method` told from its change's operations, for the
    /// change's own transaction: the same bytes its handler answers with
    /// (IdempotencyTests compare the two). Nil for methods whose answer
    /// needs more than the change.
    static func answerFromChange(_ method: String, target: ThreadID?) -> IdempotentCommand.Answer? {
        guard let target else { return nil }
        @Sendable func ok(_ result: Wire.Response.Result) -> [UInt8] {
            Wire.Response(code: StatusCode.ok.rawValue, result: result).serializedBytes()
        }
        @Sendable func thread(_ operations: [StoreOperation]) -> ThreadRecord? {
            for case let .putThread(record) in operations where record.id == target { return record }
            return nil
        }
        switch method {
        case "thread/settings/update":
            // Only a change that changed something commits.
            return { thread($0).map { ok(.threadSettingsUpdate(Wire.ThreadSettingsUpdateResult(
                settings: ThreadSettingsView(record: $0).wire, changed: true))) } }
        case "thread/tools/update":
            return { thread($0).map { ok(.threadToolsUpdate(Wire.ThreadToolsUpdateResult(clientTools: $0.clientTools.map(\.wire)))) } }
        case "turn/start":
            return { operations in
                for case let .putTurn(turn) in operations where turn.threadID == target {
                    return ok(.turnStart(Wire.TurnStartResult(turn: turn.wire())))
                }
                return nil
            }
        default:
            guard let fixed = fixedResult(method) else { return nil }
            let bytes = ok(fixed)
            return { _ in bytes }
        }
    }

    /// The results that do not depend on what the change made.
    private static func fixedResult(_ method: String) -> Wire.Response.Result? {
        switch method {
        case "turn/interrupt": .turnInterrupt(Wire.TurnInterruptResult())
        case "turn/continue": .turnContinue(Wire.TurnContinueResult())
        case "thread/name/set": .threadNameSet(Wire.ThreadNameSetResult())
        case "thread/archive": .threadArchive(Wire.ThreadArchiveResult())
        default: nil
        }
    }

    /// Records a request's answer with its key. If that fails the change
    /// stands: a repeat rebuilds the answer from the claim.
    private func remember(_ claim: IdempotencyClaim, _ answer: Wire.Response) async {
        do {
            try await store.commit([.recordIdempotentResponse(claim, response: answer.serializedBytes())])
        } catch {
            logger.warning("an idempotent request's answer was not recorded; a repeat will rebuild it", metadata: [
                "tw.method": "\(claim.method)", "tw.error": "\(error)"])
        }
    }

    private func answerFromRecord(_ record: IdempotencyRecord, _ request: Fingerprinted, key: IdempotencyKey, _ admitted: AdmittedCall,
                                  call: Call) async throws -> Carried {
        try request.check(against: record.claim.method, record.claim.fingerprint, key: key)
        if let bytes = record.response {
            let answer = try Wire.Response(serializedBytes: bytes)
            return Carried(output: .success(try await replay(answer, claim: record.claim, admitted, call: call)), answer: answer)
        }
        if let answer = try await awaitAnswer(key) {
            return Carried(output: .success(try await replay(answer, claim: record.claim, admitted, call: call)), answer: answer)
        }
        let rebuilt = try await rebuild(record.claim, admitted, call: call)
        return Carried(output: .success(try await replay(rebuilt, claim: record.claim, admitted, call: call)), answer: rebuilt,
                       remember: (record.claim, rebuilt))
    }

    /// A claim without an answer: waits (up to `answerWait`) for another
    /// instance to record it.
    private func awaitAnswer(_ key: IdempotencyKey) async throws -> Wire.Response? {
        let deadline = ContinuousClock.now + settings.answerWait
        var pause = Duration.milliseconds(20)
        while ContinuousClock.now < deadline {
            try await Task.sleep(for: min(pause, deadline - .now))
            pause = min(pause * 2, .milliseconds(500))
            if let bytes = try await store.idempotencyRecord(key)?.response { return try Wire.Response(serializedBytes: bytes) }
        }
        return nil
    }

    /// The first attempt's answer under this request's id. A repeat of a
    /// method that subscribes subscribes its own connection to the same
    /// thread (if another instance owns it, the request is relayed there,
    /// where it is answered the same way).
    private func replay(_ answer: Wire.Response, claim: IdempotencyClaim?, _ admitted: AdmittedCall, call: Call) async throws -> CallOutput {
        var response = answer
        response.id = admitted.request.id
        var subscription = Outcome<Void>(())
        if response.code ?? 0 == StatusCode.ok.rawValue, Self.subscribing.contains(admitted.spec.name),
           let thread = Self.subscribedThread(response.result) ?? claim?.threadID ?? call.thread {
            let resumed = try await call.engine.resumeThread(thread, model: nil, excludeTurns: true, connection: call.connection.id)
            subscription = Outcome((), carrying: resumed)
        }
        return .replayed(response, subscription)
    }

    private static func subscribedThread(_ result: Wire.Response.Result?) -> ThreadID? {
        switch result {
        case let .threadStart(r)?, let .threadFork(r)?, let .agentSpawn(r)?, let .threadResume(r)?: r.thread?.id
        default: nil
        }
    }

    /// The answer of a change whose process died before recording it (or
    /// whose commit went unconfirmed), from what its claim names as it is
    /// now. Nothing is carried out again: the change was made once, and
    /// made again it could undo what others changed since (a settings
    /// update repeated after another one).
    private func rebuild(_ claim: IdempotencyClaim, _ admitted: AdmittedCall, call: Call) async throws -> Wire.Response {
        func ok(_ result: Wire.Response.Result) -> Wire.Response { Wire.Response(code: StatusCode.ok.rawValue, result: result) }
        guard let thread = claim.threadID ?? call.thread else { return lost(claim) }
        let method = admitted.spec.name
        switch method {
        case "thread/start", "thread/fork", "agent/spawn", "thread/resume":
            // The thread as it is, subscribed: what thread/resume answers, with no model change.
            guard let resume = MethodTable.methods["thread/resume"] else { return lost(claim) }
            let resumed = try await resume.run(.threadResume(Wire.ThreadResumeParams(threadId: thread, excludeTurns: true)),
                                               Call(connection: call.connection, services: call.services, thread: thread))
            guard case let .threadResume(lifecycle) = resumed.value else { return lost(claim) }
            switch method {
            case "thread/start": return ok(.threadStart(lifecycle))
            case "thread/fork": return ok(.threadFork(lifecycle))
            case "agent/spawn": return ok(.agentSpawn(lifecycle))
            default: return ok(.threadResume(lifecycle))
            }
        case "turn/start", "thread/compact/start":
            guard let turnID = claim.turnIDs.first else { return lost(claim) }
            let page = try await call.engine.listTurns(thread, cursor: nil, limit: 100, descending: true)
            guard let turn = page.turns.first(where: { $0.id == turnID }) else { return lost(claim) }
            return ok(method == "turn/start" ? .turnStart(Wire.TurnStartResult(turn: turn.wire()))
                                             : .threadCompactStart(Wire.ThreadCompactStartResult(turn: turn.wire())))
        case "turn/steer":
            guard let turnID = claim.turnIDs.first else { return lost(claim) }
            return ok(.turnSteer(Wire.TurnSteerResult(turnId: turnID)))
        case "thread/rollback":
            return ok(.threadRollback(Wire.ThreadRollbackResult(turnIds: claim.turnIDs)))
        case "thread/unsubscribe":
            return ok(.threadUnsubscribe(Wire.ThreadUnsubscribeResult(wasSubscribed: true)))
        case "thread/unarchive", "thread/settings/update", "thread/tools/update":
            // The thread's state now (later changes included): a read.
            let view = try await call.engine.readThread(thread, includeTurns: false, includeModelRequests: false)
            switch method {
            case "thread/unarchive": return ok(.threadUnarchive(Wire.ThreadUnarchiveResult(thread: view.wire(baseInstructions: ""))))
            case "thread/settings/update":
                // The first attempt's commit is the claim's: it changed something.
                return ok(.threadSettingsUpdate(Wire.ThreadSettingsUpdateResult(settings: view.settings.wire, changed: true)))
            default: return ok(.threadToolsUpdate(Wire.ThreadToolsUpdateResult(clientTools: view.record.clientTools.map(\.wire))))
            }
        default:
            return Self.fixedResult(method).map(ok) ?? lost(claim)
        }
    }

    private func lost(_ claim: IdempotencyClaim) -> Wire.Response {
        Wire.Response(code: StatusCode.internal.rawValue, message: """
            the first request with idempotency key '\(claim.key.key)' (\(claim.method)) was applied, but what it made can no longer \
            be found to answer it again; read the thread
            """)
    }

    /// Forgets keys older than the retention window, now and then, until cancelled.
    func purgeOldKeys() async {
        let period = min(settings.retention / 10, .seconds(600))
        while !Task.isCancelled {
            try? await Task.sleep(for: period)
            let (seconds, attoseconds) = settings.retention.components
            let cutoff = nowMillis() - seconds * 1000 - attoseconds / 1_000_000_000_000_000
            do {
                let purged = try await store.purgeIdempotencyRecords(createdBefore: cutoff)
                if purged > 0 { logger.debug("forgot old idempotency keys", metadata: ["tw.keys": "\(purged)"]) }
            } catch where !Task.isCancelled {
                logger.warning("old idempotency keys not purged", metadata: ["tw.error": "\(error)"])
            } catch {}
        }
    }
}

/// A keyed request's method and the digest of its params.
private struct Fingerprinted {
    let method: String
    let fingerprint: [UInt8]

    init(_ admitted: AdmittedCall) {
        method = admitted.spec.name
        // The params re-encoded (protobuf-c writes fields in number order):
        // the same request gives the same bytes whatever client sent it.
        var hasher = SHA256()
        hasher.update(data: Array(method.utf8) + [0])
        hasher.update(data: Wire.Request(params: admitted.params).serializedBytes())
        fingerprint = Array(hasher.finalize())
    }

    func check(against method: String, _ fingerprint: [UInt8], key: IdempotencyKey) throws {
        guard method == self.method else {
            throw RequestError(.invalidArgument, "idempotency key \(key) was used for \(method); a key names one request (this is \(self.method))")
        }
        guard fingerprint == self.fingerprint else {
            throw RequestError(.invalidArgument, "idempotency key \(key) was used for a \(method) request with other params; a key names one request")
        }
    }

    /// The key of a request that changed nothing (its answer is all it stores).
    func claim(_ key: IdempotencyKey) -> IdempotencyClaim {
        IdempotencyClaim(key: key, method: method, fingerprint: fingerprint, createdAtMillis: nowMillis())
    }
}

/// A keyed request running here: repeats wait for its answer.
private final class Running: Sendable {
    let method: String
    let fingerprint: [UInt8]
    private let state = Mutex<(done: Bool, answer: Wire.Response?, waiters: [CheckedContinuation<Wire.Response?, Never>])>(
        (false, nil, []))

    init(method: String, fingerprint: [UInt8]) {
        self.method = method
        self.fingerprint = fingerprint
    }

    /// Its answer once it ends; nil if it ended with none remembered.
    func answer() async -> Wire.Response? {
        await withCheckedContinuation { continuation in
            let ready = state.withLock { state -> (Bool, Wire.Response?) in
                guard state.done else {
                    state.waiters.append(continuation)
                    return (false, nil)
                }
                return (true, state.answer)
            }
            if ready.0 { continuation.resume(returning: ready.1) }
        }
    }

    func finish(_ answer: Wire.Response?) {
        let waiters = state.withLock { state -> [CheckedContinuation<Wire.Response?, Never>] in
            state.done = true
            state.answer = answer
            defer { state.waiters = [] }
            return state.waiters
        }
        for waiter in waiters { waiter.resume(returning: answer) }
    }
}
