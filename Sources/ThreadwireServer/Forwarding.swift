import Foundation
import Logging
import NIOConcurrencyHelpers
public import ThreadwireClient
import ThreadwireContract
import ThreadwireCore
import ThreadwireWire

/// How this instance reaches the others (several instances on one store).
public struct PeerSettings: Sendable {
    /// The cluster's shared secret, presented in `PeerHello.token`.
    public var token: String?
    /// TLS to the other instances (when they serve TLS).
    public var tls: ClientTLS?
    /// How long a relayed request may take before the client gets
    /// UNAVAILABLE (an owner that is paused answers nothing).
    public var requestTimeout: Duration = .seconds(15)
    /// How long a request for a thread whose owner died waits for the
    /// owner's lease to expire (then this instance takes the thread over).
    public var takeoverWait: Duration = .seconds(11)
    public init() {}
}

/// One client connection's relay to the instance that owns some of its
/// threads: a connection of its own per (client, owner), so the owner's
/// subscriptions, opt-outs and notification order are exactly the client's,
/// and each notification reaches the client once, in the owner's order.
final class Upstream: Sendable {
    let address: String
    let client: ThreadwireClient
    /// Threads the client subscribed to through this relay: if the owner
    /// goes away they hear thread/closed, so they know to resume.
    private let subscribed = NIOLockedValueBox<Set<ThreadID>>([])
    private let closing = NIOLockedValueBox(false)

    init(address: String, client: ThreadwireClient) {
        self.address = address
        self.client = client
    }

    /// Relays the owner's notifications to `connection` until the upstream
    /// closes; then tells the client its relayed subscriptions ended.
    func relay(to connection: Connection) {
        Task {
            for await notification in client.notifications {
                guard let payload = notification.payload else { continue }
                if case let .threadClosed(closed) = payload, let id = closed.threadId {
                    _ = subscribed.withLockedValue { $0.remove(id) }
                }
                connection.notify(payload)
            }
            let deliberate = closing.withLockedValue { $0 }
            connection.upstreams.withLockedValue { table in
                if table[address] === self { table[address] = nil }
            }
            guard !deliberate else { return }
            for id in subscribed.withLockedValue({ $0 }).sorted() {
                connection.notify(.threadStatusChanged(Wire.ThreadStatusChangedNotification(threadId: id, status: ThreadStatus.notLoaded.wire)))
                connection.notify(.threadClosed(Wire.ThreadClosedNotification(threadId: id)))
            }
        }
    }

    func subscribed(_ ids: [ThreadID]) { subscribed.withLockedValue { $0.formUnion(ids) } }
    func unsubscribed(_ id: ThreadID) { _ = subscribed.withLockedValue { $0.remove(id) } }

    func close() {
        closing.withLockedValue { $0 = true }
        let client = self.client
        Task { await client.close() }
    }
}

/// The answer of the instance that owns the request's thread, carried out
/// of the handler to the request loop, which sends it as it is.
struct RelayedAnswer: Error {
    var response: Wire.Response
}

enum Forwarding {
    /// `handler`, relaying to the owner when the thread is owned elsewhere.
    /// An owner that refuses connections is dead: its lease expires within
    /// the lease duration, and the request waits for that (trying again
    /// every 250 ms) rather than failing, so a crash is a pause to clients.
    static func relaying(_ handler: @escaping Handler, _ request: Wire.Request, connection: Connection,
                         services: ServerServices) -> Handler {
        { params, context in
            let deadline = ContinuousClock.now + services.peers.takeoverWait
            while true {
                do {
                    return try await handler(params, context)
                } catch let elsewhere as OwnedElsewhere {
                    let relay = await forward(request, params, to: elsewhere, connection: connection, services: services)
                    if elsewhere.remembered, relay.refusedWithoutEffect {
                        // The remembered owner moved on: look it up afresh.
                        context.engine.forgetOwner(of: elsewhere.threadID)
                        continue
                    }
                    switch relay {
                    case let .answered(response), let .noAnswer(response):
                        throw RelayedAnswer(response: response)
                    case let .unreachable(response):
                        guard ContinuousClock.now < deadline, !services.info.draining() else { throw RelayedAnswer(response: response) }
                        try await Task.sleep(for: .milliseconds(250))
                    }
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
                        connection: Connection, services: ServerServices) async -> Relay {
        guard !connection.isPeer else {
            // Ownership moved between the two instances' reads: no second hop.
            return .answered(refusal(request, "thread \(owner.threadID) moved to the instance at \(owner.address) while this request was relayed; retry"))
        }
        let timeout = UInt32(clamping: services.peers.requestTimeout.components.seconds * 1000)
        // Connecting counts against the same time: a paused owner's kernel
        // still accepts connections, and nothing answers on them.
        let opened = Task { try await self.upstream(owner.address, for: connection, services: services) }
        let upstream: Upstream
        do {
            guard let open = try await RequestLoop.firstOf(opened, timeoutMs: timeout) else {
                opened.cancel()
                Task { try? await opened.value.close() }
                return .unreachable(refusal(request, "the instance at \(owner.address) that owns thread \(owner.threadID) did not answer; "
                    + "once its lease expires any instance takes the thread over: retry"))
            }
            upstream = open
        } catch {
            return .unreachable(refusal(request, "thread \(owner.threadID) is owned by the instance at \(owner.address), which cannot be reached (\(error)); "
                + "once its lease expires any instance takes the thread over: retry"))
        }
        let call = Task { try await upstream.client.call(params, timeoutMs: request.timeoutMs, metadata: request.metadata) }
        let answer = try? await RequestLoop.firstOf(call, timeoutMs: timeout)
        guard var response = answer else {
            // No answer: the owner is gone or paused. The outcome is unknown
            // (like any UNAVAILABLE); a later request finds the new owner.
            call.cancel()
            connection.upstreams.withLockedValue { table in if table[owner.address] === upstream { table[owner.address] = nil } }
            upstream.close()
            return .noAnswer(refusal(request, "the instance at \(owner.address) that owns thread \(owner.threadID) did not answer; "
                + "the change may or may not have been made: read the thread, then retry"))
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
    static func upstream(_ address: String, for connection: Connection, services: ServerServices) async throws -> Upstream {
        if let open = connection.upstreams.withLockedValue({ $0[address] }), open.client.isActive { return open }
        guard let colon = address.lastIndex(of: ":"), let port = Int(address[address.index(after: colon)...]) else {
            throw ForwardingError(description: "the advertised address '\(address)' is not HOST:PORT")
        }
        let host = String(address[..<colon])
        let client = try await ThreadwireClient.connect(host: host, port: port, tls: services.peers.tls)
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
