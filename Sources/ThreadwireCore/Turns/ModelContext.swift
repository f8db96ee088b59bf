/// What the model is shown of an append-only history. History is never
/// rewritten: a compaction appends a summary that hides everything before it,
/// a rollback appends a marker that hides a range, and this is the one place
/// that reads them (model calls and `include_model_requests` both go through
/// `ModelRequestRecord.request`).
public enum ModelContext {
    /// The visible items of a history prefix, oldest first. Walks backwards:
    /// a rollback marker skips to just before the range it took back (so a
    /// summary inside that range is skipped too and the context is what it was
    /// before the rolled-back turns); the newest summary reached ends the walk.
    public static func visible<History: RandomAccessCollection<ContextItem>>(_ history: History) -> [ContextItem] where History.Index == Int {
        visibleIndices(history).map { history[$0] }
    }

    /// The history sequences of `visible`, ascending.
    public static func visibleIndices<History: RandomAccessCollection<ContextItem>>(_ history: History) -> [Int] where History.Index == Int {
        var reversed: [Int] = []
        var index = history.endIndex - 1
        while index >= history.startIndex {
            let item = history[index]
            switch item.kind {
            case .rollbackMarker:
                index = min(index, item.rollsBackFrom ?? index) - 1
                continue
            case .compactionSummary:
                reversed.append(index)
                return reversed.reversed()
            case .historyReplaced:
                return reversed.reversed()
            default:
                reversed.append(index)
            }
            index -= 1
        }
        return reversed.reversed()
    }

    /// Rough tokens of text (4 bytes a token), for items no provider has
    /// counted yet.
    public static func estimatedTokens(_ items: some Sequence<ContextItem>) -> Int {
        items.reduce(0) { $0 + ($1.text.utf8.count + ($1.toolName?.utf8.count ?? 0) + 3) / 4 + 4 }
    }
}
