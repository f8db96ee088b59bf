// Over 400 lines on purpose: the one path of every request (admission, rate,
// authorization, relay, deadline, answer, status mapping) reads top to bottom here.
import Logging
import Tracing
import ThreadwireContract
import ThreadwireCore
import ThreadwireWire

/// A request that passed admission: its table entry and params, and when it
/// arrived. A class: it goes from admission through the queue to its answer,
/// and each copy of a struct retained every field.
final class AdmittedCall: Sendable {
    let request: Wire.Request
    let spec: MethodSpec
    let params: Wire.Request.Params
    let received: ContinuousClock.Instant
    /// The request's server span (tracing on), ended with its answer.
    let span: (any Span)?
    /// Whether `span` is set: read per request without copying the existential out.
    let traced: Bool
    /// Its principal's request tokens are being claimed from the store that
    /// instances share: it suspends until they come (RequestGate).
    let awaitsTokens: Bool

    init(request: Wire.Request, spec: MethodSpec, params: Wire.Request.Params, received: ContinuousClock.Instant, span: (any Span)?,
         awaitsTokens: Bool = false) {
        self.request = request
        self.spec = spec
        self.params = params
        self.received = received
        self.span = span
        traced = span != nil
        self.awaitsTokens = awaitsTokens
    }
}

/// A request waiting for its connection's request task: admitted already
/// when it came to the dispatcher with nothing ahead of it, otherwise
/// admitted when its turn comes (a pipelined request after initialize must
/// see the connection initialized).
struct QueuedRequest: Sendable {
    var request: Wire.Request
    var admitted: AdmittedCall?
    var bytes: Int
    var received: ContinuousClock.Instant
}

/// What a call produced: a local outcome, whose events are published once
/// the answer is sent, or the answer of the instance that owns the thread,
/// sent as it is.
enum CallOutput: Sendable {
    case local(Outcome<Wire.Response.Result>)
    case relayed(Wire.Response)
    /// A repeat of a keyed request: the first attempt's answer, and what
    /// subscribing this connection to its thread publishes.
    case replayed(Wire.Response, Outcome<Void>)

    /// Events to publish once the answer is sent.
    func publish() {
        switch self {
        case let .local(outcome): outcome.publish()
        case let .replayed(_, subscription): subscription.publish()
        case .relayed: break
        }
    }
}

/// The one path of every request, inline or suspending: admission, the
/// thread the request names and its authorization, locating the owner
/// (here or another instance), the deadline, metrics, logging and the
/// error → status mapping each happen once, here.
struct CallDispatcher: Sendable {
    let services: ServerServices
    let logger: Logger

    enum Admission {
        case admitted(AdmittedCall)
        case refused(RequestError, method: String)
    }

    /// Admission's checks passed, before anything is allocated for the call:
    /// a request answered inline and untraced never becomes an `AdmittedCall`.
    enum Checked {
        case passed(MethodSpec, Wire.Request.Params, awaitsTokens: Bool)
        case refused(RequestError, method: String)
    }

    enum Immediate {
        /// The answer is written (not flushed: the read batch flushes it).
        case answered
        /// The call needs to suspend: queue it, already admitted.
        case suspend(AdmittedCall)
    }

    /// The checks every request passes before its handler runs.
    func admit(_ request: Wire.Request, received: ContinuousClock.Instant, connection: any CallSession) -> Admission {
        switch check(request, connection: connection) {
        case let .refused(error, method):
            return .refused(error, method: method)
        case let .passed(spec, params, awaitsTokens):
            return .admitted(admitted(request, spec, params, received: received, awaitsTokens: awaitsTokens, connection: connection))
        }
    }

    private func admitted(_ request: Wire.Request, _ spec: MethodSpec, _ params: Wire.Request.Params, received: ContinuousClock.Instant,
                          awaitsTokens: Bool, connection: any CallSession) -> AdmittedCall {
        let span = ThreadTracing.enabled ? RequestTracing.start(request, spec: spec, params: params, connection: connection) : nil
        return AdmittedCall(request: request, spec: spec, params: params, received: received, span: span, awaitsTokens: awaitsTokens)
    }

    /// Admission's checks: the method, the handshake, the principal's rate
    /// and the drain.
    func check(_ request: Wire.Request, connection: any CallSession) -> Checked {
        guard let params = request.params else {
            return .refused(RequestError(.unimplemented, "the request names no method this server implements"), method: "unknown")
        }
        guard let spec = MethodTable.spec(for: params) else {
            let method = params.methodName
            return .refused(RequestError(.unimplemented, "method \(method) is not implemented"), method: method)
        }
        if let refusal = connection.admits(requiresHandshake: spec.requiresHandshake, method: spec.name) {
            return .refused(refusal, method: spec.name)
        }
        // A relayed request was counted where its client sent it.
        var awaitsTokens = false
        if services.requestGate.isLimiting, spec.requiresHandshake, !connection.isPeer {
            switch services.requestGate.admit(connection.principal) {
            case .admitted: break
            case let .refused(refusal): return .refused(RequestError(refusal), method: spec.name)
            case .wait: awaitsTokens = true
            }
        }
        // A connection opened as the drain began is not marked yet.
        if services.info.draining(), spec.requiresHandshake {
            return .refused(RequestError(.unavailable, "the server is shutting down"), method: spec.name)
        }
        return .passed(spec, params, awaitsTokens: awaitsTokens)
    }

    // MARK: Answers of server requests

    /// A client's answer to a server request, on the event loop that read
    /// it. Only a request sent to this connection can be answered from it;
    /// the first answer counts. Whoever answered hears
    /// server_request/resolved once the answer is recorded; an answer not
    /// taken hears it at once, with the reason.
    func answer(_ answer: Wire.ServerRequestAnswer, connection: Connection) {
        guard connection.isInitialized else {
            connection.send(Wire.Response(code: StatusCode.failedPrecondition.rawValue,
                                          message: "a server request's answer before initialize: this connection was sent no request"))
            return
        }
        guard let id = answer.id, !id.isEmpty else {
            connection.send(Wire.Response(code: StatusCode.invalidArgument.rawValue,
                                          message: "a server request's answer needs the id of the request it answers"))
            return
        }
        guard let threadID = connection.offeredThread(id) else {
            connection.refuseAnswer(id, threadID: nil, AnswerRefusal(nil,
                "request \(id) was not sent to this connection or is no longer pending; this answer changed nothing"))
            return
        }
        if let fault = InputBounds.fault(answer) {
            // The request stays pending: a shorter answer may follow.
            connection.refuseAnswer(id, threadID: threadID, AnswerRefusal(.pending, "\(fault); this answer changed nothing"))
            return
        }
        do {
            try services.engine.answerServerRequest(threadID: threadID, requestID: id, try ServerRequestAnswer(wire: answer))
            services.metrics.serverRequestAnswers.increment()
        } catch {
            connection.refuseAnswer(id, threadID: threadID, error)
        }
    }

    // MARK: Without suspension

    /// On the event loop that read `request`, with nothing of its connection
    /// queued (so answers keep the order of requests): answered here when
    /// that needs no suspension (health/check, initialize, a loaded thread's
    /// thread/read, any refusal).
    func answerNow(_ request: Wire.Request, received: ContinuousClock.Instant, connection: Connection) -> Immediate {
        let spec: MethodSpec, params: Wire.Request.Params
        switch check(request, connection: connection) {
        case let .refused(error, method):
            respond(connection, id: request.id, error: error, method: method, received: received, flush: false)
            return .answered
        case let .passed(passedSpec, passedParams, awaitsTokens):
            // Only a deadline needs a task of its own; a traced call runs
            // within its span, which the class carries.
            guard request.timeoutMs == nil, !awaitsTokens, passedSpec.runInline != nil, !ThreadTracing.enabled else {
                let admitted = admitted(request, passedSpec, passedParams, received: received, awaitsTokens: awaitsTokens, connection: connection)
                return answerNowAdmitted(admitted, connection: connection)
            }
            spec = passedSpec
            params = passedParams
        }
        do {
            guard let call = try callWithoutSuspending(spec, params, connection: connection),
                  let answer = try spec.runInline?(params, call) else {
                return .suspend(admitted(request, spec, params, received: received, awaitsTokens: false, connection: connection))
            }
            services.metrics.request(spec, code: .ok, duration: .now - received)
            if logger.logLevel <= .debug {
                RequestTracing.finish(nil, method: spec.name, id: request.id, thread: spec.thread?.read(params), code: .ok, message: nil,
                                      received: received, logger: logger)
            }
            send(answer, id: request.id, connection: connection)
        } catch {
            fail(id: request.id, spec: spec, params: params, received: received, span: nil, error: error, connection: connection, flush: false)
        }
        return .answered
    }

    /// `answerNow` for a call that became an `AdmittedCall`: traced, with a
    /// deadline, waiting for its principal's tokens, or with no inline handler.
    private func answerNowAdmitted(_ admitted: AdmittedCall, connection: Connection) -> Immediate {
        guard admitted.request.timeoutMs == nil, !admitted.awaitsTokens, let runInline = admitted.spec.runInline else { return .suspend(admitted) }
        do {
            let answered: InlineAnswer?
            if admitted.traced, let span = admitted.span {
                answered = try ServiceContext.withValue(span.context) { try answerInline(admitted, runInline, connection: connection) }
            } else {
                // Called straight, not through a closure: one would be a
                // context allocated and this dispatcher copied into it per request.
                answered = try answerInline(admitted, runInline, connection: connection)
            }
            guard let answer = answered else { return .suspend(admitted) }
            services.metrics.request(admitted.spec, code: .ok, duration: .now - admitted.received)
            RequestTracing.finish(admitted, code: .ok, logger: logger)
            send(answer, id: admitted.request.id, connection: connection)
        } catch {
            fail(admitted, error: error, connection: connection, flush: false)
        }
        return .answered
    }

    /// Written, not flushed: the read batch flushes it.
    private func send(_ answer: InlineAnswer, id: UInt64?, connection: Connection) {
        switch answer {
        case let .result(result):
            connection.send(Wire.Response(id: id, code: StatusCode.ok.rawValue, result: result), flush: false)
        case let .encoded(encoded):
            connection.send(id: id, encoded: encoded, flush: false)
        }
    }

    private func answerInline(_ admitted: AdmittedCall, _ runInline: MethodSpec.RunInline, connection: Connection) throws -> InlineAnswer? {
        guard let call = try callWithoutSuspending(admitted, connection: connection) else { return nil }
        return try runInline(admitted.params, call)
    }

    /// The call's thread, required and authorized from the loaded snapshot;
    /// nil when that needs the store (the call then suspends).
    func callWithoutSuspending(_ admitted: AdmittedCall, connection: any CallSession) throws -> Call? {
        try callWithoutSuspending(admitted.spec, admitted.params, connection: connection)
    }

    /// As above, from admission's parts.
    func callWithoutSuspending(_ spec: MethodSpec, _ params: Wire.Request.Params, connection: any CallSession) throws -> Call? {
        guard let field = spec.thread else { return Call(connection: connection, services: services, thread: nil) }
        let id = try MethodTable.required(field.read(params), field.name)
        if services.info.authenticates {
            guard let published = services.engine.published(id) else { return nil }
            guard published.principal == connection.principal || operatorReads(spec, id, of: published.principal, connection) else {
                throw Self.notFound(id)
            }
        }
        return Call(connection: connection, services: services, thread: id)
    }

    /// An operator's read of another principal's thread: allowed, and logged
    /// with both principals (what an operator looks at is on record).
    private func operatorReads(_ spec: MethodSpec, _ id: ThreadID, of owner: Principal?, _ connection: any CallSession) -> Bool {
        guard spec.operatorReads, services.info.authenticator.isOperator(connection.principal) else { return false }
        logger.info("operator read", metadata: ["tw.operator": "\(connection.principal)", "tw.method": "\(spec.name)",
                                               "tw.thread": "\(id)", "tw.owner": "\(owner ?? "?")"])
        return true
    }

    // MARK: Suspending

    /// Serves one connection's queued requests one at a time, in arrival order.
    func serve(_ requests: AsyncStream<QueuedRequest>, connection: Connection) async {
        for await queued in requests {
            // A client that does not read its answers stops here: no request
            // of it starts until the answers already written are taken.
            await connection.waitUntilWritable()
            // In a child task: the calls' async frames are tens of KiB, and a
            // task keeps the largest stack it has used, so a connection that
            // made one stored change and then sat idle held that memory for
            // its lifetime (about 40 KiB each; issue 28's idle subscribers).
            await withDiscardingTaskGroup { group in
                group.addTask { await self.answer(queued, connection: connection) }
            }
            // Counted out on the event loop, behind this request's writes
            // (written from another thread, they wait in the connection's
            // outbox, whose drain task is queued before this one): a request
            // answered inline after it cannot overtake them.
            let eventLoop = connection.channel.eventLoop
            if eventLoop.inEventLoop {
                connection.finished(bytes: queued.bytes)
            } else {
                eventLoop.execute { connection.finished(bytes: queued.bytes) }
            }
        }
    }

    func answer(_ queued: QueuedRequest, connection: Connection) async {
        let admitted: AdmittedCall
        if let already = queued.admitted {
            admitted = already
        } else {
            switch admit(queued.request, received: queued.received, connection: connection) {
            case let .refused(error, method):
                respond(connection, id: queued.request.id, error: error, method: method, received: queued.received)
                return
            case let .admitted(call):
                admitted = call
            }
        }
        if admitted.awaitsTokens, let refusal = await services.requestGate.admitAfterClaim(connection.principal) {
            fail(admitted, error: RequestError(refusal), connection: connection)
            return
        }
        let output: CallOutput
        do {
            if let span = admitted.span {
                output = try await ServiceContext.withValue(span.context) { try await run(admitted, connection: connection) }
            } else {
                output = try await run(admitted, connection: connection)
            }
        } catch {
            fail(admitted, error: error, connection: connection)
            return
        }
        complete(admitted, output, connection: connection)
    }

    /// Runs the handler here or relays to the thread's owner, within the
    /// request's deadline (past it: DEADLINE_EXCEEDED, and a change goes on).
    func run(_ admitted: AdmittedCall, connection: any CallSession) async throws -> CallOutput {
        let work: @Sendable () async throws -> CallOutput = { [self] in
            let local: @Sendable () async throws -> CallOutput = {
                let call = try await authorizedCall(admitted, connection: connection)
                return try await services.idempotency.run(admitted, call: call) {
                    guard ThreadTracing.enabled else { return try await admitted.spec.run(admitted.params, call) }
                    return try await ThreadTracing.span("engine \(admitted.spec.name)", attributes: call.thread.map {
                        ["threadwire.command": .string(admitted.spec.name), "threadwire.thread.id": .string($0)]
                    } ?? ["threadwire.command": .string(admitted.spec.name)]) { span in
                        return try await admitted.spec.run(admitted.params, call)
                    }
                }
            }
            guard services.info.relays else { return try await local() }
            return try await RelayToOwner.run(admitted, connection: connection, services: services, local: local)
        }
        guard let timeout = admitted.request.timeoutMs else { return try await work() }
        // Unstructured, so it does not inherit this task's executor: given it.
        let task = Task(executorPreference: TaskTracker.inheritedExecutor) { try await work() }
        guard let output = try await firstOf(task, timeoutMs: timeout) else {
            if admitted.spec.mutates {
                // The change may still complete; its events and follow-up still happen.
                services.tasks.spawn { (try? await task.value)?.publish() }
            } else {
                task.cancel()
            }
            throw RequestError(.deadlineExceeded, "\(admitted.spec.name) did not finish within \(timeout) ms")
        }
        return output
    }

    /// The call's thread, required and checked against the principal.
    /// Tenant isolation: a thread of another principal is NOT_FOUND, with
    /// the very message a missing thread gets, so ids cannot be probed.
    /// Owners never change, so the check cannot go stale before the handler
    /// runs. A thread whose instance is known is not looked up here: the
    /// command goes straight there, and the owner checks the principal.
    private func authorizedCall(_ admitted: AdmittedCall, connection: any CallSession) async throws -> Call {
        guard let field = admitted.spec.thread else { return call(admitted, thread: nil, connection: connection) }
        let id = try MethodTable.required(field.read(admitted.params), field.name)
        if services.info.authenticates, !services.engine.isKnownElsewhere(id) {
            let owner = try await services.engine.principal(of: id)
            guard owner == connection.principal || owner != nil && operatorReads(admitted.spec, id, of: owner, connection) else {
                throw Self.notFound(id)
            }
        }
        return call(admitted, thread: id, connection: connection)
    }

    private func call(_ admitted: AdmittedCall, thread: ThreadID?, connection: any CallSession) -> Call {
        Call(connection: connection, services: services, thread: thread)
    }

    private static func notFound(_ id: ThreadID) -> DomainError { .notFound("thread \(id) not found") }

    // MARK: Answers

    private func complete(_ admitted: AdmittedCall, _ output: CallOutput, connection: Connection) {
        let method = admitted.spec.name
        let id = admitted.request.id
        switch output {
        case var .relayed(response):
            response.id = id
            let code = response.code.flatMap(StatusCode.init(rawValue:)) ?? .unknown
            services.metrics.request(admitted.spec, code: code, duration: .now - admitted.received)
            services.metrics.forwarded(method: method, code: code, duration: .now - admitted.received)
            RequestTracing.finish(admitted, code: code, message: response.message, logger: logger)
            connection.send(response)
        case let .local(outcome):
            // Counted before it is sent: a client holding its answer finds it in /metrics.
            services.metrics.request(admitted.spec, code: .ok, duration: .now - admitted.received)
            RequestTracing.finish(admitted, code: .ok, logger: logger)
            // On the loop the response would leave at once and the change's
            // notifications to this same connection (a client that watches
            // the thread it changes) in a second write: held back, they leave
            // together, the response first. Off the loop both wait in the
            // outbox and leave in one write anyway.
            let onLoop = connection.eventLoop.inEventLoop
            connection.send(Wire.Response(id: id, code: StatusCode.ok.rawValue, result: outcome.value), flush: !onLoop)
            recordCreated(outcome.value, requestID: id, connection: connection)
            outcome.publish()
            if onLoop { connection.flushOutbox() }
        case let .replayed(response, subscription):
            let code = response.code.flatMap(StatusCode.init(rawValue:)) ?? .unknown
            services.metrics.request(admitted.spec, code: code, duration: .now - admitted.received)
            services.metrics.idempotentReplays.increment()
            RequestTracing.finish(admitted, code: code, message: response.message, logger: logger)
            connection.send(response)
            if let result = response.result { recordCreated(result, requestID: id, connection: connection) }
            subscription.publish()
        }
    }

    /// A capture notes which thread or turn a request created, so a replay
    /// can map later references to its own.
    private func recordCreated(_ result: Wire.Response.Result, requestID: UInt64?, connection: Connection) {
        guard let recorder = services.recorder, let requestID else { return }
        switch result {
        case let .threadStart(created), let .threadFork(created), let .agentSpawn(created):
            if let thread = created.thread?.id { recorder.recordCreated(connection: connection.id, requestID: requestID, createdID: thread) }
        case let .turnStart(started):
            if let turn = started.turn?.id { recorder.recordCreated(connection: connection.id, requestID: requestID, createdID: turn) }
        default: break
        }
    }

    private func fail(_ admitted: AdmittedCall, error: any Error, connection: Connection, flush: Bool = true) {
        fail(id: admitted.request.id, spec: admitted.spec, params: admitted.params, received: admitted.received, span: admitted.span,
             error: error, connection: connection, flush: flush)
    }

    private func fail(id: UInt64?, spec: MethodSpec, params: Wire.Request.Params, received: ContinuousClock.Instant, span: (any Span)?,
                      error: any Error, connection: Connection, flush: Bool) {
        let mapped = RequestError(error)
        if mapped.code == .internal {
            logger.error("request failed", metadata: [
                "tw.request.id": "\(id ?? 0)", "tw.command": "\(spec.name)", "tw.error": "\(error)"])
        }
        respond(connection, id: id, error: mapped, method: spec.name, received: received, flush: flush,
                span: span, thread: spec.thread?.read(params))
    }

    /// `flush: false` only on the event loop within a read batch.
    func respond(_ connection: Connection, id: UInt64?, error: RequestError, method: String,
                 received: ContinuousClock.Instant, flush: Bool = true, span: (any Span)? = nil, thread: String? = nil) {
        services.metrics.request(method: method, code: error.code, duration: .now - received)
        RequestTracing.finish(span, method: method, id: id, thread: thread, code: error.code, message: error.message,
                              received: received, logger: logger)
        let response = Wire.Response(id: id, code: error.code.rawValue, message: error.message)
        guard error.code != .unauthenticated else {
            // A failed authentication ends the connection: no second guess on it.
            services.metrics.serverClosed(reason: .unauthenticated)
            services.logger.notice("authentication failed; closing", metadata: [
                "tw.connection.id": "\(connection.id)", "tw.peer": "\(connection.peerDescription)"])
            connection.sendThenClose(response)
            return
        }
        connection.send(response, flush: flush)
    }
}

/// The task's value, or nil if the timeout passes first. Returns at the
/// timeout even if the task never ends, and leaves the task running (a
/// change may still complete). Core's one deadline helper underneath.
func firstOf<T: Sendable>(_ task: Task<T, any Error>, timeoutMs: UInt32) async throws -> T? {
    do {
        return try await withDeadline(.milliseconds(Int(timeoutMs)), timeoutError: { RequestDeadlinePassed() }) { try await task.value }
    } catch is RequestDeadlinePassed {
        return nil
    }
}

private struct RequestDeadlinePassed: Error {}
