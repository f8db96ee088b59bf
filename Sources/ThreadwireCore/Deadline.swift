import Synchronization

/// Runs `body` and returns its result, or throws `timeoutError()` once
/// `timeout` passes, whether or not `body` ends (it is cancelled; a task
/// group would instead wait for it, and a driver call stuck on a dead
/// connection may never end).
public func withDeadline<T: Sendable>(
    _ timeout: Duration, timeoutError: @escaping @Sendable () -> any Error, _ body: @escaping @Sendable () async throws -> T
) async throws -> T {
    let work = Task { try await body() }
    let outcome = FirstOutcome<T>()
    return try await withTaskCancellationHandler {
        try await withCheckedThrowingContinuation { continuation in
            outcome.arm(continuation)
            let timer = Task {
                try? await Task.sleep(for: timeout)
                if !Task.isCancelled {
                    work.cancel()
                    outcome.finish(.failure(timeoutError()))
                }
            }
            Task {
                let result = await work.result
                timer.cancel()
                outcome.finish(result)
            }
        }
    } onCancel: {
        work.cancel()
    }
}

/// Resumes a continuation with the first result offered, once.
public final class FirstOutcome<T: Sendable>: Sendable {
    private let state = Mutex<(continuation: CheckedContinuation<T, any Error>?, done: Bool)>((nil, false))

    public init() {}

    public func arm(_ continuation: CheckedContinuation<T, any Error>) {
        state.withLock { $0.continuation = continuation }
    }

    public func finish(_ result: Result<T, any Error>) {
        let continuation = state.withLock { state -> CheckedContinuation<T, any Error>? in
            guard !state.done else { return nil }
            state.done = true
            defer { state.continuation = nil }
            return state.continuation
        }
        continuation?.resume(with: result)
    }
}
