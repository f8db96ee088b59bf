import Synchronization

/// Runs `body` and returns its result, or throws `timeoutError()` once
/// `timeout` passes, whether or not `body` ends (it is cancelled; a task
/// group would instead wait for it, and a driver call stuck on a dead
/// connection may never end). `body` runs on `executor` when one is given.
public func withDeadline<T: Sendable>(
    _ timeout: Duration, on executor: (any TaskExecutor)? = nil,
    timeoutError: @escaping @Sendable () -> any Error, _ body: @escaping @Sendable () async throws -> T
) async throws -> T {
    let outcome = FirstOutcome<T>()
    let work = Task(executorPreference: executor) {
        let result: Result<T, any Error>
        do { result = .success(try await body()) } catch { result = .failure(error) }
        outcome.finish(result)
    }
    return try await withTaskCancellationHandler {
        try await withCheckedThrowingContinuation { continuation in
            outcome.arm(continuation)
            let alarm = DeadlineTimer.shared.schedule(after: timeout) {
                // The timeout first: the cancelled body may end at once with its own error.
                outcome.finish(.failure(timeoutError()))
                work.cancel()
            }
            outcome.onFinish { DeadlineTimer.shared.cancel(alarm) }
        }
    } onCancel: {
        work.cancel()
    }
}

/// One shared clock for deadlines of seconds, checked every `resolution`:
/// registering and cancelling one is a dictionary change under a lock,
/// where a sleeping task per deadline costs two task switches and a timer.
public final class DeadlineTimer: Sendable {
    public static let shared = DeadlineTimer(resolution: .milliseconds(50))

    public struct Alarm: Hashable, Sendable { let id: UInt64 }

    private struct State {
        var next: UInt64 = 0
        var alarms: [UInt64: (due: ContinuousClock.Instant, fire: @Sendable () -> Void)] = [:]
        var ticking = false
    }

    private let state = Mutex(State())
    private let resolution: Duration

    init(resolution: Duration) { self.resolution = resolution }

    /// `fire` runs once, at most `resolution` after `delay`, unless cancelled first.
    public func schedule(after delay: Duration, _ fire: @escaping @Sendable () -> Void) -> Alarm {
        let due = ContinuousClock.now + delay
        let (alarm, startTicking) = state.withLock { state -> (Alarm, Bool) in
            state.next += 1
            state.alarms[state.next] = (due, fire)
            defer { state.ticking = true }
            return (Alarm(id: state.next), !state.ticking)
        }
        if startTicking { Task.detached { await self.tick() } }
        return alarm
    }

    public func cancel(_ alarm: Alarm) {
        _ = state.withLock { $0.alarms.removeValue(forKey: alarm.id) }
    }

    private func tick() async {
        while true {
            try? await Task.sleep(for: resolution)
            let now = ContinuousClock.now
            let due = state.withLock { state -> [@Sendable () -> Void]? in
                if state.alarms.isEmpty {
                    state.ticking = false
                    return nil
                }
                let expired = state.alarms.filter { $0.value.due <= now }
                for id in expired.keys { state.alarms.removeValue(forKey: id) }
                return expired.values.map(\.fire)
            }
            guard let due else { return }
            for fire in due { fire() }
        }
    }
}

/// Resumes a continuation with the first result offered, once.
public final class FirstOutcome<T: Sendable>: Sendable {
    private struct State {
        var continuation: CheckedContinuation<T, any Error>?
        var done = false
        var early: Result<T, any Error>?
        var cleanup: (@Sendable () -> Void)?
    }

    private let state = Mutex(State())

    public init() {}

    public func arm(_ continuation: CheckedContinuation<T, any Error>) {
        let (early, cleanup) = state.withLock { state -> (Result<T, any Error>?, (@Sendable () -> Void)?) in
            guard let early = state.early else {
                state.continuation = continuation
                return (nil, nil)
            }
            state.early = nil
            defer { state.cleanup = nil }
            return (early, state.cleanup)
        }
        if let early {
            continuation.resume(with: early)
            cleanup?()
        }
    }

    /// Resumes the continuation if it is armed and nothing finished yet; a
    /// result offered before `arm` is kept and delivered by `arm`.
    public func finish(_ result: Result<T, any Error>) {
        let (continuation, cleanup) = state.withLock { state -> (CheckedContinuation<T, any Error>?, (@Sendable () -> Void)?) in
            guard !state.done else { return (nil, nil) }
            state.done = true
            guard let continuation = state.continuation else {
                state.early = result
                return (nil, nil)
            }
            state.continuation = nil
            defer { state.cleanup = nil }
            return (continuation, state.cleanup)
        }
        continuation?.resume(with: result)
        cleanup?()
    }

    /// Runs `cleanup` once the continuation has been resumed (at once if it was).
    public func onFinish(_ cleanup: @escaping @Sendable () -> Void) {
        let resumed = state.withLock { state -> Bool in
            if state.done && state.continuation == nil && state.early == nil { return true }
            state.cleanup = cleanup
            return false
        }
        if resumed { cleanup() }
    }
}
