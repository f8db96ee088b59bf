import Foundation
import Synchronization

/// Proof of ownership a commit carries when several processes share a store:
/// the agent tree (its root's session id) and the epoch this process was
/// granted. The store applies the commit only while the lease still has
/// that epoch, so a paused or partitioned former owner can never overwrite
/// what the new owner wrote.
public struct LeaseFence: Sendable, Hashable, CustomStringConvertible {
    public var tree: ThreadID
    public var epoch: Int64
    public init(tree: ThreadID, epoch: Int64) {
        self.tree = tree
        self.epoch = epoch
    }
    public var description: String { "\(tree)@\(epoch)" }
}

/// The thread belongs to an agent tree another live instance owns: the
/// request goes there (see the server's forwarder), never to this engine.
public struct OwnedElsewhere: Error, CustomStringConvertible {
    public var threadID: ThreadID
    /// The owner's advertised HOST:PORT.
    public var address: String
    /// Known from an earlier lookup rather than the store just now: the
    /// owner may have changed since (see `KnownOwners`).
    public var remembered: Bool
    public init(threadID: ThreadID, address: String, remembered: Bool = false) {
        self.threadID = threadID
        self.address = address
        self.remembered = remembered
    }
    // No address: clients are never told where instances are.
    public var description: String { "thread \(threadID) is owned by another instance" }
}

public enum LeaseClaim: Sendable, Equatable {
    case held(LeaseFence)
    /// A live lease of another instance.
    case elsewhere(address: String)
}

/// Grants agent trees to one instance at a time, through a lease the store
/// keeps (owner, advertised address, epoch, expiry). Every grant raises the
/// epoch, so fences of earlier holders stop working.
public protocol OwnershipCoordinator: Sendable {
    /// How long a grant lasts without renewal.
    var leaseDuration: Duration { get }
    /// The listener is bound (to `port`, when the configured one was 0):
    /// called before any lease is taken.
    func bound(port: Int)
    /// Grants the tree to this instance if nobody holds it or its lease
    /// expired (a new epoch), else names the live holder.
    func acquire(_ tree: ThreadID) async throws -> LeaseClaim
    /// Extends the leases this instance still holds; returns those (a fence
    /// missing from the answer was taken over).
    func renew(_ fences: [LeaseFence]) async throws -> Set<LeaseFence>
    /// Gives a tree up at once (its expiry becomes now; the epoch stays, so
    /// the next grant is a higher one).
    func release(_ fences: [LeaseFence]) async
    /// The advertised address of another instance holding a live lease on
    /// the tree (nil: nobody, or this instance).
    func holder(_ tree: ThreadID) async throws -> String?
    /// Threads with a turn stored as running whose tree no live instance
    /// holds: left by a dead instance, waiting to be recovered.
    func orphanedRunningThreads() async throws -> [ThreadID]
    /// Returns once the store answers (a round trip), throws if it cannot.
    func probe() async throws
    /// Per-principal budgets kept where every instance sees them (nil: each
    /// instance keeps its own).
    var sharedQuotas: (any SharedQuotaLedger)? { get }
    /// This instance's id among those of the store.
    var instanceID: String { get }
    /// The live leases of the store, by tree (at most `limit`), and how many
    /// each instance holds (all of them), for an operator's view.
    func liveLeases(limit: Int) async throws -> LeaseTable
}

extension OwnershipCoordinator {
    public var sharedQuotas: (any SharedQuotaLedger)? { nil }
}

/// The store's live leases as an operator sees them.
public struct LeaseTable: Sendable, Equatable {
    public struct Lease: Sendable, Equatable {
        public var tree: ThreadID
        public var instanceID: String
        public var address: String
        public var epoch: Int64
        public var expiresInMs: Int64
        public init(tree: ThreadID, instanceID: String, address: String, epoch: Int64, expiresInMs: Int64) {
            self.tree = tree
            self.instanceID = instanceID
            self.address = address
            self.epoch = epoch
            self.expiresInMs = expiresInMs
        }
    }

    public struct Holder: Sendable, Equatable {
        public var instanceID: String
        public var address: String
        public var liveLeases: Int
        public init(instanceID: String, address: String, liveLeases: Int) {
            self.instanceID = instanceID
            self.address = address
            self.liveLeases = liveLeases
        }
    }

    public var leases: [Lease]
    public var holders: [Holder]
    public init(leases: [Lease], holders: [Holder]) {
        self.leases = leases
        self.holders = holders
    }
}

/// Which instance owned threads this one relayed for, remembered briefly so
/// a stream of requests for a thread owned elsewhere does not ask the store
/// twice per request. A stale entry costs one relay that the former owner
/// refuses or takes over (its lease lapsed), after which the server forgets
/// the entry and looks again.
final class KnownOwners: Sendable {
    private let table = Mutex<[ThreadID: (address: String, until: ContinuousClock.Instant)]>([:])
    private let ttl: Duration
    private static let capacity = 10_000

    init(ttl: Duration) { self.ttl = ttl }

    func address(_ thread: ThreadID) -> String? {
        table.withLock { table in
            guard let entry = table[thread] else { return nil }
            guard entry.until > .now else {
                table[thread] = nil
                return nil
            }
            return entry.address
        }
    }

    func remember(_ thread: ThreadID, at address: String) {
        let now = ContinuousClock.now
        table.withLock { table in
            if table.count >= Self.capacity {
                table = table.filter { $0.value.until > now }
                if table.count >= Self.capacity { table.removeAll() }
            }
            table[thread] = (address, now + ttl)
        }
    }

    func forget(_ thread: ThreadID) { _ = table.withLock { $0.removeValue(forKey: thread) } }
}

/// The trees this process holds and which of its loaded threads use each.
/// A tree is held while any of its threads is loaded here.
///
/// Also until when every held lease is surely still this instance's, on the
/// monotonic clock: from the start of the last renewal (or of the first
/// grant while none was held) plus the lease less a safety margin. The
/// database decides expiry by its own clock from the moment it ran the
/// statement, which is after the start measured here; the margin covers
/// clocks that run at slightly different rates. Wall clocks play no part.
final class HeldTrees: Sendable {
    struct Entry {
        var fence: LeaseFence
        var threads: Set<ThreadID>
        var grantedAt: ContinuousClock.Instant
    }
    private let table = Mutex<[ThreadID: Entry]>([:])
    /// Nanoseconds of the monotonic clock (0: nothing held).
    private let validUntilNanos = Atomic<UInt64>(0)
    /// When the store last confirmed the leases (a grant's or renewal's start).
    private let confirmed = Mutex<ContinuousClock.Instant?>(nil)

    var lastConfirmed: ContinuousClock.Instant? { confirmed.withLock { $0 } }

    /// The tree's fence if held (the thread joins it).
    func join(_ tree: ThreadID, _ thread: ThreadID) -> LeaseFence? {
        table.withLock { table in
            guard var entry = table[tree] else { return nil }
            entry.threads.insert(thread)
            table[tree] = entry
            return entry.fence
        }
    }

    /// A grant asked for at `asked`: valid for `validFor` from then. The
    /// first tree held starts the validity; later ones are covered by it
    /// (their grants are newer than the renewal it counts from).
    func granted(_ fence: LeaseFence, thread: ThreadID, asked: ContinuousClock.Instant, validFor: Duration) {
        table.withLock { table in
            if table.isEmpty {
                validUntilNanos.store(Self.nanos(asked + validFor), ordering: .relaxed)
                confirmed.withLock { $0 = asked }
            }
            table[fence.tree] = Entry(fence: fence, threads: [thread], grantedAt: .now)
        }
    }

    /// The thread left; returns the fence to release when it was the last.
    func leave(_ fence: LeaseFence, _ thread: ThreadID) -> LeaseFence? {
        table.withLock { table in
            guard var entry = table[fence.tree], entry.fence == fence else { return nil }
            entry.threads.remove(thread)
            if entry.threads.isEmpty {
                table[fence.tree] = nil
                if table.isEmpty { validUntilNanos.store(0, ordering: .relaxed) }
                return fence
            }
            table[fence.tree] = entry
            return nil
        }
    }

    /// Forgets a tree whose lease moved on (or was given up); returns its threads.
    func lost(_ fence: LeaseFence) -> Set<ThreadID> {
        table.withLock { table in
            guard let entry = table[fence.tree], entry.fence == fence else { return [] }
            table[fence.tree] = nil
            if table.isEmpty { validUntilNanos.store(0, ordering: .relaxed) }
            return entry.threads
        }
    }

    var all: [Entry] { table.withLock { Array($0.values) } }

    /// Whether the tree is still held under this very fence.
    func holds(_ fence: LeaseFence) -> Bool { table.withLock { $0[fence.tree]?.fence == fence } }

    func removeAll() -> [LeaseFence] {
        table.withLock { table in
            defer {
                table.removeAll()
                validUntilNanos.store(0, ordering: .relaxed)
            }
            return table.values.map(\.fence)
        }
    }

    /// A renewal that started at `start` answered: every lease it kept is
    /// valid for `validFor` from then.
    func renewed(from start: ContinuousClock.Instant, validFor: Duration) {
        table.withLock { table in
            guard !table.isEmpty else { return }
            validUntilNanos.store(Self.nanos(start + validFor), ordering: .relaxed)
            confirmed.withLock { $0 = start }
        }
    }

    /// False once the leases may have expired unrenewed (the process was
    /// paused or the database unreachable): loaded state may then be stale,
    /// and nothing may be committed under them.
    var surelyValid: Bool {
        let until = validUntilNanos.load(ordering: .relaxed)
        return until == 0 || Self.nanos(.now) < until
    }

    /// How long until the held leases may lapse; nil when none is held.
    var timeUntilLapse: Duration? {
        let until = validUntilNanos.load(ordering: .relaxed)
        guard until != 0 else { return nil }
        let now = Self.nanos(.now)
        return until > now ? .nanoseconds(Int64(until - now)) : .zero
    }

    private static func nanos(_ instant: ContinuousClock.Instant) -> UInt64 {
        let elapsed = instant - Self.origin
        let (seconds, attoseconds) = elapsed.components
        return UInt64(max(0, seconds)) * 1_000_000_000 + UInt64(max(0, attoseconds) / 1_000_000_000)
    }
    /// Far enough back that every instant this process deals with comes
    /// after it (it is taken lazily, at first use: a grant asked for a
    /// while before that must not land before it, which would read as
    /// "nothing held", that is, valid for ever).
    private static let origin = ContinuousClock.now - .seconds(365 * 24 * 3600)
}

/// Why this instance is not sure of its leases: renewals have failed since
/// `since`, the last with `error`.
struct LeaseTrouble: Sendable {
    var since: ContinuousClock.Instant
    var error: String
}
