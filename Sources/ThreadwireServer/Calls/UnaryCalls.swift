import Logging
import Tracing
public import ThreadwireCore
public import ThreadwireWire

/// The call layer for transports that carry one call per exchange (gRPC's
/// unary methods): the same dispatcher as the frame protocol (admission,
/// rate, authorization, relay, deadline, idempotency, metrics, tracing and
/// the status mapping), with the caller authenticated by the call's own
/// metadata instead of a connection's initialize.
public struct UnaryCalls: Sendable {
    let dispatcher: CallDispatcher

    /// What the transport learned about the caller.
    public struct Caller: Sendable {
        /// `authorization: Bearer TOKEN`.
        public var bearerToken: String?
        /// The principal a verified client certificate names (mutual TLS).
        public var certificatePrincipal: Principal?
        /// For logs: where the call came from.
        public var peer: String

        public init(bearerToken: String? = nil, certificatePrincipal: Principal? = nil, peer: String) {
            self.bearerToken = bearerToken
            self.certificatePrincipal = certificatePrincipal
            self.peer = peer
        }
    }

    /// A call's answer: its result (perhaps encoded before), or the status
    /// it failed with.
    public enum Answer: Sendable {
        case result(Wire.Response.Result)
        case encoded(Wire.EncodedResult)
        case failed(code: UInt32, message: String)
    }

    /// The server is shutting down (gRPC health turns NOT_SERVING).
    public var draining: Bool { dispatcher.services.info.draining() }

    /// Ready for calls: not draining, and the store commits.
    public var serving: Bool { !draining && dispatcher.services.info.storeHealthy() }

    /// Whether this server authenticates its callers.
    public var authenticates: Bool { dispatcher.services.info.authenticates }

    /// Carries out one request for `caller`. The request's id is not used.
    public func call(_ request: Wire.Request, caller: Caller) async -> Answer {
        let received = ContinuousClock.now
        let services = dispatcher.services
        let method = request.params?.methodName ?? "unknown"
        let needsPrincipal = request.params.flatMap(MethodTable.spec(for:))?.requiresHandshake ?? true
        let principal: Principal?
        do {
            principal = try authenticate(caller, required: needsPrincipal)
        } catch {
            return failed(RequestError(error), method: method, received: received)
        }
        let session = UnarySession(principal: principal ?? .standalone, certificatePrincipal: principal, peerDescription: caller.peer)
        defer { session.finished() }
        let admitted: AdmittedCall
        switch dispatcher.admit(request, received: received, connection: session) {
        case let .refused(error, method):
            return failed(error, method: method, received: received)
        case let .admitted(call):
            admitted = call
        }
        if admitted.awaitsTokens, let refusal = await services.requestGate.admitAfterClaim(session.principal) {
            return failed(RequestError(refusal), admitted)
        }
        do {
            if request.timeoutMs == nil, !admitted.awaitsTokens, let runInline = admitted.spec.runInline,
               let call = try dispatcher.callWithoutSuspending(admitted, connection: session),
               let inline = try withSpan(admitted, { try runInline(admitted.params, call) }) {
                succeeded(admitted)
                switch inline {
                case let .result(result): return .result(result)
                case let .encoded(encoded): return .encoded(encoded)
                }
            }
            let output: CallOutput
            if let span = admitted.span {
                output = try await ServiceContext.withValue(span.context) { try await dispatcher.run(admitted, connection: session) }
            } else {
                output = try await dispatcher.run(admitted, connection: session)
            }
            switch output {
            case let .local(outcome):
                succeeded(admitted)
                outcome.publish()
                return .result(outcome.value)
            case let .relayed(response):
                let code = response.code.flatMap(StatusCode.init(rawValue:)) ?? .unknown
                services.metrics.forwarded(method: admitted.spec.name, code: code, duration: .now - admitted.received)
                return answer(response, admitted)
            case let .replayed(response, subscription):
                services.metrics.idempotentReplays.increment()
                subscription.publish()
                return answer(response, admitted)
            }
        } catch {
            let mapped = RequestError(error)
            if mapped.code == .internal {
                dispatcher.logger.error("request failed", metadata: ["tw.command": "\(admitted.spec.name)", "tw.error": "\(error)"])
            }
            return failed(mapped, admitted)
        }
    }

    /// The principal the call's credentials name; nil for a call that
    /// presents none to a method that needs none (health, reflection, initialize).
    private func authenticate(_ caller: Caller, required: Bool) throws -> Principal? {
        let info = dispatcher.services.info
        guard info.authenticates else { return .standalone }
        if let token = caller.bearerToken, !token.isEmpty {
            guard let principal = info.authenticator.principal(presenting: Array(token.utf8)) else {
                throw RequestError(.unauthenticated, "the bearer token is not valid for this server")
            }
            if let certified = caller.certificatePrincipal, certified != principal {
                throw RequestError(.unauthenticated, "the bearer token names another principal than the client certificate")
            }
            return principal
        }
        if let certified = caller.certificatePrincipal { return certified }
        guard required else { return nil }
        throw RequestError(.unauthenticated, info.clientCertificatesName
            ? "this server authenticates clients: present a client certificate or send authorization: Bearer TOKEN"
            : "this server authenticates clients: send authorization: Bearer TOKEN")
    }

    private func withSpan<T>(_ admitted: AdmittedCall, _ body: () throws -> T) throws -> T {
        guard let span = admitted.span else { return try body() }
        return try ServiceContext.withValue(span.context) { try body() }
    }

    private func succeeded(_ admitted: AdmittedCall) {
        dispatcher.services.metrics.request(admitted.spec, code: .ok, duration: .now - admitted.received)
        RequestTracing.finish(admitted, code: .ok, logger: dispatcher.logger)
    }

    /// The answer of another instance (a relay) or of a first attempt (a replay).
    private func answer(_ response: Wire.Response, _ admitted: AdmittedCall) -> Answer {
        let code = response.code.flatMap(StatusCode.init(rawValue:)) ?? .unknown
        dispatcher.services.metrics.request(admitted.spec, code: code, duration: .now - admitted.received)
        RequestTracing.finish(admitted, code: code, message: response.message, logger: dispatcher.logger)
        if code == .ok, let result = response.result { return .result(result) }
        return .failed(code: code == .ok ? StatusCode.internal.rawValue : code.rawValue,
                       message: code == .ok ? "the owner's answer carried no result" : response.message ?? "")
    }

    private func failed(_ error: RequestError, _ admitted: AdmittedCall) -> Answer {
        dispatcher.services.metrics.request(admitted.spec, code: error.code, duration: .now - admitted.received)
        RequestTracing.finish(admitted.span, method: admitted.spec.name, id: nil, thread: admitted.spec.thread?.read(admitted.params),
                              code: error.code, message: error.message, received: admitted.received, logger: dispatcher.logger)
        return .failed(code: error.code.rawValue, message: error.message)
    }

    private func failed(_ error: RequestError, method: String, received: ContinuousClock.Instant) -> Answer {
        dispatcher.services.metrics.request(method: method, code: error.code, duration: .now - received)
        RequestTracing.finish(nil, method: method, id: nil, thread: nil, code: error.code, message: error.message,
                              received: received, logger: dispatcher.logger)
        return .failed(code: error.code.rawValue, message: error.message)
    }
}

extension ThreadwireServer {
    /// The call layer for gRPC's unary methods (see `UnaryCalls`).
    public var unaryCalls: UnaryCalls { UnaryCalls(dispatcher: CallDispatcher(services: services, logger: services.logger)) }
}
