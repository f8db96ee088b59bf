import Foundation
import Testing
import ThreadwireServerTesting
import ThreadwireClient
import ThreadwireCore
import ThreadwireSQLite
import ThreadwireTesting
import ThreadwireWire

/// thread/import through a running server, with rollout fixtures written
/// from the documented format (integration/rollouts), on SQLite and on PostgreSQL.
@Suite("codex rollouts imported through the server (real server, real stores)", .timeLimit(.minutes(4)))
struct ImportTests {
    static let fixtures = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().appendingPathComponent("integration/rollouts").path
    static func fixture(_ name: String) -> String { fixtures + "/" + name }

    static let root = "0196a000-0000-7000-8000-000000000001"
    static let parent = "0196a000-0000-7000-8000-000000000010"
    static let explorer = "0196a000-0000-7000-8000-000000000011"
    static let tester = "0196a000-0000-7000-8000-000000000012"
    static let torn = "0196a000-0000-7000-8000-000000000020"
    static let malformed = "0196a000-0000-7000-8000-000000000030"
    static let newest = "0196a000-0000-7000-8000-000000000040"
    static let nullVersion = "0196a000-0000-7000-8000-000000000050"

    /// The files, children before their parent.
    static let files = ["child_tester.jsonl", "child_explorer.jsonl", "parent_v2.jsonl", "root.jsonl", "torn.jsonl",
                        "malformed_middle.jsonl", "newest_meta.jsonl", "null_version.jsonl"]

    /// `threadwire import --json` against the server; the parsed output.
    func importFiles(_ server: ServerProcess, _ names: [String], extra: [String] = []) async throws -> (Int32, [String: Any]) {
        let (status, out) = try await runCLI(["import", "--server", "127.0.0.1:\(server.port)", "-o", "json"] + extra + names.map(Self.fixture))
        let object = try #require(try JSONSerialization.jsonObject(with: Data(out.utf8)) as? [String: Any], "not JSON: \(out)")
        return (status, object)
    }

    func reports(_ output: [String: Any]) -> [String: [String: Any]] {
        var byThread: [String: [String: Any]] = [:]
        for report in output["files"] as? [[String: Any]] ?? [] { byThread[report["thread_id"] as? String ?? ""] = report }
        return byThread
    }

    @Test("on SQLite: the tree (children given first), tool calls, reasoning, usage, a compaction and a rollback shaping the next model request, torn and malformed lines, newest session_meta; a second import changes nothing")
    func sqlite() async throws {
        let server = try await ServerProcess.launch(config: #"{"features": {"multi_agent_v2": true}}"#)
        try await check(server)
    }

    @Test("on PostgreSQL: the same files, the same results")
    func postgres() async throws {
        let url = try await PostgresCluster.database()
        let server = try await ServerProcess.launch(config: #"{"features": {"multi_agent_v2": true}}"#, arguments: ["--store", url])
        try await check(server)
    }

    func check(_ server: ServerProcess) async throws {
        let (status, output) = try await importFiles(server, Self.files)
        #expect(status == 0, "\(output)")
        let reports = reports(output)
        #expect(reports.count == 8)

        // The report: skipped lines with their numbers and why; unknown kinds counted.
        let tornSkipped = try #require(reports[Self.torn]?["skipped"] as? [[String: Any]])
        #expect(tornSkipped.count == 1 && (tornSkipped[0]["line"] as? Int) == 5 && "\(tornSkipped[0]["reason"] ?? "")".contains("torn"))
        let badSkipped = try #require(reports[Self.malformed]?["skipped"] as? [[String: Any]])
        #expect(badSkipped.count == 1 && (badSkipped[0]["line"] as? Int) == 4)
        let unknown = try #require(reports[Self.root]?["unknown_records"] as? [[String: Any]])
        #expect(unknown.contains { $0["kind"] as? String == "world_state" && $0["count"] as? Int == 1 })
        #expect((reports[Self.parent]?["linked_children"] as? Int) == 2, "the parent linked its two children imported before it")

        let client = try await server.client()
        // The tree: both children are the parent's, in its agent tree, with path, nickname and role.
        guard case let .threadList(children) = try await client.result(.threadList(Wire.ThreadListParams(limit: 10, parentThreadId: Self.parent))) else {
            throw TestTimeout(description: "bad list")
        }
        #expect(Set(children.data.compactMap(\.id)) == [Self.explorer, Self.tester])
        for child in children.data {
            #expect(child.sessionId == Self.parent, "child \(child.id ?? "") is not in its parent's tree")
            #expect(child.source?.kind == .threadSpawn && child.source?.depth == 1)
        }
        let explorer = try #require(children.data.first { $0.id == Self.explorer })
        #expect(explorer.source?.taskName == "/root/explorer" && explorer.source?.agentNickname == "Ada" && explorer.source?.agentRole == "explorer")
        // The tester recorded no runtime: it takes its parent's when first resumed.
        #expect(children.data.first { $0.id == Self.tester }?.multiAgentRuntime == .unspecified)
        #expect(try await client.resume(Self.tester).thread?.multiAgentRuntime == .v2)

        // The root: every item the transcript held.
        let read = try await client.read(Self.root, turns: true, modelRequests: true)
        let rootThread = try #require(read.thread)
        #expect(rootThread.multiAgentRuntime == .v2 && rootThread.cwd == "/work/app")
        let turns = rootThread.turns
        let first = try #require(turns.first { $0.id == "turn-1" })
        #expect(first.items.map(\.type) == [.userMessage, .reasoning, .toolCall, .agentMessage])
        #expect(first.items[1].text == "I should run ls in the workspace.")
        #expect(first.items[2].toolName == "shell" && first.items[2].toolOutput == "a.txt\nb.txt" && first.items[2].status == .completed)
        #expect(first.items[2].toolArguments?.contains("\"ls\"") == true)
        #expect(first.modelRequests.first?.usage?.inputTokens == 1200 && first.modelRequests.first?.usage?.outputTokens == 40)
        let second = try #require(turns.first { $0.id == "turn-2" })
        #expect(second.items.compactMap(\.toolName) == ["local_shell", "apply_patch"])
        #expect(second.items.first { $0.toolName == "apply_patch" }?.toolOutput == "Success. Updated a.txt")
        #expect(turns.contains { $0.items.contains { $0.type == .contextCompaction } })
        // The rolled-back turn is left out of thread/read, and kept with include_rolled_back.
        #expect(!turns.contains { $0.id == "turn-3" })
        guard case let .threadRead(withRolledBack) = try await client.result(.threadRead(Wire.ThreadReadParams(
            threadId: Self.root, includeTurns: true, includeRolledBack: true))) else { throw TestTimeout(description: "bad read") }
        #expect(withRolledBack.thread?.turns.first { $0.id == "turn-3" }?.rolledBack == true)

        // What the model is shown next: the compaction's replacement history,
        // not the rolled-back turn, then the new input.
        let next = try await client.runTurn(Self.root, "what now?")
        let shown = next.lastContext.filter { $0.kind == .userInput || $0.kind == .assistantMessage }.compactMap(\.text)
        #expect(shown == ["list the files", "show a.txt and fix its typo", "Summary: listed the files and fixed the typo in a.txt.", "what now?"],
                "\(shown)")
        #expect(!next.lastContext.contains { $0.text?.contains("delete b.txt") == true })

        // The cap counts the imported children: a v2 tree holds 3 (4 threads less the root), two are taken.
        _ = try await client.resume(Self.parent)
        let third = try await client.call(.agentSpawn(Wire.AgentSpawnParams(parentThreadId: Self.parent, message: "a third helper")))
        #expect(third.code == 0, "\(third)")
        let fourth = try await client.call(.agentSpawn(Wire.AgentSpawnParams(parentThreadId: Self.parent, message: "one too many")))
        #expect(fourth.code == 8 && (fourth.message ?? "").contains("agent limit"), "imported children count against the cap: \(fourth)")

        // The parent's collaboration calls name the children.
        let parentTurn = try #require(try await client.read(Self.parent).thread?.turns.first)
        let spawns = parentTurn.items.filter { $0.type == .collabToolCall && $0.toolName == "spawn_agent" }
        #expect(Set(spawns.compactMap(\.receiverThreadId)) == [Self.explorer, Self.tester])
        // Mailbox history of a child.
        let explorerRead = try await client.read(Self.explorer, turns: true, modelRequests: false)
        #expect(explorerRead.thread?.turns.first?.items.contains { $0.type == .agentMessage && $0.text == "Ada finished." } == true)

        // Newest session_meta wins; a torn file keeps what it had.
        let newest = try #require(try await client.read(Self.newest, turns: false).thread)
        #expect(newest.cwd == "/new/place" && newest.multiAgentRuntime == .v2)
        // A later null (a resume that did not record it) erases nothing: still v2, read and resumed.
        #expect(try await client.read(Self.nullVersion, turns: false).thread?.multiAgentRuntime == .v2, "a null erased the recorded runtime")
        #expect(try await client.resume(Self.nullVersion).thread?.multiAgentRuntime == .v2)
        let torn = try #require(try await client.read(Self.torn).thread)
        #expect(torn.turns.first?.items.map(\.text) == ["start something long", "Working on it"])

        // Again: nothing changes.
        let before = try await client.read(Self.parent, turns: false).thread
        let (againStatus, again) = try await importFiles(server, Self.files)
        #expect(againStatus == 0)
        let outcomes = (again["files"] as? [[String: Any]] ?? []).compactMap { $0["outcome"] as? String }
        #expect(outcomes.count == 8 && outcomes.allSatisfy { $0 == "IMPORT_OUTCOME_UNCHANGED" }, "\(outcomes)")
        #expect(try await client.read(Self.parent, turns: false).thread?.updatedAt == before?.updatedAt)
        guard case let .threadList(all) = try await client.result(.threadList(Wire.ThreadListParams(limit: 100))) else {
            throw TestTimeout(description: "bad list")
        }
        let imported: Set<String> = [Self.root, Self.parent, Self.explorer, Self.tester, Self.torn, Self.malformed, Self.newest, Self.nullVersion]
        #expect(imported.isSubset(of: Set(all.data.compactMap(\.id))))
        #expect(all.data.count == 9, "the eight imported and the one spawned, none imported twice")
    }

    @Test("a rollout line nested 100,000 levels deep is skipped, naming the nesting; the rest of the file imports")
    func deeplyNestedLine() async throws {
        let server = try await ServerProcess.launch()
        defer { server.stopInBackground() }
        let path = NSTemporaryDirectory() + "threadwire-deep-\(UUID().uuidString).jsonl"
        defer { try? FileManager.default.removeItem(atPath: path) }
        let meta = #"{"timestamp": "2026-05-03T09:00:00.000Z", "type": "session_meta", "payload": {"id": "0196a000-0000-7000-8000-000000000060", "cwd": "/d", "source": "cli"}}"#
        let deep = #"{"timestamp": "2026-05-03T09:00:01.000Z", "type": "response_item", "payload": "# + String(repeating: "[", count: 100_000)
            + String(repeating: "]", count: 100_000) + "}"
        let user = #"{"timestamp": "2026-05-03T09:00:02.000Z", "type": "response_item", "payload": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "still here"}]}}"#
        try [meta, deep, user].joined(separator: "\n").write(toFile: path, atomically: true, encoding: .utf8)
        let (status, out) = try await runCLI(["import", "--server", "127.0.0.1:\(server.port)", "-o", "json", path])
        #expect(status == 0, "\(out)")
        let output = try #require(try JSONSerialization.jsonObject(with: Data(out.utf8)) as? [String: Any])
        let report = try #require((output["files"] as? [[String: Any]])?.first)
        let skipped = try #require(report["skipped"] as? [[String: Any]])
        #expect(skipped.count == 1 && (skipped[0]["line"] as? Int) == 2 && "\(skipped[0]["reason"] ?? "")".contains("nested deeper than 64"), "\(skipped)")
        #expect(report["thread_id"] as? String == "0196a000-0000-7000-8000-000000000060")
    }

    @Test("--strict: a file with an unreadable line imports nothing and fails; a large file in many pieces commits as one thread")
    func strictAndPieces() async throws {
        let server = try await ServerProcess.launch()
        let (status, output) = try await importFiles(server, ["malformed_middle.jsonl", "torn.jsonl"], extra: ["--strict"])
        #expect(status == 1)
        let failed = output["failed"] as? [[String: Any]] ?? []
        #expect(failed.count == 2 && failed.allSatisfy { "\($0["error"] ?? "")".contains("nothing was imported (strict)") }, "\(failed)")
        let client = try await server.client()
        await expectStatus(5, mentioning: "not found") { _ = try await client.read(Self.malformed) }

        // The root file in pieces of about 1 KiB: several requests, one commit.
        let (piecesStatus, pieces) = try await importFiles(server, ["root.jsonl"], extra: ["--chunk-bytes", "1024"])
        #expect(piecesStatus == 0, "\(pieces)")
        #expect(try await client.read(Self.root).thread?.turns.count == 3)
        // A piece that does not continue the import is refused.
        let gap = try await client.call(.threadImport(Wire.ThreadImportParams(
            fileName: "x", lines: [Array("{}".utf8)], importId: "gap", last: false, firstLine: 5)))
        #expect(gap.code == 5, "\(gap)")
    }

    /// `threadwire import --json` as a principal of `authenticatingServer`.
    func importAs(_ token: String, _ server: ServerProcess, _ names: [String]) async throws -> [String: [String: Any]] {
        let (status, output) = try await importFiles(server, names, extra: ["--auth-token", token])
        #expect(status == 0, "\(output)")
        var byFile: [String: [String: Any]] = [:]
        for report in output["files"] as? [[String: Any]] ?? [] {
            byFile[URL(fileURLWithPath: report["file_name"] as? String ?? "").lastPathComponent] = report
        }
        return byFile
    }

    @Test("two principals: a child alice imported waits for alice's parent only (bob's import of that id links nothing of hers), an id bob holds is imported for alice under her own alias (never ALREADY_EXISTS), and her children find it in either order")
    func principalsStayApart() async throws {
        let (server, tokens) = try await authenticatingServer()
        defer { server.stopInBackground(); try? FileManager.default.removeItem(atPath: tokens) }
        // alice's child first; then bob imports a rollout with its parent's id.
        let aliceChild = try await importAs(aliceToken, server, ["child_explorer.jsonl"])
        #expect(aliceChild["child_explorer.jsonl"]?["thread_id"] as? String == Self.explorer)
        let bobParent = try await importAs(bobToken, server, ["parent_v2.jsonl"])
        #expect(bobParent["parent_v2.jsonl"]?["thread_id"] as? String == Self.parent)
        #expect((bobParent["parent_v2.jsonl"]?["linked_children"] as? Int ?? 0) == 0, "bob's parent linked alice's child")
        let bob = try await connect(server, token: bobToken)
        guard case let .threadList(bobsChildren) = try await bob.result(.threadList(Wire.ThreadListParams(limit: 10, parentThreadId: Self.parent))) else {
            throw TestTimeout(description: "bad list")
        }
        #expect(bobsChildren.data.isEmpty, "alice's child is listed under bob's parent")

        // alice imports the same parent rollout: bob has its id, so it gets
        // alice's alias, and the report says so without naming anyone.
        let aliceParent = try #require(try await importAs(aliceToken, server, ["parent_v2.jsonl"])["parent_v2.jsonl"])
        #expect(aliceParent["outcome"] as? String == "IMPORT_OUTCOME_IMPORTED", "\(aliceParent)")
        #expect(aliceParent["rollout_thread_id"] as? String == Self.parent)
        let alias = try #require(aliceParent["thread_id"] as? String)
        #expect(alias != Self.parent)
        #expect((aliceParent["linked_children"] as? Int) == 1, "alice's waiting child did not join her parent")
        // Her second child, imported after the parent, finds the alias too.
        let aliceTester = try await importAs(aliceToken, server, ["child_tester.jsonl"])
        #expect(aliceTester["child_tester.jsonl"]?["parent_thread_id"] as? String == alias)
        let alice = try await connect(server, token: aliceToken)
        guard case let .threadList(alicesChildren) = try await alice.result(.threadList(Wire.ThreadListParams(limit: 10, parentThreadId: alias))) else {
            throw TestTimeout(description: "bad list")
        }
        #expect(Set(alicesChildren.data.compactMap(\.id)) == [Self.explorer, Self.tester])
        for child in alicesChildren.data { #expect(child.sessionId == alias, "child \(child.id ?? "") is not in alice's tree") }
        // Imported again: unchanged, under the same alias.
        let again = try #require(try await importAs(aliceToken, server, ["parent_v2.jsonl"])["parent_v2.jsonl"])
        #expect(again["outcome"] as? String == "IMPORT_OUTCOME_UNCHANGED" && again["thread_id"] as? String == alias)
        // bob's parent is untouched: its own thread, no children.
        #expect(try await bob.read(Self.parent, turns: false).thread?.id == Self.parent)
    }

    @Test("a parent's spawn items name its principal's own children: with bob holding a child's id, alice's parent names her alias of it, the id her child's import then gets")
    func receiversNameOwnChildren() async throws {
        let (server, tokens) = try await authenticatingServer()
        defer { server.stopInBackground(); try? FileManager.default.removeItem(atPath: tokens) }
        _ = try await importAs(bobToken, server, ["child_explorer.jsonl"])
        let aliceParent = try #require(try await importAs(aliceToken, server, ["parent_v2.jsonl"])["parent_v2.jsonl"])
        #expect(aliceParent["thread_id"] as? String == Self.parent, "nobody else holds the parent's id")
        let alice = try await connect(server, token: aliceToken)
        let receivers = try #require(try await alice.read(Self.parent).thread).turns.flatMap(\.items).compactMap(\.receiverThreadId)
        #expect(receivers.contains(Self.tester), "the tester's id is free: kept as it is (\(receivers))")
        #expect(!receivers.contains(Self.explorer), "alice's parent names bob's thread (\(receivers))")
        let aliceExplorer = try #require(try await importAs(aliceToken, server, ["child_explorer.jsonl"])["child_explorer.jsonl"])
        let alias = try #require(aliceExplorer["thread_id"] as? String)
        #expect(alias != Self.explorer && aliceExplorer["rollout_thread_id"] as? String == Self.explorer)
        #expect(receivers.contains(alias), "the parent's spawn item names \(receivers), her child is \(alias)")
        #expect(aliceExplorer["parent_thread_id"] as? String == Self.parent)
    }

    @Test("agent tools across a forged link: alice's thread stored in bob's tree (as an import before this fix could leave it) is neither listed nor closed by bob's agent tools")
    func agentToolsStayWithinAPrincipal() async throws {
        let provider = try await FakeProvider.launch()
        defer { provider.stop() }
        let (server, tokens) = try await authenticatingServer(config: ModelProviderTests.config(provider),
                                                              environment: ["FAKE_PROVIDER_KEY": "sk-test-123"])
        defer { server.stopInBackground(); try? FileManager.default.removeItem(atPath: tokens) }
        let bob = try await connect(server, token: bobToken)
        let alice = try await connect(server, token: aliceToken)
        let root = try #require(try await bob.startThread(Wire.ThreadStartParams(model: "remote-1")).thread?.id)
        let alicesThread = try #require(try await alice.startThread(Wire.ThreadStartParams(model: "remote-1")).thread?.id)
        // The forged link: alice's thread as a spawned child in bob's tree.
        let store = try SQLiteThreadStore(directory: server.dataDir + "/store")
        var forged = try #require(try await store.threadRecord(alicesThread))
        forged.sessionID = root
        forged.parentID = root
        forged.source = .threadSpawn
        forged.depth = 1
        forged.taskName = "/root/stolen"
        forged.version += 1
        try await store.commit([.putThread(forged)])

        try await provider.script([
            FakeProvider.stream(toolCalls: [
                (name: "list_agents", arguments: "{}"),
                (name: "close_agent", arguments: #"{"target": "\#(alicesThread)"}"#),
                (name: "close_agent", arguments: #"{"target": "stolen"}"#),
            ]),
            FakeProvider.stream(text: ["done"]).merging(["match": "tool_call_id"]) { $1 },
        ])
        let turn = try await bob.runTurn(root, "who is below me?")
        let calls = turn.items.filter { $0.type == .collabToolCall }
        #expect(calls.map(\.toolName) == ["list_agents", "close_agent", "close_agent"])
        let listed = try #require(calls.first?.toolOutput)
        #expect(!listed.contains(alicesThread) && !listed.contains("stolen"), "bob's list_agents shows alice's thread: \(listed)")
        for close in calls.dropFirst() {
            #expect(close.toolOutput?.contains("unknown target") == true, "\(close.toolOutput ?? "")")
        }
        #expect(try await store.threadRecord(alicesThread)?.agentClosed == false, "bob's close_agent closed alice's thread")
    }
}
