import NIOConcurrencyHelpers

/// Owns the unstructured tasks the server starts from NIO callbacks (request
/// loops, connection cleanup, late deadline work), so shutdown can await
/// every one of them instead of abandoning them.
final class TaskTracker: Sendable {
    private struct State {
        var next = 0
        var running: [Int: Task<Void, Never>] = [:]
        /// Tasks that ended before they were registered.
        var endedEarly: Set<Int> = []
    }
    private let state = NIOLockedValueBox(State())

    func spawn(_ body: @escaping @Sendable () async -> Void) {
        let id = state.withLockedValue { state in
            state.next += 1
            return state.next
        }
        let task = Task {
            await body()
            self.ended(id)
        }
        state.withLockedValue { state in
            if state.endedEarly.remove(id) == nil { state.running[id] = task }
        }
    }

    private func ended(_ id: Int) {
        state.withLockedValue { state in
            if state.running.removeValue(forKey: id) == nil { state.endedEarly.insert(id) }
        }
    }

    var count: Int { state.withLockedValue { $0.running.count } }

    /// Returns when every task spawned so far, and any they spawned, ended.
    func waitForAll() async {
        while true {
            let tasks = state.withLockedValue { Array($0.running.values) }
            if tasks.isEmpty { return }
            for task in tasks { await task.value }
        }
    }
}
