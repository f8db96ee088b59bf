import Synchronization

/// Who a thread belongs to: the authenticated principal that created it
/// (forks and children inherit it). A server without authentication has one
/// principal, `Principal.standalone`, and every thread belongs to it.
public typealias Principal = String

extension Principal {
    /// The one principal of a server without authentication, and the owner of
    /// threads created before authentication was configured.
    public static let standalone: Principal = "default"
}

/// Per-principal limits, shared by all of a principal's connections:
/// threads created per rolling minute, and turns running at once.
/// A check and the use it allows are one step under a lock, so concurrent
/// requests of one principal can never pass a limit together.
public struct PrincipalLimits: Sendable, Equatable {
    /// Threads created (thread/start, thread/fork, agent/spawn, spawn_agent)
    /// per rolling 60 s; 0 for no limit.
    public var maxThreadsStartedPerMinute = 0
    /// Turns in progress at once across the principal's threads; 0 for no limit.
    public var maxRunningTurns = 0
    public init() {}
}

/// The rolling-minute window of thread creations per principal.
final class ThreadStartWindow: Sendable {
    private let starts = Mutex<[Principal: [ContinuousClock.Instant]]>([:])
    private let window: Duration = .seconds(60)

    /// Records one creation for `principal`, or throws RESOURCE_EXHAUSTED
    /// naming the limit. Returns a token to give back if the creation fails.
    func reserve(_ principal: Principal, limit: Int, now: ContinuousClock.Instant = .now) throws -> ContinuousClock.Instant? {
        guard limit > 0 else { return nil }
        return try starts.withLock { table in
            var recent = table[principal, default: []]
            recent.removeAll { now - $0 >= window }
            guard recent.count < limit else {
                let retry = window - (now - recent[0])
                table[principal] = recent
                throw DomainError.resourceExhausted(
                    "principal \(principal) created \(recent.count) threads in the last minute; limits.max_threads_started_per_minute is \(limit) (retry in \(Self.seconds(retry)) s)")
            }
            recent.append(now)
            table[principal] = recent
            return now
        }
    }

    /// Gives back a reservation whose creation did not happen.
    func refund(_ principal: Principal, _ reservation: ContinuousClock.Instant?) {
        guard let reservation else { return }
        starts.withLock { table in
            guard var recent = table[principal], let index = recent.lastIndex(of: reservation) else { return }
            recent.remove(at: index)
            table[principal] = recent.isEmpty ? nil : recent
        }
    }

    private static func seconds(_ duration: Duration) -> Int {
        max(1, Int((Double(duration.components.seconds) + Double(duration.components.attoseconds) / 1e18).rounded(.up)))
    }
}

/// Turns in progress per principal, derived from published snapshots (so it
/// is exactly the committed state), plus slots reserved by turns that are
/// being committed.
final class RunningTurnCounts: Sendable {
    private struct Counts {
        var running: [Principal: Int] = [:]
        var reserved: [Principal: Int] = [:]
    }
    private let counts = Mutex(Counts())

    /// A snapshot of `principal`'s thread went from `wasRunning` to `isRunning`.
    func changed(_ principal: Principal, wasRunning: Bool, isRunning: Bool) {
        guard wasRunning != isRunning else { return }
        counts.withLock { counts in
            let next = counts.running[principal, default: 0] + (isRunning ? 1 : -1)
            counts.running[principal] = next > 0 ? next : nil
        }
    }

    /// Takes a slot for a turn about to be committed, or throws
    /// RESOURCE_EXHAUSTED naming the limit; `release` it once the turn is
    /// published (then it counts as running) or failed.
    func reserve(_ principal: Principal, limit: Int) throws -> Bool {
        guard limit > 0 else { return false }
        try counts.withLock { counts in
            let running = counts.running[principal, default: 0]
            let reserved = counts.reserved[principal, default: 0]
            guard running + reserved < limit else {
                throw DomainError.resourceExhausted(
                    "principal \(principal) has \(running + reserved) turns running; limits.max_running_turns is \(limit); wait for one to finish or interrupt it")
            }
            counts.reserved[principal] = reserved + 1
        }
        return true
    }

    func release(_ principal: Principal, _ reserved: Bool) {
        guard reserved else { return }
        counts.withLock { counts in
            let next = counts.reserved[principal, default: 0] - 1
            counts.reserved[principal] = next > 0 ? next : nil
        }
    }

    func running(_ principal: Principal) -> Int { counts.withLock { $0.running[principal, default: 0] } }
}
