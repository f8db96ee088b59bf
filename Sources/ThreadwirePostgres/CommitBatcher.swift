import Foundation
import Logging
import Metrics
import PostgresNIO
import Synchronization
import ThreadwireCore
import ThreadwireStorage

/// Group commit. Every commit becomes one element of a call to
/// `threadwire_commit` (a PL/pgSQL function, `CommitFunction`): commits that
/// arrive while `maxCallsInFlight` calls run wait and then go together, in
/// one round trip, one transaction and one WAL flush; a lone commit is sent
/// at once, so a quiet server adds no delay. Before it writes anything, the
/// function checks each commit's fence and versions, so a refused commit
/// (stale version, lost lease) writes nothing and does not disturb the others
/// of its call. A call whose commits each only replace a different thread's
/// row (settings, tools, names) goes as one set-based UPDATE with the same
/// checks instead (`RowUpdates`). A call that fails as a whole (a
/// constraint, a dropped connection) is retried one commit per call, so only
/// the commit at fault fails.
final class CommitBatcher: Sendable {
    private struct Pending: Sendable {
        let work: Work
        let continuation: CheckedContinuation<Void, any Error>
    }

    /// A commit as it waits: a row replacement stays in columns, and
    /// becomes the function's JSON only if its call needs it.
    enum Work: Sendable {
        case rowUpdate(RowUpdate, operations: [StoreOperation])
        case commit(CommitFunction.Commit)

        init(_ operations: [StoreOperation], fence: LeaseFence?) throws {
            if let update = try RowUpdate(operations, fence: fence) {
                self = .rowUpdate(update, operations: operations)
            } else {
                self = .commit(try CommitFunction.Commit(operations, fence: fence))
            }
        }

        /// The commit in the function's input shape.
        func functionCommit() throws -> CommitFunction.Commit {
            switch self {
            case let .rowUpdate(update, operations): try CommitFunction.Commit(operations, fence: update.fence)
            case let .commit(commit): commit
            }
        }

        var rowUpdate: RowUpdate? {
            if case let .rowUpdate(update, _) = self { update } else { nil }
        }
    }

    private struct State {
        var pending: [Pending] = []
        var callsInFlight = 0
        var statistics = CommitStatistics()

        mutating func take(_ count: Int) -> [Pending] {
            let taken = Array(pending.prefix(count))
            pending.removeFirst(taken.count)
            return taken
        }
    }

    /// Two calls overlap: one is flushing the WAL while the next fills.
    static let maxCallsInFlight = 2
    /// Fences locked by one call stay few (lock table, statement size).
    static let maxCommitsPerCall = 64

    private let state = Mutex(State())
    private let client: PostgresClient
    private let logger: Logger
    private let timeout: Duration
    private let location: String

    /// `timeout`: a call that does not end within it fails (see `PostgresThreadStore.bounded`).
    init(client: PostgresClient, logger: Logger, timeout: Duration, location: String) {
        self.client = client
        self.logger = logger
        self.timeout = timeout
        self.location = location
    }

    func commit(_ operations: [StoreOperation], fence: LeaseFence?) async throws {
        let work = try Work(operations, fence: fence)
        try await withCheckedThrowingContinuation { continuation in
            let startCalling = state.withLock { state -> Bool in
                state.pending.append(Pending(work: work, continuation: continuation))
                guard state.callsInFlight < Self.maxCallsInFlight else { return false }
                state.callsInFlight += 1
                return true
            }
            // On the committing request's loop when it has one (see
            // `EventLoopTaskExecutor`): the call's awaits then continue in place.
            if startCalling { Task(executorPreference: TaskTracker.inheritedExecutor) { await self.drain() } }
        }
    }

    var statistics: CommitStatistics { state.withLock { $0.statistics } }

    /// Whether a call runs or commits wait for one.
    var busy: Bool { state.withLock { $0.callsInFlight > 0 || !$0.pending.isEmpty } }

    // The SQLite store's names: a dashboard of commit latency works on either store.
    private let batchSize = Recorder(label: "threadwire_store_commit_batch_size", aggregate: true)
    private let latency = Metrics.Timer(label: "threadwire_store_commit_seconds")

    /// Calls until nothing waits.
    private func drain() async {
        while true {
            let batch = state.withLock { state -> [Pending] in
                let batch = state.take(Self.maxCommitsPerCall)
                if batch.isEmpty {
                    state.callsInFlight -= 1
                } else {
                    state.statistics.calls += 1
                    state.statistics.commits += batch.count
                }
                return batch
            }
            if batch.isEmpty { return }
            // The call runs in this task; if it hangs (a dead connection, a
            // paused database), the alarm answers its commits with an error
            // and frees its slot, and this task is abandoned.
            let answer = Answer(batch.map(\.continuation))
            let (timeout, location) = (self.timeout, self.location)
            let alarm = DeadlineTimer.shared.schedule(after: timeout) {
                let error = StoreError.outcomeUnknown("PostgreSQL at \(location) did not complete a commit within \(timeout)")
                if answer.give(batch.map { _ in .failure(error) }) { self.abandoned() }
            }
            batchSize.record(batch.count)
            let started = ContinuousClock.now
            let outcomes = await run(batch.map(\.work))
            latency.record(duration: ContinuousClock.now - started)
            DeadlineTimer.shared.cancel(alarm)
            guard answer.give(outcomes) else { return }
        }
    }

    /// A hung call's slot is free again; commits that wait get a new call.
    private func abandoned() {
        let restart = state.withLock { state -> Bool in
            guard !state.pending.isEmpty else {
                state.callsInFlight -= 1
                return false
            }
            return true
        }
        if restart { Task(executorPreference: TaskTracker.inheritedExecutor) { await self.drain() } }
    }

    /// One outcome per commit.
    private func run(_ commits: [Work]) async -> [Result<Void, any Error>] {
        do {
            return try await call(commits)
        } catch where commits.count > 1 && Self.refusedByServer(error) {
            logger.debug("a grouped commit failed; committing its commits one by one", metadata: [
                "tw.commits": "\(commits.count)", "tw.error": "\(String(reflecting: error))"])
            var outcomes: [Result<Void, any Error>] = []
            for commit in commits {
                do { outcomes.append(try await call([commit])[0]) } catch { outcomes.append(.failure(Self.classified(error))) }
            }
            return outcomes
        } catch {
            return commits.map { _ in .failure(Self.classified(error)) }
        }
    }

    /// PostgreSQL answered with an error: the transaction was rolled back.
    static func refusedByServer(_ error: any Error) -> Bool {
        (error as? PSQLError)?.serverInfo != nil
    }

    /// context_items' (or thread_events') primary key refused an append: PostgreSQL's detail is
    /// "Key (thread_id, seq)=(ID, SEQ) already exists." (the id may hold
    /// commas, the sequence cannot).
    static func historySequenceTaken(_ error: any Error) -> StoreError? {
        guard let info = (error as? PSQLError)?.serverInfo, info[.sqlState] == "23505",
              ["context_items_pkey", "thread_events_pkey"].contains(info[.constraintName]), let detail = info[.detail],
              let match = detail.firstMatch(of: /^Key \(thread_id, seq\)=\((.*), (\d+)\) already exists\.$/),
              let sequence = Int(match.2) else { return nil }
        return .historySequenceTaken(threadID: String(match.1), sequence: sequence)
    }

    /// A refusal stays what it is; anything else (the connection lost or
    /// timed out mid-call) leaves the commit's outcome unknown.
    static func classified(_ error: any Error) -> any Error {
        if let taken = historySequenceTaken(error) { return taken }
        if refusedByServer(error) || error is StoreError { return error }
        return StoreError.outcomeUnknown("\(String(reflecting: error))")
    }

    private func call(_ commits: [Work]) async throws -> [Result<Void, any Error>] {
        if let updates = Self.distinctRowUpdates(commits) { return try await updateRows(updates, commits) }
        return try await callFunction(try commits.map { try $0.functionCommit() })
    }

    private func callFunction(_ commits: [CommitFunction.Commit]) async throws -> [Result<Void, any Error>] {
        var statuses: [String] = []
        let binds = Self.bindings(commits)
        for try await row in try await client.execute(CommitFunction.Call(bindings: binds), logger: logger) {
            statuses = row
        }
        guard statuses.count == commits.count else {
            throw StoreError.unavailable("threadwire_commit answered \(statuses.count) outcomes for \(commits.count) commits")
        }
        return zip(commits, statuses).map { commit, status in
            switch status {
            case "ok":
                return .success(())
            case "lease_lost":
                return .failure(StoreError.leaseLost(LeaseFence(tree: commit.tree ?? "", epoch: commit.epoch ?? 0)))
            case "key_taken":
                guard let key = commit.claimedKey else { return .failure(StoreError.unavailable("threadwire_commit answered 'key_taken' for a commit without a key")) }
                return .failure(StoreError.idempotencyKeyTaken(key))
            default:
                // "conflict <id> <expected version>"
                let parts = status.split(separator: " ")
                guard parts.count == 3, parts[0] == "conflict", let expected = Int64(parts[2]) else {
                    return .failure(StoreError.unavailable("threadwire_commit answered '\(status)'"))
                }
                return .failure(StoreError.conflict(threadID: String(parts[1]), expectedVersion: expected))
            }
        }
    }
}

extension CommitBatcher {
    /// A call's parameters: the commits as JSON, and their records.
    static func bindings(_ commits: [CommitFunction.Commit]) -> PostgresBindings {
        let (based, records) = CommitFunction.based(commits)
        var binds = PostgresBindings()
        binds.append(CommitJSON.encode(based))
        binds.append(records)
        return binds
    }

    /// The row replacements of `commits` when each only replaces a
    /// different thread's row (the common group: settings, tools, names of
    /// many threads).
    static func distinctRowUpdates(_ commits: [Work]) -> [RowUpdate]? {
        var updates: [RowUpdate] = []
        var seen = Set<String>()
        for commit in commits {
            guard let update = commit.rowUpdate, seen.insert(update.row.id).inserted else { return nil }
            updates.append(update)
        }
        return updates
    }

    /// Row replacements of distinct threads as one set-based UPDATE
    /// (`RowUpdates`: one statement, no PL/pgSQL loop; PostgreSQL spent
    /// about 38 µs per commit in the function's loop and JSON against 19 µs
    /// in the UPDATE itself). A commit whose row was not replaced wrote
    /// nothing; the commit function then names its refusal (a lost lease or
    /// a conflict cannot come right again).
    private func updateRows(_ updates: [RowUpdate], _ commits: [Work]) async throws -> [Result<Void, any Error>] {
        state.withLock { $0.statistics.rowUpdateCalls += 1 }
        var replaced = Set<String>()
        for try await thread in try await client.execute(RowUpdates(updates), logger: logger) {
            replaced.insert(thread)
        }
        var outcomes: [Result<Void, any Error>] = []
        for (commit, update) in zip(commits, updates) {
            outcomes.append(replaced.contains(update.row.id) ? .success(()) : try await callFunction([commit.functionCommit()])[0])
        }
        return outcomes
    }
}

/// Answers the commits of one call once: with the call's outcomes, or with
/// a timeout error if its alarm comes first.
private final class Answer: Sendable {
    private let continuations: Mutex<[CheckedContinuation<Void, any Error>]?>

    init(_ continuations: [CheckedContinuation<Void, any Error>]) { self.continuations = Mutex(continuations) }

    /// False if they were already answered.
    func give(_ outcomes: [Result<Void, any Error>]) -> Bool {
        guard let continuations = continuations.withLock({ state in defer { state = nil }; return state }) else { return false }
        for (continuation, outcome) in zip(continuations, outcomes) { continuation.resume(with: outcome) }
        return true
    }
}

/// How well commits were grouped: `commits` sent in `calls` calls, of which
/// `rowUpdateCalls` went as one set-based UPDATE.
public struct CommitStatistics: Sendable, Equatable {
    public var calls = 0
    public var commits = 0
    public var rowUpdateCalls = 0
}
