public import ThreadwireCore
public import ThreadwireWire

/// Domain events as notifications on the wire: with Mapping.swift, the one
/// place the domain meets the contract.
public enum NotificationMapping {
    /// The method of `payload(event)` without building it (a kept event's
    /// encoding is sent as it is; its method still counts for opt-outs).
    public static func methodName(_ event: ThreadEvent) -> String? {
        switch event {
        case .threadStarted: "thread/started"
        case .statusChanged: "thread/status/changed"
        case .archived: "thread/archived"
        case .unarchived: "thread/unarchived"
        case .closed: "thread/closed"
        case .settingsUpdated: "thread/settings/updated"
        case .turnStarted: "turn/started"
        case .turnCompleted: "turn/completed"
        case .itemStarted: "item/started"
        case .itemCompleted: "item/completed"
        case .agentMessageDelta: "item/agent_message/delta"
        case .serverRequestResolved: "server_request/resolved"
        case .tokenUsage: "thread/token_usage/updated"
        case .rolledBack: "thread/rolled_back"
        case .reverted: "thread/reverted"
        case .queueUpdated: "thread/queue/updated"
        case .deleted: "thread/deleted"
        case .nameUpdated: "thread/name/updated"
        case .serverRequest, .replayed: nil
        }
    }

    /// nil for an event that is not a notification (a server request) or
    /// is one already encoded (a replay).
    public static func payload(_ event: ThreadEvent, baseInstructions: (ThreadRecord) -> String) -> Wire.Notification.Payload? {
        switch event {
        case let .threadStarted(view):
            return .threadStarted(Wire.ThreadStartedNotification(thread: view.wire(baseInstructions: baseInstructions(view.record))))
        case let .statusChanged(id, status):
            return .threadStatusChanged(Wire.ThreadStatusChangedNotification(threadId: id, status: status.wire))
        case let .archived(id):
            return .threadArchived(Wire.ThreadArchivedNotification(threadId: id))
        case let .unarchived(id):
            return .threadUnarchived(Wire.ThreadUnarchivedNotification(threadId: id))
        case let .closed(id):
            return .threadClosed(Wire.ThreadClosedNotification(threadId: id))
        case let .settingsUpdated(id, settings):
            return .threadSettingsUpdated(Wire.ThreadSettingsUpdatedNotification(threadId: id, settings: settings.wire))
        case let .turnStarted(id, turn):
            return .turnStarted(Wire.TurnStartedNotification(threadId: id, turn: turn.wire()))
        case let .turnCompleted(id, turn):
            return .turnCompleted(Wire.TurnCompletedNotification(threadId: id, turn: turn.wire()))
        case let .itemStarted(id, turnID, item):
            return .itemStarted(Wire.ItemStartedNotification(threadId: id, turnId: turnID, item: item.wire))
        case let .itemCompleted(id, turnID, item):
            return .itemCompleted(Wire.ItemCompletedNotification(threadId: id, turnId: turnID, item: item.wire))
        case let .agentMessageDelta(id, turnID, itemID, delta):
            return .itemAgentMessageDelta(Wire.ItemAgentMessageDeltaNotification(threadId: id, turnId: turnID, itemId: itemID, delta: delta))
        case let .serverRequestResolved(id, requestID, outcome):
            return .serverRequestResolved(Wire.ServerRequestResolvedNotification(threadId: id, requestId: requestID, outcome: outcome.wire))
        case let .tokenUsage(id, turnID, report):
            return .threadTokenUsageUpdated(Wire.ThreadTokenUsageUpdatedNotification(
                threadId: id, turnId: turnID, last: report.last.wire, total: report.total.wire,
                contextWindow: report.contextWindow.map(UInt64.init), nextRequestShare: report.nextRequestShare))
        case let .rolledBack(id, turnIDs):
            return .threadRolledBack(Wire.ThreadRolledBackNotification(threadId: id, turnIds: turnIDs))
        case let .reverted(id, turnIDs):
            return .threadReverted(Wire.ThreadRevertedNotification(threadId: id, turnIds: turnIDs))
        case let .deleted(id):
            return .threadDeleted(Wire.ThreadDeletedNotification(threadId: id))
        case let .queueUpdated(id, queue):
            return .threadQueueUpdated(Wire.ThreadQueueUpdatedNotification(threadId: id, queue: queue.map(\.wire)))
        case let .nameUpdated(id, name):
            return .threadNameUpdated(Wire.ThreadNameUpdatedNotification(threadId: id, name: name))
        case .serverRequest, .replayed:
            // A replay is sent as it was stored (`ConnectionRegistry`).
            return nil
        }
    }
}
