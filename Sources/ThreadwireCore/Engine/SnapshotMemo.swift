import Foundation
public import Synchronization

/// Keeps one value derived from one published snapshot (the server keeps a
/// thread/read answer's encoding here), so readers of an unchanged thread
/// derive it once. Made anew with every publish, so it cannot go stale.
public final class SnapshotMemo: Sendable {
    @usableFromInline let slot = Mutex<(any AnyObject & Sendable)?>(nil)

    public init() {}

    /// The kept value if it is a `T`, else `make()`, kept for next time.
    /// Two readers racing may both make it; either result is the same.
    /// Inlinable, so a reader's `T` is known where it is read: a class check
    /// rather than a cast out of an existential on every thread/read (issue 54).
    @inlinable
    public func value<T: Sendable>(_ make: () throws -> T) rethrows -> T {
        if let kept = slot.withLock({ $0 }) as? Kept<T> { return kept.value }
        let made = try make()
        slot.withLock { $0 = Kept(made) }
        return made
    }

    @usableFromInline
    final class Kept<T: Sendable>: Sendable {
        @usableFromInline let value: T
        @usableFromInline init(_ value: T) { self.value = value }
    }
}
