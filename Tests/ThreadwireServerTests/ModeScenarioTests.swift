import Foundation
import Testing
import ThreadwireServerTesting
import ThreadwireClient
import ThreadwireWire

/// Seeds 002-004: the selected mode, kept apart from each turn's effective mode,
/// over the real protocol against the real server binary and store.
@Suite("multi-agent mode (real server)", .timeLimit(.minutes(3)))
struct ModeScenarioTests {
    /// V2 with the mode gate on, the setting where the selection matters.
    static let v2GateOn = #"{"features": {"multi_agent_v2": true, "multi_agent_mode": true}}"#
    static let v2GateOff = #"{"features": {"multi_agent_v2": true, "multi_agent_mode": false}}"#

    @Test("thread/start with proactive: reported at once, first eligible turn carries the proactive fragment")
    func startProactive() async throws {
        let server = try await InProcessServer.launch(config: Self.v2GateOn)
        let client = try await server.client()
        let started = try await client.startThread(Wire.ThreadStartParams(multiAgentMode: .proactive))
        #expect(started.multiAgentMode == .proactive)
        #expect(started.settings?.multiAgentMode == .proactive)
        #expect(started.thread?.multiAgentMode == .proactive)
        let id = try #require(started.thread?.id)
        let turn = try await client.runTurn(id, "hi")
        #expect(modeFragments(turn.lastContext) == ["proactive"])
        #expect(turn.context?.effectiveMultiAgentMode == .proactive)
        #expect(turn.lastContext.of(.multiAgentMode).first?.role == .developer)
        #expect(turn.lastContext.of(.multiAgentMode).first?.text?.hasPrefix("<multi_agent_mode>") == true)
    }

    @Test("an omitted selection is reported unset while the first eligible turn carries explicitRequestOnly")
    func omittedIsUnset() async throws {
        let server = try await InProcessServer.launch(config: Self.v2GateOn)
        let client = try await server.client()
        let started = try await client.startThread()
        #expect(started.multiAgentMode == nil)
        #expect(started.settings?.multiAgentMode == nil)
        let id = try #require(started.thread?.id)
        let turn = try await client.runTurn(id, "hi")
        #expect(modeFragments(turn.lastContext) == ["explicitRequestOnly"])
        #expect(turn.context?.effectiveMultiAgentMode == .explicitRequestOnly)
        #expect(try await client.read(id).thread?.multiAgentMode == nil, "the effective mode is not stored as the selection")
        #expect(try await client.resume(id).multiAgentMode == nil)
    }

    @Test("a proactive settings update is reported at once; the next turn appends exactly one proactive fragment")
    func settingsUpdateBetweenTurns() async throws {
        let server = try await InProcessServer.launch(config: Self.v2GateOn)
        let client = try await server.client()
        let inbox = Inbox(client)
        let id = try #require(try await client.startThread().thread?.id)
        let first = try await client.runTurn(id, "one")
        #expect(modeFragments(first.lastContext) == ["explicitRequestOnly"])

        let update = try await client.updateSettings(Wire.ThreadSettingsUpdateParams(threadId: id, multiAgentModeUpdate: .multiAgentMode(.proactive)))
        #expect(update.changed == true)
        #expect(update.settings?.multiAgentMode == .proactive)
        try await inbox.waitFor("thread/settings/updated") {
            if case let .threadSettingsUpdated(n) = $0 { return n.threadId == id && n.settings?.multiAgentMode == .proactive }
            return false
        }
        #expect(try await client.read(id).settings?.multiAgentMode == .proactive)

        let second = try await client.runTurn(id, "two")
        // The earlier explicit baseline stays in history; exactly one proactive fragment follows it.
        #expect(modeFragments(second.lastContext) == ["explicitRequestOnly", "proactive"])
        let third = try await client.runTurn(id, "three")
        #expect(modeFragments(third.lastContext) == ["explicitRequestOnly", "proactive"], "no duplicate")
    }

    @Test("the same mode twice changes nothing and emits nothing")
    func sameModeTwice() async throws {
        let server = try await InProcessServer.launch(config: Self.v2GateOn)
        let client = try await server.client()
        let inbox = Inbox(client)
        let id = try #require(try await client.startThread(Wire.ThreadStartParams(multiAgentMode: .proactive)).thread?.id)
        try await client.runTurn(id, "one")
        let update = try await client.updateSettings(Wire.ThreadSettingsUpdateParams(threadId: id, multiAgentModeUpdate: .multiAgentMode(.proactive)))
        #expect(update.changed == false)
        let again = try await client.runTurn(id, "two", mode: .multiAgentMode(.proactive))
        #expect(modeFragments(again.lastContext) == ["proactive"])
        let updates = await inbox.payloads().filter { if case .threadSettingsUpdated = $0 { return true } else { return false } }
        #expect(updates.isEmpty)
    }

    @Test("v1 and disabled threads get no mode fragment and are not rejected")
    func notApplicable() async throws {
        let server = try await InProcessServer.launch(config: #"{"features": {"multi_agent_mode": true}}"#)
        let client = try await server.client()
        for overrides in [[Wire.KeyValue](), [Wire.KeyValue(key: "features.multi_agent", value: "false")]] {
            let started = try await client.startThread(Wire.ThreadStartParams(config: overrides, multiAgentMode: .proactive))
            let id = try #require(started.thread?.id)
            let turn = try await client.runTurn(id, "hi", mode: .multiAgentMode(.proactive))
            #expect(turn.status == .completed)
            #expect(turn.lastContext.of(.multiAgentMode).isEmpty)
            #expect(turn.context?.effectiveMultiAgentMode == nil)
            #expect(try await client.read(id).thread?.multiAgentMode == .proactive, "the selection is still kept")
        }
    }

    @Test("usage hints off make the mode not applicable")
    func hintsOff() async throws {
        let server = try await InProcessServer.launch(config: Self.v2GateOn)
        let client = try await server.client()
        let id = try #require(try await client.startThread(Wire.ThreadStartParams(
            config: [Wire.KeyValue(key: "multi_agent_v2.usage_hint_enabled", value: "false")], multiAgentMode: .proactive)).thread?.id)
        let turn = try await client.runTurn(id, "hi")
        #expect(turn.lastContext.of(.multiAgentMode).isEmpty && turn.lastContext.of(.usageHint).isEmpty)
    }

    @Test("gate off: explicitRequestOnly whatever is selected; the selection is reported and kept across a restart")
    func gateOff() async throws {
        let server = try await InProcessServer.launch(config: Self.v2GateOff)
        var client = try await server.client()
        let id = try #require(try await client.startThread(Wire.ThreadStartParams(multiAgentMode: .proactive)).thread?.id)
        let turn = try await client.runTurn(id, "hi")
        #expect(modeFragments(turn.lastContext) == ["explicitRequestOnly"])
        #expect(turn.context?.effectiveMultiAgentMode == .explicitRequestOnly)
        #expect(try await client.read(id).thread?.multiAgentMode == .proactive)
        try await server.restart()
        client = try await server.client()
        #expect(try await client.resume(id).multiAgentMode == .proactive, "not downgraded to the effective value")
        // Turning the gate on later lets the kept selection take effect.
        try server.rewriteConfig(Self.v2GateOn)
        try await server.restart()
        client = try await server.client()
        let later = try await client.runTurn(id, "now")
        #expect(modeFragments(later.lastContext) == ["explicitRequestOnly", "proactive"])
    }

    @Test("clear returns the selection to unset, through settings update and turn/start")
    func clear() async throws {
        let server = try await InProcessServer.launch(config: Self.v2GateOn)
        let client = try await server.client()
        let id = try #require(try await client.startThread(Wire.ThreadStartParams(multiAgentMode: .proactive)).thread?.id)
        try await client.runTurn(id, "one")
        let cleared = try await client.updateSettings(Wire.ThreadSettingsUpdateParams(threadId: id, multiAgentModeUpdate: .clearMultiAgentMode(true)))
        #expect(cleared.changed == true)
        #expect(cleared.settings?.multiAgentMode == nil)
        let next = try await client.runTurn(id, "two")
        #expect(next.context?.effectiveMultiAgentMode == .explicitRequestOnly)
        #expect(modeFragments(next.lastContext) == ["proactive", "explicitRequestOnly"])
        // turn/start can set and clear too.
        try await client.runTurn(id, "three", mode: .multiAgentMode(.proactive))
        #expect(try await client.read(id).thread?.multiAgentMode == .proactive)
        try await client.runTurn(id, "four", mode: .clearMultiAgentMode(true))
        #expect(try await client.read(id).thread?.multiAgentMode == nil)
    }

    @Test("a selection made with no turn survives unloading and a server restart")
    func survivesRestartWithoutTurn() async throws {
        let server = try await InProcessServer.launch(config: Self.v2GateOn)
        var client = try await server.client()
        let a = try #require(try await client.startThread(Wire.ThreadStartParams(multiAgentMode: .proactive)).thread?.id)
        let b = try #require(try await client.startThread().thread?.id)
        _ = try await client.updateSettings(Wire.ThreadSettingsUpdateParams(threadId: b, multiAgentModeUpdate: .multiAgentMode(.explicitRequestOnly)))
        let never = try #require(try await client.startThread().thread?.id)
        try await server.restart()
        client = try await server.client()
        #expect(try await client.resume(a).multiAgentMode == .proactive)
        #expect(try await client.resume(b).multiAgentMode == .explicitRequestOnly)
        #expect(try await client.resume(never).multiAgentMode == nil, "a never-selected thread resumes as unset")
        // Updating an unloaded thread after a restart works and lasts too.
        try await server.restart()
        client = try await server.client()
        _ = try await client.updateSettings(Wire.ThreadSettingsUpdateParams(threadId: never, multiAgentModeUpdate: .multiAgentMode(.proactive)))
        try await server.restart()
        client = try await server.client()
        #expect(try await client.read(never).thread?.multiAgentMode == .proactive)
        #expect(modeFragments(try await client.runTurn(never, "hi").lastContext) == ["proactive"])
    }

    @Test("a fork keeps the selection; a v2 child takes the spawning turn's effective mode")
    func inheritance() async throws {
        let server = try await InProcessServer.launch(config: Self.v2GateOn)
        let client = try await server.client()
        let id = try #require(try await client.startThread(Wire.ThreadStartParams(multiAgentMode: .proactive)).thread?.id)
        #expect(try await client.fork(id).multiAgentMode == .proactive, "fork before any turn")
        let turn = try await client.runTurn(id, #"#tool spawn_agent {"task_name": "t", "message": "go"}"#)
        #expect(try await client.fork(id).multiAgentMode == .proactive)
        let childID = try #require(turn.items.first { $0.type == .collabToolCall }?.receiverThreadId)
        let child = try await client.waitForThread(childID) { $0.turns.first?.status == .completed }
        #expect(child.multiAgentMode == .proactive)
        #expect(child.turns.first?.context?.effectiveMultiAgentMode == .proactive)
        #expect(child.turns.first?.lastContext.of(.usageHint).first?.text?.contains("sub-agent") == true)

        // With the gate off the spawning turn's effective mode is explicitRequestOnly, and so is the child's selection.
        let off = try await InProcessServer.launch(config: Self.v2GateOff)
        let offClient = try await off.client()
        let parent = try #require(try await offClient.startThread(Wire.ThreadStartParams(multiAgentMode: .proactive)).thread?.id)
        try await offClient.runTurn(parent, "hi")
        #expect(try await offClient.spawn(parent).multiAgentMode == .explicitRequestOnly)
    }

    @Test("settings updates add no transcript items and make no model request")
    func noTranscriptFromSettings() async throws {
        let server = try await InProcessServer.launch(config: Self.v2GateOn)
        let client = try await server.client()
        let id = try #require(try await client.startThread().thread?.id)
        try await client.runTurn(id, "one")
        let before = try #require(try await client.read(id).thread)
        _ = try await client.updateSettings(Wire.ThreadSettingsUpdateParams(threadId: id, model: "other", multiAgentModeUpdate: .multiAgentMode(.proactive)))
        let after = try #require(try await client.read(id).thread)
        #expect(after.turns == before.turns)
        #expect(after.updatedAt == before.updatedAt)
        #expect(after.model == "other")
    }

    @Test("a turn/start override that changes stored settings emits thread/settings/updated")
    func turnOverrideNotifies() async throws {
        let server = try await InProcessServer.launch(config: Self.v2GateOn)
        let client = try await server.client()
        let inbox = Inbox(client)
        let id = try #require(try await client.startThread().thread?.id)
        try await client.runTurn(id, "hi", mode: .multiAgentMode(.proactive))
        try await inbox.waitFor("thread/settings/updated") {
            if case let .threadSettingsUpdated(n) = $0 { return n.settings?.multiAgentMode == .proactive }
            return false
        }
    }

    @Test("unknown thread is NOT_FOUND; an invalid value is INVALID_ARGUMENT naming the field")
    func errors() async throws {
        let server = try await InProcessServer.launch(config: Self.v2GateOn)
        let client = try await server.client()
        await expectStatus(5, mentioning: "nope") {
            _ = try await client.updateSettings(Wire.ThreadSettingsUpdateParams(threadId: "nope", multiAgentModeUpdate: .multiAgentMode(.proactive)))
        }
        let id = try #require(try await client.startThread().thread?.id)
        await expectStatus(3, mentioning: "multi_agent_mode") {
            _ = try await client.updateSettings(Wire.ThreadSettingsUpdateParams(threadId: id, multiAgentModeUpdate: .multiAgentMode(.unspecified)))
        }
        await expectStatus(3, mentioning: "clear_multi_agent_mode") {
            _ = try await client.updateSettings(Wire.ThreadSettingsUpdateParams(threadId: id, multiAgentModeUpdate: .clearMultiAgentMode(false)))
        }
        await expectStatus(3, mentioning: "multi_agent_mode") {
            _ = try await client.startThread(Wire.ThreadStartParams(multiAgentMode: .unspecified))
        }
        await expectStatus(3, mentioning: "thread_id is required") {
            _ = try await client.updateSettings(Wire.ThreadSettingsUpdateParams())
        }
    }

    @Test("a server-configured default selection applies when thread/start gives none")
    func configuredDefault() async throws {
        let server = try await InProcessServer.launch(config: #"{"features": {"multi_agent_v2": true, "multi_agent_mode": true}, "default_multi_agent_mode": "proactive"}"#)
        let client = try await server.client()
        #expect(try await client.startThread().multiAgentMode == .proactive)
        #expect(try await client.startThread(Wire.ThreadStartParams(multiAgentMode: .explicitRequestOnly)).multiAgentMode == .explicitRequestOnly)
    }
}
