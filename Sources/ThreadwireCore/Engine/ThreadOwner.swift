import Foundation
import Synchronization

/// The one owner of a loaded thread. Everything but the subscriptions is
/// read and written only with `gate` held (hence unchecked Sendable).
final class ThreadOwner: @unchecked Sendable {
    let id: ThreadID
    let gate = AsyncGate()
    let publisher: OrderedPublisher
    var state: StoredThread?
    var config = ThreadConfig()
    /// Set when unloaded; a command that queued on a retired owner looks again.
    var retired = false
    /// The lease of its agent tree this owner commits under (several
    /// instances on one store), nil otherwise.
    var fence: LeaseFence?
    var runner: Task<Void, Never>?
    var unloadTimer: Task<Void, Never>?
    /// The running model call's streamed message, if any.
    var messageStream: MessageStream?
    /// The thread's token totals as last reported (gate held): summed from
    /// the stored turns once, then kept up to date call by call.
    var usageTotal: TokenUsage?

    private struct Subscriptions {
        var current: Set<ConnectionID> = []
        /// Of `current`, those that only watch (thread/subscribe): they hear
        /// every event and are sent no server request, which only a
        /// participant (thread/resume, turn/start, ...) answers.
        var watching: Set<ConnectionID> = []
        /// Connections that unsubscribed; they hear thread/closed.
        var former: Set<ConnectionID> = []
    }
    private let subscriptions = Mutex(Subscriptions())

    init(id: ThreadID, sink: any EventSink) {
        self.id = id
        publisher = OrderedPublisher(sink: sink)
    }

    var subscribers: [ConnectionID] { subscriptions.withLock { Array($0.current) } }
    var formerSubscribers: [ConnectionID] { subscriptions.withLock { Array($0.former) } }
    /// The subscribers a server request goes to.
    var participants: [ConnectionID] { subscriptions.withLock { Array($0.current.subtracting($0.watching)) } }

    func subscribe(_ connection: ConnectionID) {
        guard connection != Subscriber.nobody else { return }
        subscriptions.withLock {
            $0.current.insert(connection)
            $0.watching.remove(connection)
            $0.former.remove(connection)
        }
    }

    /// Subscribes a watcher; a participant already subscribed stays one.
    func watch(_ connection: ConnectionID) {
        guard connection != Subscriber.nobody else { return }
        subscriptions.withLock {
            if $0.current.insert(connection).inserted { $0.watching.insert(connection) }
            $0.former.remove(connection)
        }
    }

    func isSubscribed(_ connection: ConnectionID) -> Bool {
        subscriptions.withLock { $0.current.contains(connection) }
    }

    /// Subscribes the subscribers of `other` (a new child's parent) as they
    /// are there: a watcher of the parent only watches the child too, so it
    /// is sent none of the child's server requests either.
    func subscribe(like other: ThreadOwner) {
        let (current, watching) = other.subscriptions.withLock { ($0.current, $0.watching) }
        subscriptions.withLock { mine in
            for connection in current where mine.current.insert(connection).inserted && watching.contains(connection) {
                mine.watching.insert(connection)
            }
        }
    }

    func unsubscribe(_ connection: ConnectionID) -> Bool {
        subscriptions.withLock {
            guard $0.current.remove(connection) != nil else { return false }
            $0.watching.remove(connection)
            $0.former.insert(connection)
            return true
        }
    }

    /// True if the connection was subscribed (now or formerly).
    func forget(_ connection: ConnectionID) -> Bool {
        subscriptions.withLock {
            let was = $0.current.remove(connection) != nil
            $0.watching.remove(connection)
            return $0.former.remove(connection) != nil || was
        }
    }

    func cancelUnload() {
        unloadTimer?.cancel()
        unloadTimer = nil
    }

    /// The committed state, inside a command (`withOwner` holds the gate and
    /// loads it first). Outside one it may be nil: a bug, stopped here with
    /// the thread named rather than at some later unwrap.
    var current: StoredThread {
        guard let state else { preconditionFailure("thread \(id): state read outside a command that loaded it (withOwner)") }
        return state
    }

    var settingsView: ThreadSettingsView { ThreadView(stored: current, includeTurns: false).settings }

    /// Runs `body` with the gate held (a turn's bookkeeping between its
    /// model and tool calls, which run with no gate held).
    func locked<T>(_ body: () async -> T) async -> T {
        await gate.lock()
        defer { gate.unlock() }
        return await body()
    }

    /// item/started and item/completed of an item that is done when it starts.
    func itemEvents(turnID: TurnID, _ item: ItemRecord) -> [Delivery] {
        let recipients = subscribers
        return [
            Delivery(event: .itemStarted(id, turnID, item), recipients: recipients),
            Delivery(event: .itemCompleted(id, turnID, item), recipients: recipients),
        ]
    }
}
