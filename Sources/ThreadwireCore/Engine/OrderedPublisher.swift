import Synchronization

/// Delivers one thread's notifications in the order its commands committed.
/// A command takes a ticket while it holds the thread's gate; its deliveries
/// go out after its response (the dispatcher publishes them), and a later
/// ticket waits for every earlier one, so subscribers never see a thread's
/// events out of commit order.
public final class OrderedPublisher: Sendable {
    private struct State {
        var issued: UInt64 = 0
        var next: UInt64 = 0
        var pending: [UInt64: [Delivery]] = [:]
    }
    private let state = Mutex(State())
    let sink: any EventSink

    init(sink: any EventSink) { self.sink = sink }

    /// Called with the thread's gate held.
    func ticket(_ deliveries: [Delivery]) -> Publication {
        let number = state.withLock { state -> UInt64 in
            defer { state.issued += 1 }
            return state.issued
        }
        return Publication(publisher: self, ticket: number, deliveries: deliveries)
    }

    fileprivate func publish(ticket: UInt64, _ deliveries: [Delivery]) {
        // Delivering under the lock keeps the order across publishing threads;
        // the sink only enqueues writes.
        state.withLock { state in
            state.pending[ticket] = deliveries
            while let ready = state.pending.removeValue(forKey: state.next) {
                state.next += 1
                if !ready.isEmpty { sink.deliver(ready) }
            }
        }
    }
}

/// One command's deliveries for one thread, released in ticket order.
/// Published at most once; a publication that is dropped unpublished (a
/// caller that failed after the commit) publishes itself, so it can never
/// hold back the thread's later notifications.
public final class Publication: Sendable {
    let publisher: OrderedPublisher
    let ticket: UInt64
    public let deliveries: [Delivery]
    private let done = Atomic<Bool>(false)

    init(publisher: OrderedPublisher, ticket: UInt64, deliveries: [Delivery]) {
        self.publisher = publisher
        self.ticket = ticket
        self.deliveries = deliveries
    }

    public func publish() {
        guard !done.exchange(true, ordering: .acquiringAndReleasing) else { return }
        publisher.publish(ticket: ticket, deliveries)
    }

    deinit { publish() }
}
