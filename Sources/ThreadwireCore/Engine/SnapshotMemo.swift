import Foundation
import Synchronization

/// Keeps one value derived from one published snapshot (the server keeps a
/// thread/read answer's encoding here), so readers of an unchanged thread
/// derive it once. Made anew with every publish, so it cannot go stale.
public final class SnapshotMemo: Sendable {
    private let slot = Mutex<(any Sendable)?>(nil)

    public init() {}

    /// The kept value if it is a `T`, else `make()`, kept for next time.
    /// Two readers racing may both make it; either result is the same.
    public func value<T: Sendable>(_ make: () throws -> T) rethrows -> T {
        if let kept = slot.withLock({ $0 }) as? T { return kept }
        let made = try make()
        slot.withLock { $0 = made }
        return made
    }
}
