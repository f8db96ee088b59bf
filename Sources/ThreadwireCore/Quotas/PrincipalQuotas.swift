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

/// Per-principal limits, shared by all of a principal's connections and, on
/// a PostgreSQL store, by every instance (one budget, not one per instance).
/// nil: not configured. A server that authenticates fills what is not
/// configured from `multiPrincipalDefaults`; one without authentication has
/// a single user (its operator) and no limits unless configured. 0: no limit.
public struct PrincipalLimits: Sendable, Equatable {
    /// Threads created (thread/start, thread/fork, agent/spawn, spawn_agent,
    /// thread/import): a bucket of this many, refilled at this many per minute.
    public var maxThreadsStartedPerMinute: Int?
    /// Turns in progress at once across the principal's threads.
    public var maxRunningTurns: Int?
    /// Requests after initialize, per second (a token bucket)…
    public var maxRequestsPerSecond: Int?
    /// …holding this many for a burst (nil or 0: twice the rate).
    public var requestBurst: Int?
    /// Bytes of turns and model history stored for the principal's threads;
    /// at or past it, creating threads and starting turns is refused.
    public var maxStoredBytes: Int64?

    public init(maxThreadsStartedPerMinute: Int? = nil, maxRunningTurns: Int? = nil, maxRequestsPerSecond: Int? = nil,
                requestBurst: Int? = nil, maxStoredBytes: Int64? = nil) {
        self.maxThreadsStartedPerMinute = maxThreadsStartedPerMinute
        self.maxRunningTurns = maxRunningTurns
        self.maxRequestsPerSecond = maxRequestsPerSecond
        self.requestBurst = requestBurst
        self.maxStoredBytes = maxStoredBytes
    }

    /// Far above what one person at a keyboard, or one agent tree, does: they
    /// stop a runaway script or a leaked token, not a user.
    public static let multiPrincipalDefaults = PrincipalLimits(
        maxThreadsStartedPerMinute: 600, maxRunningTurns: 64, maxRequestsPerSecond: 1000, requestBurst: 2000,
        maxStoredBytes: 10 << 30)

    /// Each limit not configured takes its value from `defaults`.
    public func filled(from defaults: PrincipalLimits) -> PrincipalLimits {
        PrincipalLimits(
            maxThreadsStartedPerMinute: maxThreadsStartedPerMinute ?? defaults.maxThreadsStartedPerMinute,
            maxRunningTurns: maxRunningTurns ?? defaults.maxRunningTurns,
            maxRequestsPerSecond: maxRequestsPerSecond ?? defaults.maxRequestsPerSecond,
            // A rate configured without a burst gets twice itself, not the default's burst.
            requestBurst: requestBurst ?? (maxRequestsPerSecond == nil ? defaults.requestBurst : nil),
            maxStoredBytes: maxStoredBytes ?? defaults.maxStoredBytes)
    }

    /// One limit as a row of the table a reload works from: its key under
    /// `limits.` (and so its flag and variable), its value in force (0: no
    /// limit), and how another value's setting of it is copied in.
    public struct Setting: Sendable {
        public let key: String
        public let inForce: @Sendable (PrincipalLimits) -> Int
        public let copy: @Sendable (inout PrincipalLimits, PrincipalLimits) -> Void
        public var flag: String { "--" + key.replacingOccurrences(of: "_", with: "-") }
    }

    /// Every limit, the one list a SIGHUP reload, its report of changes and
    /// its flag precedence are read from.
    public static let settings: [Setting] = [
        Setting(key: "max_threads_started_per_minute", inForce: \.threadsPerMinute) { $0.maxThreadsStartedPerMinute = $1.maxThreadsStartedPerMinute },
        Setting(key: "max_running_turns", inForce: \.runningTurns) { $0.maxRunningTurns = $1.maxRunningTurns },
        Setting(key: "max_requests_per_second", inForce: \.requestsPerSecond) { $0.maxRequestsPerSecond = $1.maxRequestsPerSecond },
        Setting(key: "request_burst", inForce: \.burst) { $0.requestBurst = $1.requestBurst },
        Setting(key: "max_stored_bytes", inForce: { Int(clamping: $0.storedBytes) }) { $0.maxStoredBytes = $1.maxStoredBytes },
    ]

    public var threadsPerMinute: Int { maxThreadsStartedPerMinute ?? 0 }
    public var runningTurns: Int { maxRunningTurns ?? 0 }
    public var requestsPerSecond: Int { maxRequestsPerSecond ?? 0 }
    public var burst: Int { requestBurst.flatMap { $0 > 0 ? $0 : nil } ?? 2 * requestsPerSecond }
    public var storedBytes: Int64 { maxStoredBytes ?? 0 }

    /// The bucket of thread creations (nil: no limit).
    public var threadStartBucket: QuotaBucket? {
        threadsPerMinute > 0
            ? QuotaBucket(name: "threads_started", capacity: Double(threadsPerMinute), perSecond: Double(threadsPerMinute) / 60) : nil
    }

    /// The bucket of requests (nil: no limit).
    public var requestBucket: QuotaBucket? {
        requestsPerSecond > 0 ? QuotaBucket(name: "requests", capacity: Double(burst), perSecond: Double(requestsPerSecond)) : nil
    }
}

/// A token bucket: holds up to `capacity`, refilled at `perSecond`.
public struct QuotaBucket: Sendable, Hashable {
    public var name: String
    public var capacity: Double
    public var perSecond: Double

    public init(name: String, capacity: Double, perSecond: Double) {
        self.name = name
        self.capacity = capacity
        self.perSecond = perSecond
    }

    /// Seconds until one whole token is there, given `available`.
    public func secondsUntilOne(available: Double) -> Double {
        available >= 1 ? 0 : (1 - max(0, available)) / perSecond
    }
}

/// What a ledger gave: `granted` whole tokens (0 up to the count asked), and
/// what the bucket holds after.
public struct QuotaGrant: Sendable, Equatable {
    public var granted: Int
    public var available: Double

    public init(granted: Int, available: Double) {
        self.granted = granted
        self.available = available
    }
}

/// Where the principals' buckets are kept: in this process
/// (`LocalQuotaLedger`), or in the store that several instances share.
public protocol QuotaLedger: Sendable {
    /// Takes up to `count` whole tokens from the principal's bucket.
    func take(_ count: Int, from bucket: QuotaBucket, of principal: Principal) async throws -> QuotaGrant
    /// Puts back tokens taken for something that did not happen.
    func giveBack(_ count: Int, to bucket: QuotaBucket, of principal: Principal) async
}

/// A ledger that several instances share also counts turns running on any
/// of them: each instance counts its own, and this covers the others.
public protocol SharedQuotaLedger: QuotaLedger {
    /// Holds a slot for a turn about to start on `thread` while fewer than
    /// `limit` of the principal's turns run on any instance (a turn already
    /// running on `thread` itself is not counted); nil: refused, with the
    /// count seen. `end` the reservation once the turn is committed or failed.
    func reserveTurn(on thread: ThreadID, of principal: Principal, limit: Int) async throws -> TurnReservation
    func end(_ reservation: TurnReservation) async
}

public enum TurnReservation: Sendable, Equatable {
    case held(id: String)
    case refused(running: Int)
}

/// One bucket's state and its arithmetic, shared by the in-process ledger
/// and the per-connection request gate.
struct BucketLevel: Sendable {
    var tokens: Double
    var refreshed: ContinuousClock.Instant

    init(full bucket: QuotaBucket, now: ContinuousClock.Instant) {
        tokens = bucket.capacity
        refreshed = now
    }

    mutating func take(_ count: Int, from bucket: QuotaBucket, now: ContinuousClock.Instant) -> QuotaGrant {
        let elapsed = now - refreshed
        let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
        tokens = min(bucket.capacity, tokens + max(0, seconds) * bucket.perSecond)
        refreshed = now
        let granted = max(0, min(count, Int(tokens.rounded(.down))))
        tokens -= Double(granted)
        return QuotaGrant(granted: granted, available: tokens)
    }

    mutating func giveBack(_ count: Int, to bucket: QuotaBucket) {
        tokens = min(bucket.capacity, tokens + Double(count))
    }
}

/// The buckets of a process that owns its store alone.
public final class LocalQuotaLedger: QuotaLedger {
    private struct Key: Hashable {
        var principal: Principal
        var bucket: String
    }
    private let levels = Mutex<[Key: BucketLevel]>([:])

    public init() {}

    public func take(_ count: Int, from bucket: QuotaBucket, of principal: Principal) -> QuotaGrant {
        takeNow(count, from: bucket, of: principal, now: .now)
    }

    func takeNow(_ count: Int, from bucket: QuotaBucket, of principal: Principal, now: ContinuousClock.Instant) -> QuotaGrant {
        levels.withLock { levels in
            let key = Key(principal: principal, bucket: bucket.name)
            var level = levels[key] ?? BucketLevel(full: bucket, now: now)
            let grant = level.take(count, from: bucket, now: now)
            levels[key] = level
            // A bucket left alone for minutes is full again, the same as none:
            // forget those, so principals that came and went cost nothing.
            if levels.count > 4096 {
                levels = levels.filter { now - $0.value.refreshed < .seconds(600) }
            }
            return grant
        }
    }

    public func giveBack(_ count: Int, to bucket: QuotaBucket, of principal: Principal) {
        levels.withLock { levels in
            levels[Key(principal: principal, bucket: bucket.name)]?.giveBack(count, to: bucket)
        }
    }
}

/// Whole seconds to wait, at least 1, for a refusal's message.
func retrySeconds(_ seconds: Double) -> Int { max(1, Int(seconds.rounded(.up))) }

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
            guard running + reserved < limit else { throw Self.refusal(principal, running: running + reserved, limit: limit) }
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

    static func refusal(_ principal: Principal, running: Int, limit: Int) -> DomainError {
        .resourceExhausted("principal \(principal) has \(running) turns running; limits.max_running_turns is \(limit); wait for one to finish or interrupt it")
    }

    func running(_ principal: Principal) -> Int { counts.withLock { $0.running[principal, default: 0] } }
}

/// The per-principal limits in force: the config file's, replaced by a
/// SIGHUP that re-reads it (ThreadwireServer.reloadPrincipalLimits).
public final class LivePrincipalLimits: Sendable {
    private let limits: Mutex<PrincipalLimits>
    public init(_ limits: PrincipalLimits) { self.limits = Mutex(limits) }
    public var current: PrincipalLimits { limits.withLock { $0 } }
    public func replace(_ new: PrincipalLimits) { limits.withLock { $0 = new } }
}

/// Admits each principal's requests within its request rate. Alone, an
/// exact token bucket here. Sharing a store, the bucket is the store's: this
/// instance takes tokens from it a batch at a time (a twentieth of a
/// second's worth, more when requests are waiting) and spends them locally,
/// so most requests cost no round trip; the next batch is claimed before
/// this one runs out. A request that finds none waits for the claim. The
/// cluster never admits more than the budget; tokens claimed by one
/// instance and not yet spent (at most a batch each) are unavailable to others.
public final class RequestGate: Sendable {
    public enum Decision: Sendable {
        case admitted
        case refused(DomainError)
        /// Tokens are being claimed from the shared ledger: `admitAfterClaim`.
        case wait
    }

    private struct Shared {
        var tokens = 0
        var claim: Task<Void, Never>?
        var exhaustedUntil: ContinuousClock.Instant?
        var waiting = 0
    }
    private struct Rate { var bucket: QuotaBucket?; var batch: Int }
    private let ledger: (any QuotaLedger)?
    private let local = LocalQuotaLedger()
    private let shared = Mutex<[Principal: Shared]>([:])
    /// Replaced by a reload; read once per request.
    private let rate: Mutex<Rate>
    private var bucket: QuotaBucket? { rate.withLock { $0.bucket } }
    private var batch: Int { rate.withLock { $0.batch } }

    /// - Parameter ledger: the ledger instances share (nil: this process alone).
    public init(limits: PrincipalLimits, ledger: (any QuotaLedger)?) {
        rate = Mutex(Rate(bucket: limits.requestBucket, batch: max(1, limits.requestsPerSecond / 20)))
        self.ledger = ledger
    }

    /// New limits from a reload: requests from now on are admitted under them.
    public func update(_ limits: PrincipalLimits) {
        rate.withLock { $0 = Rate(bucket: limits.requestBucket, batch: max(1, limits.requestsPerSecond / 20)) }
    }

    public var isLimiting: Bool { bucket != nil }

    /// On the event loop: spends a token if one is here.
    public func admit(_ principal: Principal, now: ContinuousClock.Instant = .now) -> Decision {
        guard let bucket else { return .admitted }
        guard let ledger else {
            let grant = local.takeNow(1, from: bucket, of: principal, now: now)
            return grant.granted == 1 ? .admitted : .refused(refusal(principal, bucket, retryIn: bucket.secondsUntilOne(available: grant.available)))
        }
        return shared.withLock { table in
            var state = table[principal] ?? Shared()
            defer { table[principal] = state }
            return spend(&state, bucket: bucket, ledger: ledger, principal: principal, now: now)
        }
    }

    /// After `.wait`: waits for the claim under way (or starts one), then
    /// spends a token or refuses; nil: admitted.
    public func admitAfterClaim(_ principal: Principal) async -> DomainError? {
        guard let bucket, let ledger else { return nil }
        enum Step { case done(DomainError?), awaiting(Task<Void, Never>) }
        for _ in 0..<4 {
            let step: Step = shared.withLock { table in
                var state = table[principal] ?? Shared()
                defer { table[principal] = state }
                switch spend(&state, bucket: bucket, ledger: ledger, principal: principal, now: .now) {
                case .admitted: return .done(nil)
                case let .refused(error): return .done(error)
                case .wait:
                    state.waiting += 1
                    let claim = state.claim ?? startClaim(batch + state.waiting, principal, bucket, ledger)
                    state.claim = claim
                    return .awaiting(claim)
                }
            }
            switch step {
            case let .done(refusal): return refusal
            case let .awaiting(claim):
                await claim.value
                shared.withLock { table in table[principal]?.waiting -= 1 }
            }
        }
        // Others took each batch first; rare, and brief.
        return refusal(principal, bucket, retryIn: 0.1)
    }

    private func spend(_ state: inout Shared, bucket: QuotaBucket, ledger: any QuotaLedger, principal: Principal,
                       now: ContinuousClock.Instant) -> Decision {
        if state.tokens >= 1 {
            state.tokens -= 1
            if state.claim == nil, state.tokens < (batch + 1) / 2 {
                state.claim = startClaim(batch, principal, bucket, ledger)
            }
            return .admitted
        }
        if let until = state.exhaustedUntil, now < until {
            let wait = until - now
            return .refused(refusal(principal, bucket, retryIn: Double(wait.components.seconds) + Double(wait.components.attoseconds) / 1e18))
        }
        return .wait
    }

    private func startClaim(_ count: Int, _ principal: Principal, _ bucket: QuotaBucket, _ ledger: any QuotaLedger) -> Task<Void, Never> {
        Task { [self] in
            let grant: QuotaGrant
            do {
                grant = try await ledger.take(count, from: bucket, of: principal)
            } catch {
                // The store does not answer: requests that need it fail
                // anyway, and refusing the rest too would turn a store
                // outage into an outage of everything.
                grant = QuotaGrant(granted: count, available: 0)
            }
            let now = ContinuousClock.now
            shared.withLock { table in
                var state = table[principal] ?? Shared()
                state.claim = nil
                state.tokens += grant.granted
                state.exhaustedUntil = grant.granted < count
                    ? now + .milliseconds(Int(bucket.secondsUntilOne(available: grant.available) * 1000)) : nil
                table[principal] = state
            }
        }
    }

    private func refusal(_ principal: Principal, _ bucket: QuotaBucket, retryIn seconds: Double) -> DomainError {
        .resourceExhausted("principal \(principal) sent more than limits.max_requests_per_second (\(Int(bucket.perSecond)) per second, bursts of \(Int(bucket.capacity))); retry in \(max(1, Int((seconds * 1000).rounded(.up)))) ms")
    }
}

/// Bytes each principal stores, measured by the store at most every
/// `maxAge` (a measure reads every stored turn of the principal, so it is
/// not taken per request); a principal at or past its limit may not add.
/// Only a principal's first check waits for a measure: later ones use the
/// last one and, once it is `maxAge` old, start the next in the background,
/// so no turn start waits for a scan of a large history.
final class StoredBytesMeter: Sendable {
    private struct Measure {
        var bytes: Int64
        var at: ContinuousClock.Instant
        var refreshing = false
    }
    private let measured = Mutex<[Principal: Measure]>([:])
    private let maxAge: Duration

    init(maxAge: Duration = .seconds(5)) { self.maxAge = maxAge }

    func check(_ principal: Principal, limit: Int64, store: any ThreadStore, tasks: TaskTracker) async throws {
        guard limit > 0 else { return }
        let now = ContinuousClock.now
        let (known, refresh) = measured.withLock { table -> (Int64?, Bool) in
            guard var entry = table[principal] else { return (nil, false) }
            guard now - entry.at >= maxAge, !entry.refreshing else { return (entry.bytes, false) }
            entry.refreshing = true
            table[principal] = entry
            return (entry.bytes, true)
        }
        if refresh {
            tasks.spawn { [self] in
                let fresh = try? await store.storedBytes(of: principal)
                record(principal, fresh)
            }
        }
        let bytes: Int64
        if let known {
            bytes = known
        } else {
            bytes = try await store.storedBytes(of: principal)
            record(principal, bytes)
        }
        if bytes >= limit {
            throw DomainError.resourceExhausted(
                "principal \(principal) stores \(bytes) bytes of turns and history; limits.max_stored_bytes is \(limit): nothing more can be added until the operator raises it")
        }
    }

    /// A measure taken (nil: it failed; the last one stands, and the next check tries again).
    private func record(_ principal: Principal, _ bytes: Int64?) {
        let now = ContinuousClock.now
        measured.withLock { table in
            if table.count > 4096 { table = table.filter { now - $0.value.at < maxAge * 10 } }
            guard let bytes else {
                table[principal]?.refreshing = false
                return
            }
            table[principal] = Measure(bytes: bytes, at: now)
        }
    }
}
