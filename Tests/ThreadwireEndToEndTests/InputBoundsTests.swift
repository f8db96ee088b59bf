import Foundation
import Testing
import ThreadwireServerTesting
import ThreadwireClient
@testable import ThreadwireServer
import ThreadwireWire

/// Every bounded field just under its limit (accepted) and just over it
/// (INVALID_ARGUMENT naming the field and the limit), through the real
/// server; the rest of the connection goes on working.
@Suite("input bounds (real server)", .timeLimit(.minutes(2)))
struct InputBoundsTests {
    static func over(_ client: ThreadwireClient, _ params: Wire.Request.Params, field: String, limit: Int,
                     sourceLocation: SourceLocation = #_sourceLocation) async throws {
        let response = try await client.call(params)
        #expect(response.code == 3, "\(field): \(response)", sourceLocation: sourceLocation)
        let message = response.message ?? ""
        #expect(message.contains(field) && message.contains("limit is \(limit)"), "\(message)", sourceLocation: sourceLocation)
    }

    static func under(_ client: ThreadwireClient, _ params: Wire.Request.Params, sourceLocation: SourceLocation = #_sourceLocation) async throws {
        let response = try await client.call(params)
        #expect(response.code ?? 0 == 0, "\(response)", sourceLocation: sourceLocation)
    }

    static func text(_ bytes: Int) -> String { String(repeating: "a", count: bytes) }

    @Test("names, working directories, base instructions, models, input text, input items, ids, client tools and schema depth: accepted at the limit, refused one past it naming the field and the limit")
    func everyBoundedField() async throws {
        let server = try await ServerProcess.launch(arguments: ["--max-frame-bytes", "4194304"])
        defer { server.stopInBackground() }
        let client = try await server.client()
        let thread = try #require(try await client.startThread().thread?.id)

        try await Self.under(client, .threadStart(Wire.ThreadStartParams(name: Self.text(1_024))))
        try await Self.over(client, .threadStart(Wire.ThreadStartParams(name: Self.text(1_025))), field: "thread_start.name", limit: 1_024)
        try await Self.under(client, .threadStart(Wire.ThreadStartParams(cwd: "/" + Self.text(4_095))))
        try await Self.over(client, .threadStart(Wire.ThreadStartParams(cwd: "/" + Self.text(4_096))), field: "thread_start.cwd", limit: 4_096)
        try await Self.under(client, .threadStart(Wire.ThreadStartParams(baseInstructions: Self.text(262_144))))
        try await Self.over(client, .threadStart(Wire.ThreadStartParams(baseInstructions: Self.text(262_145))),
                            field: "thread_start.base_instructions", limit: 262_144)
        try await Self.over(client, .threadSettingsUpdate(Wire.ThreadSettingsUpdateParams(threadId: thread, cwd: "/" + Self.text(4_096))),
                            field: "thread_settings_update.cwd", limit: 4_096)
        try await Self.over(client, .threadSettingsUpdate(Wire.ThreadSettingsUpdateParams(threadId: thread, model: Self.text(257))),
                            field: "thread_settings_update.model", limit: 256)
        // An id longer than any id is refused before it is looked up.
        try await Self.over(client, .turnStart(Wire.TurnStartParams(threadId: Self.text(129), input: [Wire.UserInput(content: .text("hi"))])),
                            field: "turn_start.thread_id", limit: 128)

        // Input: a text of 1 MiB, and 256 items, are taken; one more of either is not.
        _ = try await client.runTurn(thread, Self.text(1_048_576))
        try await Self.over(client, .turnStart(Wire.TurnStartParams(threadId: thread, input: [Wire.UserInput(content: .text(Self.text(1_048_577)))])),
                            field: "turn_start.input[0].text", limit: 1_048_576)
        let items = (0..<256).map { Wire.UserInput(content: .text("item \($0)")) }
        let many = try await client.call(.turnStart(Wire.TurnStartParams(threadId: thread, input: items)))
        guard case let .turnStart(started)? = many.result, let turn = started.turn?.id else { throw UnexpectedResult(expected: "turnStart, got \(many)") }
        _ = try await client.waitForTurn(thread, turn)
        try await Self.over(client, .turnStart(Wire.TurnStartParams(threadId: thread, input: items + [Wire.UserInput(content: .text("one more"))])),
                            field: "turn_start.input", limit: 256)

        // Client tools: 64 of them, and a schema 32 levels deep, are taken.
        func tool(_ n: Int, schema: String = #"{"type":"object"}"#) -> Wire.ToolSpec {
            Wire.ToolSpec(name: "tool_\(n)", description: "Tool \(n).", parametersJsonSchema: schema)
        }
        try await Self.under(client, .threadStart(ClientToolTests.startParams((0..<64).map { tool($0) })))
        try await Self.over(client, .threadStart(ClientToolTests.startParams((0..<65).map { tool($0) })), field: "thread_start.client_tools", limit: 64)
        func nested(_ depth: Int) -> String {
            #"{"type":"object","properties":{"p":"# + String(repeating: "[", count: depth - 2) + String(repeating: "]", count: depth - 2) + "}}"
        }
        #expect(InputBounds.nesting(nested(32)) == 32 && InputBounds.nesting(nested(33)) == 33)
        #expect(InputBounds.nesting(#"{"a":"[[[[{{{{"}"#) == 1, "brackets inside strings do not count")
        let deep = try await client.call(.threadStart(ClientToolTests.startParams([tool(0, schema: nested(33))])))
        #expect(deep.code == 3 && (deep.message ?? "").contains("client_tools[0].parameters_json_schema nests 33 levels deep; the limit is 32"),
                "\(deep)")
        let shallow = try await client.call(.threadStart(ClientToolTests.startParams([tool(0, schema: nested(32))])))
        #expect((shallow.message ?? "").contains("nests") == false, "\(shallow)")

        // The connection and the thread are fine after every refusal.
        #expect(try await client.read(thread).thread?.id == thread)
    }
}
