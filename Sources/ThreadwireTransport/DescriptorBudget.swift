#if canImport(Glibc)
import Glibc
#endif
import Foundation
import NIOCore
import Synchronization

/// The file descriptors the server's connections may hold, so that the
/// process never runs out of them because of its clients.
///
/// Running out is not only a refused accept: libdispatch, which runs Swift's
/// timers and blocking work on Linux, opens descriptors when it needs them
/// and kills the process when it cannot. While its global queues have work
/// waiting it opens /proc/<tid>/stat of each worker once a second, and a
/// failed open is a client crash (SIGILL, "workq: registered worker exited
/// prematurely"): a CI run of the descriptor-exhaustion test died so. So a
/// connection that would leave fewer than `reserved` descriptors free is
/// refused when it arrives, before accept ever fails; the descriptor reserve
/// (`DescriptorReserve`) stays for when something else used them up.
public final class DescriptorBudget: Sendable {
    /// Descriptors all connections together may hold.
    public let capacity: Int
    /// Kept free for the runtime, the store's files and child processes.
    public let reserved: Int
    /// The process's soft RLIMIT_NOFILE when the budget was measured.
    public let fileLimit: Int
    private let held = Atomic<Int>(0)
    private let lingering = Atomic<Int>(0)
    private let accepted = Atomic<Int>(0)
    private let warnings = WarningEpisodes()

    public init(capacity: Int, reserved: Int, fileLimit: Int) {
        self.capacity = capacity
        self.reserved = reserved
        self.fileLimit = fileLimit
    }

    /// What the soft limit leaves once the descriptors open now and the
    /// reserve are set aside.
    public static func measure() -> DescriptorBudget {
        let limit = softLimit()
        let reserved = reserve(forLimit: limit)
        return DescriptorBudget(capacity: max(0, limit - openDescriptors(below: limit) - reserved), reserved: reserved, fileLimit: limit)
    }

    /// One in sixteen of the limit, at least 16 and at most 64: enough for
    /// the refusals in flight and the listener's batch of accepts (see
    /// `AcceptGate`), libdispatch's one at a time, SQLite's reader
    /// connections, a probe file and a child process's pipes, without taking
    /// much of a large limit.
    static func reserve(forLimit limit: Int) -> Int { min(64, max(16, limit / 16)) }

    /// Connections accepted past the capacity that may be open at once while
    /// they are refused; the listener pauses at that many.
    public var refusalSlack: Int { max(2, reserved / 4) }

    /// Takes `count` descriptors for a new connection; false (nothing
    /// taken) if that would go past the capacity.
    public func take(_ count: Int) -> Bool {
        var current = held.load(ordering: .relaxed)
        while current + count <= capacity {
            let (exchanged, original) = held.compareExchange(expected: current, desired: current + count, ordering: .relaxed)
            if exchanged { return true }
            current = original
        }
        return false
    }

    /// Gives back what a closed connection took.
    public func give(_ count: Int) {
        held.subtract(count, ordering: .relaxed)
    }

    /// Every transport's way in: takes `count` descriptors for a new
    /// connection, or tells `events` of the refusal (worth a warning once an
    /// episode) and takes nothing.
    func admit(_ count: Int, events: TransportEvents) -> Bool {
        if take(count) { return true }
        events.refusedOutOfDescriptors(exhausted, shouldWarn())
        return false
    }

    /// Gives `count` back once `channel`, which holds them, closes.
    func giveBack(_ count: Int, whenClosed channel: any Channel) {
        channel.closeFuture.whenComplete { _ in self.give(count) }
    }

    /// A refused connection may stay open a moment so its client reads the
    /// refusal (see `RefuseConnectionHandler`), on a descriptor of the
    /// reserve: the refusals' slack at most. False: close it at once.
    public func takeLinger() -> Bool {
        let cap = refusalSlack
        var current = lingering.load(ordering: .relaxed)
        while current < cap {
            let (exchanged, original) = lingering.compareExchange(expected: current, desired: current + 1, ordering: .relaxed)
            if exchanged { return true }
            current = original
        }
        return false
    }

    public func giveLinger() {
        lingering.subtract(1, ordering: .relaxed)
    }

    /// A listener accepted a connection (served or to be refused) / one it
    /// accepted closed. Returns how many are open now.
    @discardableResult
    func acceptedOpened() -> Int { accepted.add(1, ordering: .relaxed).newValue }
    @discardableResult
    func acceptedClosed() -> Int { accepted.subtract(1, ordering: .relaxed).newValue }

    /// Whether a listener should accept more now: not while the connections
    /// it accepted fill the capacity and the refusals' slack, so that a flood
    /// waits in the kernel's backlog instead of taking the reserve.
    var acceptsMore: Bool { accepted.load(ordering: .relaxed) < capacity + refusalSlack }

    /// Descriptors connections hold now.
    public var inUse: Int { held.load(ordering: .relaxed) }

    /// One warning per episode rather than one per refused connection.
    func shouldWarn() -> Bool { warnings.begins() }

    /// Why a connection was refused, for the log and the metrics.
    public var exhausted: Exhausted { Exhausted(capacity: capacity, reserved: reserved, fileLimit: fileLimit) }

    public struct Exhausted: Error, CustomStringConvertible, Equatable {
        public let capacity: Int
        public let reserved: Int
        public let fileLimit: Int
        public var description: String {
            "connections hold all \(capacity) descriptors the file limit (\(fileLimit)) leaves them (\(reserved) more are kept free for the runtime)"
        }
    }

    /// The soft RLIMIT_NOFILE (Int.max when unlimited).
    public static func softLimit() -> Int {
        var limit = rlimit()
        guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 else { return Int(FD_SETSIZE) }
        return limit.rlim_cur >= rlim_t(Int.max) ? Int.max : Int(limit.rlim_cur)
    }

    /// Raises the soft file limit to the hard one (at most `ceiling`), as Go
    /// programs do at startup: the soft limit is often 1,024 while the hard
    /// one allows far more, and a server should not refuse clients for a
    /// default nobody chose. Returns the limits before and after.
    @discardableResult
    public static func raiseSoftLimit(ceiling: Int = 1 << 20) -> (before: Int, after: Int) {
        var limit = rlimit()
        guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 else { return (softLimit(), softLimit()) }
        let before = limit.rlim_cur
        let target = min(limit.rlim_max, rlim_t(ceiling))
        if target > before {
            limit.rlim_cur = target
            _ = setrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
        }
        return (Int(min(before, rlim_t(Int.max))), softLimit())
    }

    /// Descriptors the process has open below `limit` (Linux's /proc; 0
    /// elsewhere): one inherited above the limit takes no place under it.
    public static func openDescriptors(below limit: Int = Int.max) -> Int {
        let names = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd")) ?? []
        // The directory's own descriptor is listed too.
        return max(0, names.compactMap { Int($0) }.filter { $0 < limit }.count - 1)
    }
}
