import Testing
@testable import ThreadwireCore

@Suite("runtime resolution (pure)")
struct RuntimeResolverTests {
    @Test("an inherited disabled always wins, even over history")
    func disabledWins() {
        #expect(RuntimeResolver.resolveAtLoad(inherited: .disabled, recorded: .v2, origin: .resumed) == .disabled)
    }

    @Test("history beats inheritance; inheritance beats the legacy default")
    func order() {
        #expect(RuntimeResolver.resolveAtLoad(inherited: .v1, recorded: .v2, origin: .forked) == .v2)
        #expect(RuntimeResolver.resolveAtLoad(inherited: .v2, recorded: nil, origin: .new) == .v2)
    }

    @Test("a resumed or forked thread with nothing recorded is legacy: v1")
    func legacy() {
        #expect(RuntimeResolver.resolveAtLoad(inherited: nil, recorded: nil, origin: .resumed) == .v1)
        #expect(RuntimeResolver.resolveAtLoad(inherited: nil, recorded: nil, origin: .forked) == .v1)
    }

    @Test("a new thread stays unresolved until its first turn")
    func newThread() {
        #expect(RuntimeResolver.resolveAtLoad(inherited: nil, recorded: nil, origin: .new) == nil)
    }

    @Test("first turn: catalog selector, else v2 flag, else collab flag, else disabled")
    func firstTurn() {
        #expect(RuntimeResolver.resolveAtFirstTurn(catalogSelector: .v1, flags: FeatureFlags(multiAgentV2: true)) == .v1)
        #expect(RuntimeResolver.resolveAtFirstTurn(catalogSelector: nil, flags: FeatureFlags(multiAgentV2: true)) == .v2)
        #expect(RuntimeResolver.resolveAtFirstTurn(catalogSelector: nil, flags: FeatureFlags()) == .v1)
        #expect(RuntimeResolver.resolveAtFirstTurn(catalogSelector: nil, flags: FeatureFlags(multiAgent: false)) == .disabled)
    }

    @Test("an unknown catalog selector counts as absent")
    func unknownSelector() {
        let catalog = ModelCatalog(entries: [.init(slug: "m", multiAgentVersion: "v9"), .init(slug: "n", multiAgentVersion: "v2")])
        #expect(catalog.selector(forModel: "m") == nil)
        #expect(catalog.selector(forModel: "n") == .v2)
        #expect(catalog.selector(forModel: "absent") == nil)
    }
}

@Suite("multi-agent mode rules (pure)")
struct ModeRulesTests {
    func effective(_ selected: MultiAgentMode?, runtime: MultiAgentRuntime? = .v2, hints: Bool = true,
                   source: ThreadSourceKind = .appServer, gate: Bool = true) -> MultiAgentMode? {
        ModeRules.effective(selected: selected, runtime: runtime, usageHintEnabled: hints, source: source, gateEnabled: gate)
    }

    @Test("applicable with the gate on: the selection, or explicitRequestOnly when unset")
    func gateOn() {
        #expect(effective(.proactive) == .proactive)
        #expect(effective(nil) == .explicitRequestOnly)
        #expect(effective(.proactive, source: .threadSpawn) == .proactive)
    }

    @Test("applicable with the gate off: explicitRequestOnly whatever is selected")
    func gateOff() {
        #expect(effective(.proactive, gate: false) == .explicitRequestOnly)
    }

    @Test("not applicable: v1, disabled, unresolved, hints off, review")
    func notApplicable() {
        #expect(effective(.proactive, runtime: .v1) == nil)
        #expect(effective(.proactive, runtime: .disabled) == nil)
        #expect(effective(.proactive, runtime: nil) == nil)
        #expect(effective(.proactive, hints: false) == nil)
        #expect(effective(.proactive, source: .review) == nil)
    }

    @Test("fragments: initial when set; later only on change; leaving proactive neutralises")
    func fragments() {
        #expect(ModeRules.fragmentToEmit(baseline: .noPreviousTurn, current: .explicitRequestOnly) == .explicitRequestOnly)
        #expect(ModeRules.fragmentToEmit(baseline: .noPreviousTurn, current: nil) == nil)
        #expect(ModeRules.fragmentToEmit(baseline: .previous(.proactive), current: .proactive) == nil)
        #expect(ModeRules.fragmentToEmit(baseline: .previous(.explicitRequestOnly), current: .proactive) == .proactive)
        #expect(ModeRules.fragmentToEmit(baseline: .previous(.proactive), current: nil) == .explicitRequestOnly)
        #expect(ModeRules.fragmentToEmit(baseline: .previous(.explicitRequestOnly), current: nil) == nil)
        #expect(ModeRules.fragmentToEmit(baseline: .previous(nil), current: .explicitRequestOnly) == .explicitRequestOnly)
    }

    @Test("fragment text is tagged and bounded")
    func text() {
        for mode in MultiAgentMode.allCases {
            let text = ModeRules.fragmentText(mode)
            #expect(text.hasPrefix("<multi_agent_mode>") && text.hasSuffix("</multi_agent_mode>"))
            #expect(text.utf8.count < 1600)
        }
    }
}

@Suite("tools and config (pure)")
struct ToolsAndConfigTests {
    @Test("v1 and v2 tool sets; disabled and review offer none")
    func toolSets() {
        let v1 = ToolCatalog.offered(runtime: .v1, depth: 0, maxDepth: 1, source: .appServer).map(\.name)
        #expect(v1 == ["spawn_agent", "send_input", "wait_agent", "resume_agent", "close_agent"])
        let v2 = ToolCatalog.offered(runtime: .v2, depth: 0, maxDepth: 1, source: .appServer).map(\.name)
        #expect(v2 == ["spawn_agent", "send_message", "followup_task", "wait_agent", "list_agents", "close_agent"])
        #expect(ToolCatalog.offered(runtime: .disabled, depth: 0, maxDepth: 1, source: .appServer).isEmpty)
        #expect(ToolCatalog.offered(runtime: .v2, depth: 0, maxDepth: 1, source: .review).isEmpty)
    }

    @Test("v1 hides spawn_agent when the next spawn would exceed max_depth; v2 does not")
    func depthGate() {
        #expect(!ToolCatalog.offered(runtime: .v1, depth: 1, maxDepth: 1, source: .threadSpawn).map(\.name).contains("spawn_agent"))
        #expect(ToolCatalog.offered(runtime: .v2, depth: 1, maxDepth: 1, source: .threadSpawn).map(\.name).contains("spawn_agent"))
    }

    @Test("config overrides apply and reject unknown keys and bad values")
    func overrides() throws {
        let config = try ThreadConfig().applying([("features.multi_agent_v2", "true"), ("agents.max_threads", "2")])
        #expect(config.flags.multiAgentV2 && config.maxThreads == 2)
        #expect(throws: DomainError.self) { try ThreadConfig().applying([("features.nope", "true")]) }
        #expect(throws: DomainError.self) { try ThreadConfig().applying([("agents.max_depth", "zero")]) }
    }

    @Test("concurrency caps: v1 max_threads, v2 max_concurrent - 1")
    func caps() {
        #expect(ThreadConfig().childAgentCap(for: .v1).limit == 6)
        #expect(ThreadConfig().childAgentCap(for: .v2).limit == 3)
    }
}
