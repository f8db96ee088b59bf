/// The multi-agent runtime a thread is pinned to (see proto MultiAgentRuntime).
public enum MultiAgentRuntime: String, Sendable, Codable, CaseIterable {
    case disabled, v1, v2
}

/// A delegation policy (see proto MultiAgentMode).
public enum MultiAgentMode: String, Sendable, Codable, CaseIterable {
    case explicitRequestOnly, proactive
}

/// How a thread's history came to be, which decides what an unrecorded
/// runtime means: a new thread resolves at its first turn, a resumed or forked
/// one with nothing recorded is a legacy thread.
public enum HistoryOrigin: Sendable {
    case new, resumed, forked
}

/// Pure runtime resolution, in the order of the seed PRs (reference §2.2).
public enum RuntimeResolver {
    /// At load/creation: from inheritance and history only. nil = unresolved
    /// (a new thread, decided by its first turn).
    public static func resolveAtLoad(
        inherited: MultiAgentRuntime?, recorded: MultiAgentRuntime?, origin: HistoryOrigin
    ) -> MultiAgentRuntime? {
        if inherited == .disabled { return .disabled }
        if let recorded { return recorded }
        if let inherited { return inherited }
        switch origin {
        case .new: return nil
        case .resumed, .forked: return .v1  // legacy threads keep the legacy tool surface
        }
    }

    /// At the first turn of an unresolved thread: the catalog selector for the
    /// turn's model beats local feature flags.
    public static func resolveAtFirstTurn(catalogSelector: MultiAgentRuntime?, flags: FeatureFlags) -> MultiAgentRuntime {
        if let catalogSelector { return catalogSelector }
        if flags.multiAgentV2 { return .v2 }
        if flags.multiAgent { return .v1 }
        return .disabled
    }
}

/// What kind of thread this is, for rules that depend on it.
public enum ThreadSourceKind: String, Sendable, Codable, CaseIterable {
    case appServer, threadSpawn, review, imported

    /// Roots and spawned children may carry a mode; review and other internal threads never do.
    var acceptsMultiAgentMode: Bool { self != .review }
}

/// Pure multi-agent mode rules (reference §3.2, §3.3).
public enum ModeRules {
    public static func isApplicable(runtime: MultiAgentRuntime?, usageHintEnabled: Bool, source: ThreadSourceKind) -> Bool {
        runtime == .v2 && usageHintEnabled && source.acceptsMultiAgentMode
    }

    /// The effective mode of a turn; nil when not applicable.
    public static func effective(
        selected: MultiAgentMode?, runtime: MultiAgentRuntime?, usageHintEnabled: Bool,
        source: ThreadSourceKind, gateEnabled: Bool
    ) -> MultiAgentMode? {
        guard isApplicable(runtime: runtime, usageHintEnabled: usageHintEnabled, source: source) else { return nil }
        return gateEnabled ? (selected ?? .explicitRequestOnly) : .explicitRequestOnly
    }

    /// The previous turn's persisted effective mode, or no previous turn at all.
    public enum Baseline: Sendable, Equatable {
        case noPreviousTurn
        case previous(MultiAgentMode?)
    }

    /// Which fragment (if any) a turn appends. History is never rewritten: a
    /// change is expressed by a new fragment that supersedes the old one.
    public static func fragmentToEmit(baseline: Baseline, current: MultiAgentMode?) -> MultiAgentMode? {
        switch baseline {
        case .noPreviousTurn:
            return current
        case let .previous(previous):
            if previous == current { return nil }
            if let current { return current }
            // Leaving proactive for "not applicable" must neutralise the old instruction.
            return previous == .proactive ? .explicitRequestOnly : nil
        }
    }

    public static let openTag = "<multi_agent_mode>"
    public static let closeTag = "</multi_agent_mode>"

    /// Bounded developer text for each mode.
    public static func fragmentText(_ mode: MultiAgentMode) -> String {
        let body: String
        switch mode {
        case .explicitRequestOnly:
            body = "Multi-agent mode: explicitRequestOnly. Any earlier proactive-delegation instruction no longer applies. "
                + "Do not spawn sub-agents unless the user, AGENTS.md or a skill explicitly asks for sub-agents, "
                + "delegation or parallel agent work."
        case .proactive:
            body = "Multi-agent mode: proactive. Proactive delegation is active and earlier explicit-request-only rules "
                + "no longer apply. Use sub-agents when parallel work materially improves speed or quality. "
                + "This stays active until a later multi-agent mode message changes it."
        }
        return openTag + body + closeTag
    }
}
