import Foundation
import Synchronization

/// One published snapshot of a loaded thread and its memo. A class, so a
/// reader takes it out of the directory with one retain rather than one per
/// string of the record: readers on every event loop share the same objects,
/// and each atomic reference count they touch moves a cache line between cores.
public final class PublishedThread: Sendable {
    let stored: StoredThread
    public let memo: SnapshotMemo
    /// The lease the state was committed under (nil with one instance): the
    /// snapshot is served only while this instance still holds it.
    let fence: LeaseFence?

    init(stored: StoredThread, memo: SnapshotMemo, fence: LeaseFence?) {
        self.stored = stored
        self.memo = memo
        self.fence = fence
    }

    /// The principal the thread belongs to.
    public var principal: Principal { stored.record.principal }

    public func view(includeTurns: Bool, includeModelRequests: Bool, turnsLimit: Int = .max) -> ThreadView {
        var view = ThreadView(stored: stored, includeTurns: false, includeHistory: includeModelRequests)
        if includeTurns { view.setNewestTurns(stored.turns, limit: turnsLimit) }
        return view
    }
}
