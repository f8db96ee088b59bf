import Synchronization

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
