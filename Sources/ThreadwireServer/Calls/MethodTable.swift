import ThreadwireContract
import ThreadwireCore
import ThreadwireWire

/// The method table, as data: for each method its name, the params it takes,
/// the field naming its thread, whether it mutates, whether it needs the
/// handshake, and its handlers (inline and suspending). The dispatcher reads
/// all of it; handlers hold only what is particular to their method.
enum MethodTable {
    static let methods: [String: MethodSpec] = {
        let specs: [MethodSpec] = [
            .method("initialize", params: { if case let .initialize(p) = $0 { p } else { nil } },
                    mutates: false, requiresHandshake: false, inline: SessionHandlers.initialize),
            .method("health/check", params: { if case let .healthCheck(p) = $0 { p } else { nil } },
                    mutates: false, requiresHandshake: false, inline: SessionHandlers.healthCheck, run: SessionHandlers.healthCheckQueued),
            .method("reflection/descriptors", params: { if case let .reflectionDescriptors(p) = $0 { p } else { nil } },
                    mutates: false, requiresHandshake: false, inline: SessionHandlers.reflectionDescriptors),
            .method("thread/start", params: { if case let .threadStart(p) = $0 { p } else { nil } },
                    mutates: true, run: ThreadHandlers.start),
            .method("thread/resume", params: { if case let .threadResume(p) = $0 { p } else { nil } },
                    thread: ("thread_id", { $0.threadId }), mutates: true, run: ThreadHandlers.resume),
            .method("thread/subscribe", params: { if case let .threadSubscribe(p) = $0 { p } else { nil } },
                    thread: ("thread_id", { $0.threadId }), mutates: false, run: ThreadHandlers.subscribe),
            .method("thread/fork", params: { if case let .threadFork(p) = $0 { p } else { nil } },
                    thread: ("thread_id", { $0.threadId }), mutates: true, run: ThreadHandlers.fork),
            .method("thread/read", params: { if case let .threadRead(p) = $0 { p } else { nil } },
                    thread: ("thread_id", { $0.threadId }), mutates: false, operatorReads: true,
                    inline: ThreadHandlers.readInline, run: ThreadHandlers.read),
            .method("thread/list", params: { if case let .threadList(p) = $0 { p } else { nil } },
                    mutates: false, run: ThreadHandlers.list),
            .method("thread/turns/list", params: { if case let .threadTurnsList(p) = $0 { p } else { nil } },
                    thread: ("thread_id", { $0.threadId }), mutates: false, operatorReads: true, run: ThreadHandlers.turnsList),
            .method("thread/archive", params: { if case let .threadArchive(p) = $0 { p } else { nil } },
                    thread: ("thread_id", { $0.threadId }), mutates: true, run: ThreadHandlers.archive),
            .method("thread/unarchive", params: { if case let .threadUnarchive(p) = $0 { p } else { nil } },
                    thread: ("thread_id", { $0.threadId }), mutates: true, run: ThreadHandlers.unarchive),
            .method("thread/unsubscribe", params: { if case let .threadUnsubscribe(p) = $0 { p } else { nil } },
                    thread: ("thread_id", { $0.threadId }), mutates: true, run: ThreadHandlers.unsubscribe),
            .method("thread/settings/update", params: { if case let .threadSettingsUpdate(p) = $0 { p } else { nil } },
                    thread: ("thread_id", { $0.threadId }), mutates: true, run: ThreadHandlers.updateSettings),
            .method("thread/tools/update", params: { if case let .threadToolsUpdate(p) = $0 { p } else { nil } },
                    thread: ("thread_id", { $0.threadId }), mutates: true, run: ThreadHandlers.updateTools),
            .method("thread/compact/start", params: { if case let .threadCompactStart(p) = $0 { p } else { nil } },
                    thread: ("thread_id", { $0.threadId }), mutates: true, run: ThreadHandlers.compactStart),
            .method("thread/rollback", params: { if case let .threadRollback(p) = $0 { p } else { nil } },
                    thread: ("thread_id", { $0.threadId }), mutates: true, run: ThreadHandlers.rollback),
            .method("thread/revert", params: { if case let .threadRevert(p) = $0 { p } else { nil } },
                    thread: ("thread_id", { $0.threadId }), mutates: true, run: ThreadHandlers.revert),
            .method("thread/delete", params: { if case let .threadDelete(p) = $0 { p } else { nil } },
                    thread: ("thread_id", { $0.threadId }), mutates: true, run: ThreadHandlers.delete),
            .method("thread/items/list", params: { if case let .threadItemsList(p) = $0 { p } else { nil } },
                    thread: ("thread_id", { $0.threadId }), mutates: false, operatorReads: true, run: ThreadHandlers.itemsList),
            .method("thread/loaded/list", params: { if case let .threadLoadedList(p) = $0 { p } else { nil } },
                    mutates: false, inline: ThreadHandlers.loadedList),
            .method("thread/queue/list", params: { if case let .threadQueueList(p) = $0 { p } else { nil } },
                    thread: ("thread_id", { $0.threadId }), mutates: false, run: TurnHandlers.queueList),
            .method("thread/queue/update", params: { if case let .threadQueueUpdate(p) = $0 { p } else { nil } },
                    thread: ("thread_id", { $0.threadId }), mutates: true, run: TurnHandlers.queueUpdate),
            .method("thread/queue/delete", params: { if case let .threadQueueDelete(p) = $0 { p } else { nil } },
                    thread: ("thread_id", { $0.threadId }), mutates: true, run: TurnHandlers.queueDelete),
            .method("thread/queue/reorder", params: { if case let .threadQueueReorder(p) = $0 { p } else { nil } },
                    thread: ("thread_id", { $0.threadId }), mutates: true, run: TurnHandlers.queueReorder),
            .method("thread/import", params: { if case let .threadImport(p) = $0 { p } else { nil } },
                    mutates: true, run: ImportHandlers.importRollout),
            .method("thread/name/set", params: { if case let .threadNameSet(p) = $0 { p } else { nil } },
                    thread: ("thread_id", { $0.threadId }), mutates: true, run: ThreadHandlers.setName),
            .method("model/list", params: { if case let .modelList(p) = $0 { p } else { nil } },
                    mutates: false, inline: SessionHandlers.modelList),
            .method("mcp_server/list", params: { if case let .mcpServerList(p) = $0 { p } else { nil } },
                    mutates: false, inline: SessionHandlers.mcpServerList),
            .method("agent/spawn", params: { if case let .agentSpawn(p) = $0 { p } else { nil } },
                    thread: ("parent_thread_id", { $0.parentThreadId }), mutates: true, run: ThreadHandlers.spawnAgent),
            .method("turn/start", params: { if case let .turnStart(p) = $0 { p } else { nil } },
                    thread: ("thread_id", { $0.threadId }), mutates: true, run: TurnHandlers.start),
            .method("turn/interrupt", params: { if case let .turnInterrupt(p) = $0 { p } else { nil } },
                    thread: ("thread_id", { $0.threadId }), mutates: true, run: TurnHandlers.interrupt),
            .method("turn/steer", params: { if case let .turnSteer(p) = $0 { p } else { nil } },
                    thread: ("thread_id", { $0.threadId }), mutates: true, run: TurnHandlers.steer),
            .method("cluster/status", params: { if case let .clusterStatus(p) = $0 { p } else { nil } },
                    mutates: false, run: SessionHandlers.clusterStatus),
            .method("turn/continue", params: { if case let .turnContinue(p) = $0 { p } else { nil } },
                    thread: ("thread_id", { $0.threadId }), mutates: true, run: TurnHandlers.continueTurn),
        ]
        return Dictionary(uniqueKeysWithValues: specs.map { ($0.name, $0) })
    }()

    /// The entries by `Wire.Request.Params.caseIndex`, nil for a case this
    /// server does not implement: admission's lookup, with no name hashed.
    private static let byCase: [MethodSpec?] = Wire.Request.Params.methodNames.map { methods[$0] }

    static func spec(for params: Wire.Request.Params) -> MethodSpec? { byCase[params.caseIndex] }

    // MARK: Validation shared by handlers

    static func required(_ value: String?, _ field: String) throws -> String {
        guard let value, !value.isEmpty else { throw RequestError(.invalidArgument, "\(field) is required") }
        return value
    }

    static func modeUpdate(_ update: Wire.TurnStartParams.MultiAgentModeUpdate?, field: String) throws -> ModeUpdate {
        switch update {
        case nil: return .keep
        case let .multiAgentMode(mode)?:
            guard let mode = MultiAgentMode(wire: mode) else {
                throw RequestError(.invalidArgument, "\(field).multi_agent_mode must be EXPLICIT_REQUEST_ONLY or PROACTIVE (omit it to keep the selection, or set clear_multi_agent_mode)")
            }
            return .set(mode)
        case let .clearMultiAgentMode(clear)?:
            guard clear else { throw RequestError(.invalidArgument, "\(field).clear_multi_agent_mode must be true when present") }
            return .clear
        }
    }
}
