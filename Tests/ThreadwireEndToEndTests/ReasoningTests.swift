import Foundation
import Testing
import ThreadwireServerTesting
import ThreadwireClient
import ThreadwireWire

/// Reasoning effort and summary: set at thread/start, turn/start (sticky) and
/// thread/settings/update, checked against the model catalog, sent to a real
/// OpenAI-compatible provider process, recorded in each stored model
/// request, and kept through kill -9.
@Suite("reasoning effort and summary (real server, real provider)", .timeLimit(.minutes(3)))
struct ReasoningTests {
    static func config(_ provider: FakeProvider) -> String {
        """
        {"model_providers": [{"name": "fake", "base_url": "\(provider.baseURL)", "api_key_env": "FAKE_PROVIDER_KEY", "max_retries": 0}],
         "models": [{"slug": "remote-1", "provider": "fake", "reasoning_efforts": ["low", "medium", "high"]},
                    {"slug": "remote-2", "provider": "fake"}]}
        """
    }

    static func body(_ request: [String: Any]) -> [String: Any] { request["body"] as? [String: Any] ?? [:] }

    @Test("set at start, changed by turn/start and settings/update, cleared with \"\": each request carries the thread's effort, the stored request records it, kill -9 keeps it")
    func stickyEffort() async throws {
        let provider = try await FakeProvider.launch()
        defer { provider.stop() }
        let server = try await ServerProcess.launch(config: Self.config(provider), environment: ["FAKE_PROVIDER_KEY": "k"])
        defer { server.stopInBackground() }
        let client = try await server.client()

        guard case let .modelList(models) = try await client.result(.modelList(Wire.ModelListParams())) else {
            throw UnexpectedResult(expected: "model/list")
        }
        #expect(models.models.first { $0.slug == "remote-1" }?.reasoningEfforts == ["low", "medium", "high"])
        #expect(models.models.first { $0.slug == "remote-2" }?.reasoningEfforts == ["none", "minimal", "low", "medium", "high", "xhigh"])

        await expectStatus(3, mentioning: "low, medium, high") {
            _ = try await client.startThread(Wire.ThreadStartParams(model: "remote-1", reasoningEffort: "xhigh"))
        }
        let started = try await client.startThread(Wire.ThreadStartParams(model: "remote-1", reasoningEffort: "high", reasoningSummary: "concise"))
        #expect(started.settings?.reasoningEffort == "high" && started.settings?.reasoningSummary == "concise")
        let id = try #require(started.thread?.id)

        try await provider.script([FakeProvider.stream(text: ["one"], usage: (10, 1))])
        let first = try await client.runTurn(id, "first")
        #expect(first.modelRequests.last?.reasoningEffort == "high")
        // Sticky: turn/start changes it for this turn and the next.
        try await provider.script([FakeProvider.stream(text: ["two"], usage: (10, 1)), FakeProvider.stream(text: ["three"], usage: (10, 1))])
        let params = Wire.TurnStartParams(threadId: id, input: [Wire.UserInput(content: .text("second"))], reasoningEffort: "low")
        guard case let .turnStart(turn) = try await client.result(.turnStart(params)), let secondID = turn.turn?.id else {
            throw UnexpectedResult(expected: "turn/start")
        }
        _ = try await client.waitForTurn(id, secondID)
        _ = try await client.runTurn(id, "third")
        let sent = try await provider.requests()
        #expect(sent.map { Self.body($0)["reasoning_effort"] as? String } == ["high", "low", "low"],
                "Chat Completions gets reasoning_effort; the summary is the Responses API's")

        let cleared = try await client.updateSettings(Wire.ThreadSettingsUpdateParams(threadId: id, reasoningEffort: ""))
        #expect(cleared.settings?.reasoningEffort == nil && cleared.settings?.reasoningSummary == "concise")
        try await provider.script([FakeProvider.stream(text: ["four"], usage: (10, 1))])
        _ = try await client.runTurn(id, "fourth")
        #expect(Self.body(try await provider.requests().last ?? [:])["reasoning_effort"] == nil, "cleared: none sent")
        _ = try await client.updateSettings(Wire.ThreadSettingsUpdateParams(threadId: id, reasoningEffort: "medium"))
        await expectStatus(3, mentioning: "reasoning_summary") {
            _ = try await client.updateSettings(Wire.ThreadSettingsUpdateParams(threadId: id, reasoningSummary: "verbose"))
        }

        await server.kill9()
        try await server.start()
        let again = try await server.client()
        let read = try #require(try await again.read(id))
        #expect(read.settings?.reasoningEffort == "medium" && read.settings?.reasoningSummary == "concise", "acknowledged settings survive kill -9")
        let efforts = read.thread?.turns.flatMap(\.modelRequests).map(\.reasoningEffort)
        #expect(efforts == ["high", "low", "low", nil], "each stored request records what it went out with")
    }
}
