import Foundation
import Testing
import ThreadwireServerTesting
import ThreadwireClient
import ThreadwireWire

/// Live token usage (thread/token_usage/updated) and model/list, with the
/// scripted backend (it reports usage estimated at 4 bytes a token).
@Suite("token usage and model listing", .timeLimit(.minutes(3)))
struct TokenUsageTests {
    static let config = """
        {"models": [{"slug": "echo-1", "context_window": 1000},
                    {"slug": "gpt-real", "provider": "fake", "context_window": 128000, "multi_agent_version": "v2"}],
         "model_providers": [{"name": "fake", "base_url": "http://127.0.0.1:9/v1"}]}
        """

    static func usageReports(_ inbox: Inbox, turn: String) async -> [Wire.ThreadTokenUsageUpdatedNotification] {
        await inbox.payloads().compactMap { if case let .threadTokenUsageUpdated(n) = $0, n.turnId == turn { n } else { nil } }
    }

    @Test("after every model call: that call's tokens, the thread's totals, the model's window and the next request's share")
    func usageAfterEveryModelCall() async throws {
        let server = try await InProcessServer.launch(config: Self.config)
        let client = try await server.capableClient()
        let inbox = Inbox(client)
        client.serveClientTools { _, _ in Wire.ToolCallResult(output: "ok") }
        let id = try #require(try await client.startThread(ClientToolTests.startParams()).thread?.id)

        let first = try await client.runTurn(id, "hello world")
        let firstReports = try await waitUntil("a usage report") { let r = await Self.usageReports(inbox, turn: first.id ?? ""); return r.isEmpty ? nil : r }
        #expect(firstReports.count == 1)
        let one = try #require(firstReports.first)
        #expect((one.last?.inputTokens ?? 0) > 0 && (one.last?.outputTokens ?? 0) > 0)
        #expect(one.total == one.last, "the first call is the whole total")
        #expect(one.contextWindow == 1000)
        let share = Double((one.last?.inputTokens ?? 0) + (one.last?.outputTokens ?? 0)) / 1000
        #expect(abs((one.nextRequestShare ?? -1) - share) < 1e-9)
        #expect(first.modelRequests.first?.usage == one.last, "the report is what the turn recorded")

        // A turn with a client tool makes two model calls: two reports, totals adding up.
        let second = try await client.runTurn(id, "#tool read_file {\"path\":\"x\"}")
        let reports = try await waitUntil("two usage reports") { let r = await Self.usageReports(inbox, turn: second.id ?? ""); return r.count == 2 ? r : nil }
        var expected = one.total?.inputTokens ?? 0
        for report in reports {
            expected += report.last?.inputTokens ?? 0
            #expect(report.total?.inputTokens == expected, "totals add every call of the thread")
        }
        #expect(second.modelRequests.compactMap(\.usage) == reports.compactMap(\.last))
    }

    @Test("model/list: configured models with provider, window and selector; the default model served offline")
    func modelList() async throws {
        let server = try await InProcessServer.launch(config: Self.config)
        let client = try await server.client()
        guard case let .modelList(result) = try await client.result(.modelList(Wire.ModelListParams())) else {
            Issue.record("bad result"); return
        }
        #expect(result.defaultModel == "echo-1")
        let echo = try #require(result.models.first { $0.slug == "echo-1" })
        #expect(echo.offline == true && echo.provider == nil && echo.contextWindow == 1000)
        let real = try #require(result.models.first { $0.slug == "gpt-real" })
        #expect(real.provider == "fake" && real.offline == false && real.streams == true)
        #expect(real.contextWindow == 128000 && real.multiAgentVersion == "v2")
    }
}
