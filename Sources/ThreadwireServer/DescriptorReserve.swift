#if canImport(Glibc)
import Glibc
#endif
import NIOCore
import Synchronization

/// One file descriptor kept in reserve for running out of them. When accept
/// fails with EMFILE/ENFILE the pending connection stays in the backlog and
/// the listener stays readable, so the event loop would retry at once, for
/// ever (NIO keeps the read pending after a failed accept, so a delayed read
/// alone does not stop it). Releasing the spare lets the next accept succeed;
/// that connection gets an UNAVAILABLE error frame and is closed, and the
/// spare is taken back: the backlog drains with clear errors instead of a
/// spinning core.
final class DescriptorReserve: Sendable {
    private let spare = Mutex<Int32>(-1)
    /// Connections accepted on the released spare, still to be refused.
    private let toRefuse = Atomic<Int>(0)

    init() { reacquire() }

    func reacquire() {
        spare.withLock { fd in
            if fd < 0 { fd = open("/dev/null", O_RDONLY | O_CLOEXEC) }
        }
    }

    static func isOutOfDescriptors(_ error: IOError) -> Bool {
        error.errnoCode == EMFILE || error.errnoCode == ENFILE
    }

    /// Frees the spare; true if there was one (the next accept can succeed).
    func release() -> Bool {
        spare.withLock { fd in
            guard fd >= 0 else { return false }
            close(fd)
            fd = -1
            toRefuse.add(1, ordering: .relaxed)
            return true
        }
    }

    /// True for a connection that must be refused because it took the spare.
    func takeRefusal() -> Bool {
        var current = toRefuse.load(ordering: .relaxed)
        while current > 0 {
            let (done, original) = toRefuse.compareExchange(expected: current, desired: current - 1, ordering: .relaxed)
            if done { return true }
            current = original
        }
        return false
    }
}
