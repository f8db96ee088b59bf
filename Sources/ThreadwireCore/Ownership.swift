import Synchronization

/// A FIFO async mutex. A thread's commands hold it from check to publish, so
/// none of them sees or overwrites another's half-done state, even though
/// they suspend (store commits) in between. Ownership passes straight to the
/// next waiter, so nobody can barge in between two queued commands.
public final class AsyncGate: Sendable {
    private struct State {
        var locked = false
        var waiters: [CheckedContinuation<Void, Never>] = []
        var head = 0
    }
    private let state = Mutex(State())

    public init() {}

    public func lock() async {
        let acquired = state.withLock { state -> Bool in
            if state.locked { return false }
            state.locked = true
            return true
        }
        if acquired { return }
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let now = state.withLock { state -> Bool in
                if !state.locked {
                    state.locked = true
                    return true
                }
                state.waiters.append(continuation)
                return false
            }
            if now { continuation.resume() }
        }
    }

    public func unlock() {
        let next = state.withLock { state -> CheckedContinuation<Void, Never>? in
            guard state.head < state.waiters.count else {
                state.locked = false
                state.waiters.removeAll(keepingCapacity: true)
                state.head = 0
                return nil
            }
            defer { state.head += 1 }
            return state.waiters[state.head]  // stays locked: handed over
        }
        next?.resume()
    }

    public func withLock<T: Sendable>(_ body: () async throws -> T) async rethrows -> T {
        await lock()
        defer { unlock() }
        return try await body()
    }
}

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

/// Wakes everyone waiting for a change of a set of threads (wait_agent).
/// Register first, then check the condition, then wait: a change between the
/// check and the wait is never missed.
final class ChangeBoard: Sendable {
    final class Waiter: Sendable {
        let ids: Set<ThreadID>
        private struct State {
            var fired = false
            var continuation: CheckedContinuation<Void, Never>?
        }
        private let state = Mutex(State())
        init(ids: Set<ThreadID>) { self.ids = ids }

        func fire() {
            let continuation = state.withLock { state -> CheckedContinuation<Void, Never>? in
                state.fired = true
                defer { state.continuation = nil }
                return state.continuation
            }
            continuation?.resume()
        }

        /// Returns when fired or when the task is cancelled.
        func wait() async {
            await withTaskCancellationHandler {
                await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                    let already = state.withLock { state -> Bool in
                        if state.fired { return true }
                        state.continuation = continuation
                        return false
                    }
                    if already { continuation.resume() }
                }
            } onCancel: {
                fire()
            }
        }
    }

    private let waiters = Mutex<[ObjectIdentifier: Waiter]>([:])

    func register(_ ids: Set<ThreadID>) -> Waiter {
        let waiter = Waiter(ids: ids)
        waiters.withLock { $0[ObjectIdentifier(waiter)] = waiter }
        return waiter
    }

    func remove(_ waiter: Waiter) {
        _ = waiters.withLock { $0.removeValue(forKey: ObjectIdentifier(waiter)) }
    }

    func changed(_ id: ThreadID) {
        let woken = waiters.withLock { table in table.values.filter { $0.ids.contains(id) } }
        for waiter in woken { waiter.fire() }
    }

    /// Waits for the waiter to fire or the deadline to pass; true when fired.
    static func wait(_ waiter: Waiter, until deadline: ContinuousClock.Instant) async -> Bool {
        await withTaskGroup(of: Bool.self) { group in
            group.addTask {
                await waiter.wait()
                return true
            }
            group.addTask {
                try? await Task.sleep(until: deadline, clock: .continuous)
                return false
            }
            let first = await group.next() ?? false
            group.cancelAll()
            return first
        }
    }
}
