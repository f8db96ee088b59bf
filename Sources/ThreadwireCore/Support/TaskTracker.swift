import Synchronization

/// Owns unstructured tasks started from callbacks (request loops, connection
/// cleanup, turn runners, mailbox deliveries), so shutdown can await every
/// one of them instead of abandoning them.
public final class TaskTracker: Sendable {
    private struct State {
        var next = 0
        var running: [Int: Task<Void, Never>] = [:]
        /// Tasks that ended before they were registered.
        var endedEarly: Set<Int> = []
    }
    private let state = Mutex(State())

    public init() {}

    /// The executor preferred by the task running this code, as given to
    /// `spawn(on:)`: unstructured tasks do not inherit a task executor, so
    /// the tasks a request sets off (a turn's runner, a delivery) learn it here.
    @TaskLocal public static var inheritedExecutor: (any TaskExecutor)?

    /// - Parameter executor: where the task's jobs run (see
    ///   `EventLoopTaskExecutor`), also preferred by the tasks it spawns;
    ///   nil: the spawning task's, else the global executor.
    @discardableResult
    public func spawn(on executor: (any TaskExecutor)? = nil,
                      _ body: @escaping @Sendable () async -> Void) -> Task<Void, Never> {
        let id = state.withLock { state in
            state.next += 1
            return state.next
        }
        let executor = executor ?? Self.inheritedExecutor
        let task = Task(executorPreference: executor) {
            // Whatever a request sets off is not that request's change.
            await Self.$inheritedExecutor.withValue(executor) {
                await IdempotentCommand.detached { await body() }
            }
            self.ended(id)
        }
        state.withLock { state in
            if state.endedEarly.remove(id) == nil { state.running[id] = task }
        }
        return task
    }

    private func ended(_ id: Int) {
        state.withLock { state in
            if state.running.removeValue(forKey: id) == nil { state.endedEarly.insert(id) }
        }
    }

    public var count: Int { state.withLock { $0.running.count } }

    /// Returns when every task spawned so far, and any they spawned, ended;
    /// false if some were still running at `timeout` (they were cancelled).
    @discardableResult
    public func waitForAll(timeout: Duration = .seconds(30)) async -> Bool {
        let deadline = ContinuousClock.now + timeout
        while true {
            let tasks = state.withLock { Array($0.running.values) }
            if tasks.isEmpty { return true }
            if ContinuousClock.now >= deadline {
                for task in tasks { task.cancel() }
                return false
            }
            // Poll briefly rather than await one task that might never end.
            try? await Task.sleep(for: .milliseconds(10))
        }
    }
}
