import Foundation
import Logging
import Tracing
import NIOConcurrencyHelpers
import ThreadwireClient
import ThreadwireNIO
import ThreadwireContract
import ThreadwireCore
import ThreadwireWire

/// Requests for threads another instance owns (several instances on one
/// store) go to that instance, and its answer comes back as a value.
enum RelayToOwner {
    /// `local`, or the owner's answer when the thread is owned elsewhere.
    /// An owner that refuses connections is dead: its lease expires within
    /// the lease duration, and the request waits for that (trying again
    /// every 250 ms) rather than failing, so a crash is a pause to clients.
    static func run(_ admitted: AdmittedCall, connection: any CallSession, services: ServerServices,
                    local: @Sendable () async throws -> CallOutput) async throws -> CallOutput {
        let deadline = ContinuousClock.now + services.peers.takeoverWait
        while true {
            do {
                return try await local()
            } catch let elsewhere as OwnedElsewhere {
                let relay = await forward(admitted.request, admitted.params, to: elsewhere, connection: connection, services: services)
                if elsewhere.remembered, relay.refusedWithoutEffect {
                    // The remembered owner moved on: look it up afresh.
                    services.engine.forgetOwner(of: elsewhere.threadID)
                    continue
                }
                switch relay {
                case let .answered(response), let .noAnswer(response):
                    return .relayed(response)
                case let .unreachable(response):
                    guard ContinuousClock.now < deadline, !services.info.draining() else { return .relayed(response) }
                    try await Task.sleep(for: .milliseconds(250))
                }
            }
        }
    }

    enum Relay {
        /// The owner's answer (or this instance's refusal to relay).
        case answered(Wire.Response)
        /// The owner refused the connection (its process is gone).
        case unreachable(Wire.Response)
        /// The owner took the request and did not answer in time: its
        /// outcome is unknown, so it is never sent again.
        case noAnswer(Wire.Response)

        /// The request surely had no effect: the owner is gone, or it
        /// answered UNAVAILABLE (draining, moved, lost its lease, store down;
        /// none of them changes anything).
        var refusedWithoutEffect: Bool {
            switch self {
            case .unreachable: true
            case let .answered(response): response.code == StatusCode.unavailable.rawValue
            case .noAnswer: false
            }
        }
    }

    /// Relays a request that names a thread another live instance owns and
    /// returns that instance's answer under the client's request id.
    static func forward(_ request: Wire.Request, _ params: Wire.Request.Params, to owner: OwnedElsewhere,
                        connection: any CallSession, services: ServerServices) async -> Relay {
        guard ThreadTracing.enabled else {
            return await forwardUntraced(request, params, to: owner, connection: connection, services: services)
        }
        // The hop's span: the owner continues the trace from it.
        return await ThreadTracing.span("relay \(params.methodName)", kind: .client, attributes: [
            "threadwire.relay.owner": .string(owner.address), "threadwire.thread.id": .string(owner.threadID),
        ]) { span in
            let relay = await forwardUntraced(request, params, to: owner, connection: connection, services: services)
            switch relay {
            case let .answered(response), let .unreachable(response), let .noAnswer(response):
                span?.updateAttributes { $0["rpc.threadwire.status_code"] = Int64(response.code ?? 0) }
                if (response.code ?? 0) != 0 { span?.setStatus(SpanStatus(code: .error, message: response.message)) }
            }
            return relay
        }
    }

    private static func forwardUntraced(_ request: Wire.Request, _ params: Wire.Request.Params, to owner: OwnedElsewhere,
                                        connection: any CallSession, services: ServerServices) async -> Relay {
        guard !connection.isPeer else {
            // Ownership moved between the two instances' reads: no second hop.
            return .answered(refusal(request, "thread \(owner.threadID) moved to another instance while this request was relayed; retry"))
        }
        let timeout = UInt32(clamping: services.peers.requestTimeout.components.seconds * 1000)
        // Connecting counts against the same time: a paused owner's kernel
        // still accepts connections, and nothing answers on them.
        let opened = Task { try await self.upstream(owner.address, for: connection, services: services) }
        let upstream: Upstream
        do {
            guard let open = try await firstOf(opened, timeoutMs: timeout) else {
                opened.cancel()
                Task { try? await opened.value.close() }
                services.logger.notice("relay: the owner did not answer in time", metadata: ["tw.peer": "\(owner.address)", "tw.thread": "\(owner.threadID)"])
                return .unreachable(refusal(request, "the instance that owns thread \(owner.threadID) did not answer; "
                    + "once its lease expires any instance takes the thread over: retry"))
            }
            upstream = open
        } catch {
            // Where the owner is (and why it cannot be reached) is the
            // operator's to know, not the client's: logged, never answered.
            services.logger.notice("relay: the owner cannot be reached", metadata: [
                "tw.peer": "\(owner.address)", "tw.thread": "\(owner.threadID)", "tw.error": "\(error)",
            ])
            return .unreachable(refusal(request, "thread \(owner.threadID) is owned by another instance, which cannot be reached now; "
                + "once its lease expires any instance takes the thread over: retry"))
        }
        let metadata = RequestTracing.relayMetadata(request.metadata)
        let call = Task {
            try await upstream.client.call(params, timeoutMs: request.timeoutMs, metadata: metadata, idempotencyKey: request.idempotencyKey)
        }
        let answer = try? await firstOf(call, timeoutMs: timeout)
        guard var response = answer else {
            // No answer: the owner is gone or paused. The outcome is unknown
            // (like any UNAVAILABLE); a later request finds the new owner.
            call.cancel()
            connection.upstreams.withLockedValue { table in if table[owner.address] === upstream { table[owner.address] = nil } }
            upstream.close()
            services.logger.notice("relay: the owner did not answer", metadata: ["tw.peer": "\(owner.address)", "tw.thread": "\(owner.threadID)"])
            return .noAnswer(refusal(request, "the instance that owns thread \(owner.threadID) did not answer; "
                + "the change may or may not have been made: read the thread, then retry (with the same idempotency key a retry applies it once)"))
        }
        response.id = request.id
        if response.code ?? 0 == 0 { track(params, response, upstream) }
        return .answered(response)
    }

    static func refusal(_ request: Wire.Request, _ message: String) -> Wire.Response {
        Wire.Response(id: request.id, code: StatusCode.unavailable.rawValue, message: message)
    }

    /// The client's relay to `address`, opened (and initialized as a peer
    /// acting for the client's principal) on first use.
    static func upstream(_ address: String, for connection: any CallSession, services: ServerServices) async throws -> Upstream {
        if let open = connection.upstreams.withLockedValue({ $0[address] }), open.client.isActive { return open }
        guard let owner = HostPort(address) else {
            throw ForwardingError(description: "the advertised address '\(address)' is not HOST:PORT")
        }
        let client = try await ThreadwireClient.connect(host: owner.host, port: owner.port, tls: services.peers.tls)
        do {
            try await client.initialize(
                name: "threadwire-relay", optOut: connection.optedOut,
                peer: Wire.PeerHello(token: services.peers.token, principal: services.info.authenticates ? connection.principal : nil))
        } catch {
            await client.close()
            throw error
        }
        let upstream = Upstream(address: address, client: client)
        let replaced = connection.upstreams.withLockedValue { table -> Upstream? in
            defer { table[address] = upstream }
            return table[address]
        }
        replaced?.close()
        upstream.relay(to: connection)
        return upstream
    }

    /// What the owner subscribed the relay to, as the client's subscriptions.
    static func track(_ params: Wire.Request.Params, _ response: Wire.Response, _ upstream: Upstream) {
        switch (params, response.result) {
        case let (.threadResume(p), _): upstream.subscribed(p.threadId.map { [$0] } ?? [])
        case let (.threadSubscribe(p), _): upstream.subscribed(p.threadId.map { [$0] } ?? [])
        // A repeated keyed thread/start or fork is relayed to the thread's owner.
        case let (.threadStart, .threadStart(result)?), let (.threadFork, .threadFork(result)?):
            upstream.subscribed(result.thread?.id.map { [$0] } ?? [])
        case let (.turnStart(p), _): upstream.subscribed(p.threadId.map { [$0] } ?? [])
        case let (.agentSpawn(p), .agentSpawn(result)?):
            upstream.subscribed([p.parentThreadId, result.thread?.id].compactMap { $0 })
        case let (.threadUnsubscribe(p), _): if let id = p.threadId { upstream.unsubscribed(id) }
        default: break
        }
    }
}

struct ForwardingError: Error, CustomStringConvertible {
    let description: String
}
