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
    /// Secrets accepted from other instances: `token` and, while a new
    /// secret rolls out, the others (every instance accepts both; then every
    /// one presents the new; then the old one goes).
    public var acceptedTokens: [String] = []
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
    func relay(to connection: any CallSession) {
        Task {
            for await notification in client.notifications {
                guard let payload = notification.payload else { continue }
                if case let .threadClosed(closed) = payload, let id = closed.threadId {
                    _ = subscribed.withLockedValue { $0.remove(id) }
                }
                connection.notify(Wire.EncodedNotification(payload, metadata: notification.metadata,
                                                           threadSequence: notification.threadSequence))
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
