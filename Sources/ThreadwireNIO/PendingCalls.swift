import Synchronization

/// Why a call ended without its answer.
public enum CallFailure: Error, Equatable, Sendable {
    /// The connection closed (or was closed) before the answer came.
    case connectionClosed
    /// No answer within the call's deadline.
    case deadlineExceeded(milliseconds: Int64)
    /// The task waiting for the answer was cancelled.
    case cancelled
}

/// The calls one side of a connection started and is waiting to hear
/// answered, by id, with deadlines and cancellation. The same type serves
/// both directions: a client's requests to the server, and calls the server
/// starts that a client answers. The first answer for an id counts; a late or
/// duplicate answer finds nothing (`resolve` says so) and changes nothing.
public final class PendingCalls<Answer: Sendable>: Sendable {
    private struct State {
        var nextID: UInt64 = 0
        var waiting: [UInt64: CheckedContinuation<Answer, any Error>] = [:]
        var deadlines: [UInt64: Task<Void, Never>] = [:]
        var closed = false
    }
    private let state = Mutex(State())

    public init() {}

    /// Calls waiting for their answer.
    public var count: Int { state.withLock { $0.waiting.count } }

    /// Sends a call with a fresh id and waits for its answer. `send` is
    /// called once the id is registered, so an answer cannot outrun it.
    /// Throws `CallFailure` at the deadline, on cancellation of the waiting
    /// task, or when the connection closes; the id is forgotten then.
    public func call(deadline: Duration? = nil, send: (UInt64) -> Void) async throws -> Answer {
        let id = state.withLock { $0.nextID += 1; return $0.nextID }
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Answer, any Error>) in
                let registered = state.withLock { state -> Bool in
                    guard !state.closed else { return false }
                    state.waiting[id] = continuation
                    return true
                }
                guard registered else {
                    continuation.resume(throwing: CallFailure.connectionClosed)
                    return
                }
                if let deadline {
                    let timer = Task { [weak self] in
                        guard (try? await Task.sleep(for: deadline)) != nil else { return }
                        let (seconds, attoseconds) = deadline.components
                        self?.fail(id, CallFailure.deadlineExceeded(milliseconds: seconds * 1000 + attoseconds / 1_000_000_000_000_000))
                    }
                    // The answer may already have come (send ran on another thread).
                    let kept = state.withLock { state -> Bool in
                        guard state.waiting[id] != nil else { return false }
                        state.deadlines[id] = timer
                        return true
                    }
                    if !kept { timer.cancel() }
                }
                if Task.isCancelled {
                    fail(id, CallFailure.cancelled)
                    return
                }
                send(id)
            }
        } onCancel: {
            fail(id, CallFailure.cancelled)
        }
    }

    /// The answer of call `id`: true if it was awaited, false for an id
    /// never issued, already answered, past its deadline or cancelled.
    @discardableResult
    public func resolve(_ id: UInt64, with answer: Answer) -> Bool {
        guard let continuation = take(id) else { return false }
        continuation.resume(returning: answer)
        return true
    }

    /// Ends call `id` with `error` (its request could not be written, say).
    public func fail(_ id: UInt64, _ error: any Error) {
        take(id)?.resume(throwing: error)
    }

    /// The connection closed: every waiting call fails, and later calls fail at once.
    public func closeAll() {
        let (waiting, timers) = state.withLock { state in
            state.closed = true
            defer {
                state.waiting.removeAll()
                state.deadlines.removeAll()
            }
            return (Array(state.waiting.values), Array(state.deadlines.values))
        }
        for timer in timers { timer.cancel() }
        for continuation in waiting { continuation.resume(throwing: CallFailure.connectionClosed) }
    }

    private func take(_ id: UInt64) -> CheckedContinuation<Answer, any Error>? {
        let (continuation, timer) = state.withLock { state in
            (state.waiting.removeValue(forKey: id), state.deadlines.removeValue(forKey: id))
        }
        timer?.cancel()
        return continuation
    }
}
