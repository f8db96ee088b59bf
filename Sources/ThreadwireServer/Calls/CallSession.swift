import NIOConcurrencyHelpers
import ThreadwireCore
import ThreadwireWire

/// Who a call acts for, apart from what carries its answer: a connection of
/// the frame protocol (TCP, in process) or one unary call of another
/// transport (gRPC), which has no session to subscribe. The dispatcher and
/// the handlers see only this, so nothing about a method is written per
/// transport.
protocol CallSession: AnyObject, Sendable {
    /// What subscriptions name: the connection, or `Subscriber.nobody`.
    var id: ConnectionID { get }
    var principal: Principal { get }
    /// Another instance relaying requests (never relayed again).
    var isPeer: Bool { get }
    var isInitialized: Bool { get }
    var onPeerListener: Bool { get }
    var certificatePrincipal: Principal? { get }
    /// The notification methods the client opted out of.
    var optedOut: [String] { get }
    /// Requests relayed to other instances for this caller.
    var upstreams: NIOLockedValueBox<[String: Upstream]> { get }
    /// Whether a request may start now; the refusal otherwise.
    func admits(requiresHandshake: Bool, method: String) -> RequestError?
    func markInitialized(optOut: [String], principal: Principal, credential: [UInt8]?, peer: Bool,
                         capabilities: Set<ClientCapability>) -> Bool
    /// A notification an owner relayed for this caller.
    func notify(_ encoded: Wire.EncodedNotification)
    /// For logs: where the caller is.
    var peerDescription: String { get }
}

extension CallSession {
    func notify(_ payload: Wire.Notification.Payload, metadata: [Wire.KeyValue] = []) {
        notify(Wire.EncodedNotification(payload, metadata: metadata))
    }
}

extension Connection: CallSession {
    var peerDescription: String { channel.remoteAddress.map { "\($0)" } ?? "?" }
}

/// One unary call of a transport without sessions (gRPC): authenticated by
/// its own metadata, it subscribes nothing (hearing about a thread is a
/// stream's job) and ends with its answer; a relay it opened to another
/// instance closes with it.
final class UnarySession: CallSession {
    let principal: Principal
    let certificatePrincipal: Principal?
    let peerDescription: String
    let upstreams = NIOLockedValueBox<[String: Upstream]>([:])
    private let handshook = NIOLockedValueBox(false)

    init(principal: Principal, certificatePrincipal: Principal?, peerDescription: String) {
        self.principal = principal
        self.certificatePrincipal = certificatePrincipal
        self.peerDescription = peerDescription
    }

    var id: ConnectionID { Subscriber.nobody }
    var isPeer: Bool { false }
    /// initialize is answered (it checks the protocol version and credentials
    /// and tells the limits) but starts nothing: every call stands alone.
    var isInitialized: Bool { false }
    var onPeerListener: Bool { false }
    var optedOut: [String] { [] }

    func admits(requiresHandshake: Bool, method: String) -> RequestError? { nil }

    func markInitialized(optOut: [String], principal: Principal, credential: [UInt8]?, peer: Bool,
                         capabilities: Set<ClientCapability>) -> Bool {
        handshook.withLockedValue { already in
            defer { already = true }
            return !already
        }
    }

    /// Nothing is subscribed for a unary call: a relayed notification has nobody to reach.
    func notify(_ encoded: Wire.EncodedNotification) {}

    /// The relays opened for this call.
    func finished() {
        let relays = upstreams.withLockedValue { table in
            defer { table.removeAll() }
            return Array(table.values)
        }
        for relay in relays { relay.close() }
    }
}
