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

/// An agent tree's gate and how many commands hold it or wait for it.
struct TreeGateEntry {
    let gate: AsyncGate
    let users: Int
}
