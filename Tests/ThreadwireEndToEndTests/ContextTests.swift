import Foundation
import Testing
import ThreadwireServerTesting
import ThreadwireClient
import ThreadwireTesting
import ThreadwireWire

/// Context that lasts (issue 24): compaction, rollback, steering, names and
/// search, through the real server over TCP, with kill -9 where a change
/// must survive.
@Suite("context that lasts: compaction, rollback, steering, names", .timeLimit(.minutes(4)))
struct ContextTests {
    /// A provider model with a 1,000-token window, v2 with the mode gate on.
    static func providerConfig(_ provider: FakeProvider, retries: Int = 0) -> String {
        """
        {"features": {"multi_agent_v2": true, "multi_agent_mode": true},
         "model_providers": [{"name": "fake", "base_url": "\(provider.baseURL)", "api_key_env": "FAKE_PROVIDER_KEY",
                              "max_retries": \(retries), "retry_base_delay_ms": 20}],
         "models": [{"slug": "remote-1", "provider": "fake", "multi_agent_version": "v2", "context_window": 1000}],
         "compaction": {"prompt": "SUMMARISE-NOW", "summary_prefix": "PRIOR: "}}
        """
    }

    static let echoV2Config = #"{"features": {"multi_agent_v2": true, "multi_agent_mode": true}}"#

    static func messages(_ request: [String: Any]) -> [[String: Any]] {
        ((request["body"] as? [String: Any])?["messages"] as? [[String: Any]]) ?? []
    }

    static func contents(_ messages: [[String: Any]]) -> [String] { messages.compactMap { $0["content"] as? String } }

    // MARK: Compaction

    @Test("a thread past the window's threshold compacts before its next request: the summary, the v2 hint and the mode fragment replace what came before, the transcript keeps everything, kill -9 keeps it")
    func automaticCompaction() async throws {
        let provider = try await FakeProvider.launch()
        defer { provider.stop() }
        let server = try await ServerProcess.launch(config: Self.providerConfig(provider), environment: ["FAKE_PROVIDER_KEY": "k"])
        defer { server.stopInBackground() }
        let client = try await server.client()
        let id = try #require(try await client.startThread(Wire.ThreadStartParams(model: "remote-1", multiAgentMode: .proactive)).thread?.id)

        // Turn 1 reports 960 of the 1,000 tokens: the next request would pass 90 %.
        try await provider.script([FakeProvider.stream(text: ["first answer"], usage: (950, 10))])
        #expect(try await client.runTurn(id, "first question").status == .completed)
        try await provider.script([
            FakeProvider.stream(text: ["the user asked a first question and got a first answer"], usage: (960, 30)),
            FakeProvider.stream(text: ["second answer"], usage: (120, 5)),
        ])
        let second = try await client.runTurn(id, "second question")
        #expect(second.status == .completed)
        let compaction = try #require(second.items.first { $0.type == .contextCompaction })
        #expect(compaction.text == "the user asked a first question and got a first answer")

        let sent = try await provider.requests()
        #expect(sent.count == 3)
        let summarise = Self.messages(sent[1])
        #expect(Self.contents(summarise).last == "SUMMARISE-NOW", "the prompt goes last")
        #expect(Self.contents(summarise).contains("first question"), "the summarisation call sees the context")
        #expect((sent[1]["body"] as? [String: Any])?["tools"] == nil, "a summarisation call offers no tools")
        // The request after it: base instructions, the summary, then the hint
        // and the fragment again (the context no longer carries them), then the turn.
        let after = Self.messages(sent[2])
        #expect(after.compactMap { $0["role"] as? String } == ["system", "user", "system", "system", "user"], "developer items go as system")
        let texts = Self.contents(after)
        #expect(texts[1] == "PRIOR: the user asked a first question and got a first answer")
        #expect(texts[2].contains("spawn_agent"), "the v2 usage hint is given again")
        #expect(texts[3].contains("<multi_agent_mode>") && texts[3].contains("proactive"), "the proactive fragment is given again")
        #expect(texts[4] == "second question")
        #expect(!texts.contains("first question") && !texts.contains("first answer"), "what the summary replaced is gone")
        // thread/read shows exactly that, and the whole transcript.
        let stored = try #require(try await client.read(id).thread)
        let requests = try #require(stored.turns.last?.modelRequests)
        #expect(requests.count == 2)
        #expect(requests[0].compactionPrompt == "SUMMARISE-NOW")
        #expect(requests[1].context.compactMap(\.text).dropFirst().elementsEqual(texts.dropFirst()))
        #expect(stored.turns.first?.items.compactMap(\.text) == ["first question", "first answer"])

        // The next turn: no second fragment (the mode did not change), no compaction.
        try await provider.script([FakeProvider.stream(text: ["third answer"], usage: (150, 5))])
        let third = try await client.runTurn(id, "third question")
        #expect(third.modelRequests.count == 1)
        let thirdContext = try #require(third.modelRequests.first?.context)
        #expect(thirdContext.of(.compactionSummary).count == 1)
        #expect(modeFragments(thirdContext) == ["proactive"])
        #expect(thirdContext.compactMap(\.text).suffix(3) == ["second question", "second answer", "third question"])

        await server.kill9()
        try await server.start()
        let reread = try #require(try await server.client().read(id).thread)
        #expect(reread.turns == stored.turns + [third], "compaction and what followed it are durable")
    }

    @Test("a compaction the provider fails leaves the context untouched and fails the turn with the reason")
    func failedCompaction() async throws {
        let provider = try await FakeProvider.launch()
        defer { provider.stop() }
        let server = try await ServerProcess.launch(config: Self.providerConfig(provider), environment: ["FAKE_PROVIDER_KEY": "k"])
        defer { server.stopInBackground() }
        let client = try await server.client()
        let id = try #require(try await client.startThread(Wire.ThreadStartParams(model: "remote-1")).thread?.id)
        try await provider.script([FakeProvider.stream(text: ["first answer"], usage: (950, 10))])
        try await client.runTurn(id, "first question")

        try await provider.script([["status": 500, "body": #"{"error": {"message": "summariser down"}}"#]])
        let failed = try await client.runTurn(id, "second question")
        #expect(failed.status == .failed)
        #expect(failed.failureReason == .providerError)
        #expect(failed.error?.contains("context compaction failed") == true)
        #expect(!failed.items.contains { $0.type == .contextCompaction })
        #expect(failed.modelRequests.count == 1, "only the summarisation call was made")

        // The next attempt sees the context as it was: no summary, every item still there.
        try await provider.script([
            FakeProvider.stream(text: ["a summary"], usage: (980, 5)),
            FakeProvider.stream(text: ["third answer"], usage: (50, 5)),
        ])
        let third = try await client.runTurn(id, "third question")
        #expect(third.status == .completed)
        let retried = try #require(third.modelRequests.first)
        #expect(retried.compactionPrompt != nil)
        #expect(retried.context.of(.compactionSummary).isEmpty)
        #expect(retried.context.compactMap(\.text).contains("first answer"))
        #expect(retried.context.compactMap(\.text).contains("second question"))
    }

    @Test("thread/compact/start compacts as a turn of its own; refused while a turn runs; the summary survives kill -9")
    func compactOnRequest() async throws {
        let server = try await ServerProcess.launch(config: Self.echoV2Config)
        defer { server.stopInBackground() }
        let client = try await server.client()
        let inbox = Inbox(client)
        let id = try #require(try await client.startThread(Wire.ThreadStartParams(multiAgentMode: .explicitRequestOnly)).thread?.id)
        await expectStatus(9, mentioning: "no context to compact") {
            _ = try await client.result(.threadCompactStart(Wire.ThreadCompactStartParams(threadId: id)))
        }
        try await client.runTurn(id, "alpha")
        try await client.runTurn(id, "beta")
        let held = try await client.startTurn(id, "#hold")
        await expectStatus(9, mentioning: held) {
            _ = try await client.result(.threadCompactStart(Wire.ThreadCompactStartParams(threadId: id)))
        }
        _ = try await client.result(.turnInterrupt(Wire.TurnInterruptParams(threadId: id, turnId: held)))

        guard case let .threadCompactStart(started) = try await client.result(.threadCompactStart(Wire.ThreadCompactStartParams(threadId: id))),
              let turnID = started.turn?.id else { Issue.record("bad result"); return }
        let compacted = try await client.waitForTurn(id, turnID)
        #expect(compacted.status == .completed)
        let summary = try #require(compacted.items.first { $0.type == .contextCompaction }?.text)
        #expect(summary.contains("alpha") && summary.contains("beta"))
        try await inbox.waitFor("turn/completed of the compaction") { if case let .turnCompleted(n) = $0 { n.turn?.id == turnID } else { false } }

        await server.kill9()
        try await server.start()
        let after = try await server.client()
        let next = try await after.runTurn(id, "gamma")
        let context = try #require(next.modelRequests.first?.context)
        #expect(context.compactMap(\.kind) == [.baseInstructions, .compactionSummary, .usageHint, .multiAgentMode, .userInput])
        #expect(context.last?.text == "gamma")
        #expect(modeFragments(context) == ["explicitRequestOnly"])
    }

    // MARK: Rollback

    @Test("rollback of 1 and of 3 turns: they leave the model's context, stay readable on request, and it all survives kill -9")
    func rollback() async throws {
        let server = try await ServerProcess.launch(config: Self.echoV2Config)
        defer { server.stopInBackground() }
        let client = try await server.client()
        let watcher = try await server.client()
        let inbox = Inbox(watcher)
        let id = try #require(try await client.startThread(Wire.ThreadStartParams(multiAgentMode: .proactive)).thread?.id)
        _ = try await watcher.resume(id)
        var turns: [String] = []
        for n in 1...5 { turns.append(try #require(try await client.runTurn(id, "turn \(n)").id)) }

        func rollback(_ count: UInt32) async throws -> [String] {
            guard case let .threadRollback(result) = try await client.result(.threadRollback(Wire.ThreadRollbackParams(threadId: id, numTurns: count))) else {
                throw TestTimeout(description: "bad result")
            }
            return result.turnIds
        }
        #expect(try await rollback(1) == [turns[4]])
        #expect(try await rollback(3) == Array(turns[1...3]))
        try await inbox.waitFor("thread/rolled_back of 3 turns") { if case let .threadRolledBack(n) = $0 { n.turnIds.count == 3 } else { false } }
        await expectStatus(3, mentioning: "more than the 1 turn") { _ = try await rollback(2) }
        await expectStatus(3, mentioning: "at least 1") { _ = try await rollback(0) }

        let next = try await client.runTurn(id, "turn 6")
        let texts = try #require(next.modelRequests.first?.context).filter { $0.kind == .userInput || $0.kind == .assistantMessage }.compactMap(\.text)
        #expect(texts == ["turn 1", "echo: turn 1", "turn 6"], "the rolled-back turns are gone from what the model is shown")
        #expect(modeFragments(try #require(next.modelRequests.first?.context)) == ["proactive"], "turn 1's fragment still stands; none is added")

        func readTurns(_ client: ThreadwireClient, includeRolledBack: Bool) async throws -> [Wire.Turn] {
            guard case let .threadRead(result) = try await client.result(.threadRead(Wire.ThreadReadParams(
                threadId: id, includeTurns: true, includeRolledBack: includeRolledBack))) else { throw TestTimeout(description: "bad result") }
            return result.thread?.turns ?? []
        }
        #expect(try await readTurns(client, includeRolledBack: false).compactMap(\.id) == [turns[0], next.id])
        let all = try await readTurns(client, includeRolledBack: true)
        #expect(all.count == 6)
        #expect(all.filter { $0.rolledBack == true }.compactMap(\.id) == Array(turns[1...4]))

        // Refused while a turn runs.
        let held = try await client.startTurn(id, "#hold")
        await expectStatus(9, mentioning: "running turn (\(held))") { _ = try await rollback(1) }
        _ = try await client.result(.turnInterrupt(Wire.TurnInterruptParams(threadId: id, turnId: held)))
        _ = try await client.waitForTurn(id, held)

        await server.kill9()
        try await server.start()
        let after = try await server.client()
        #expect(try await readTurns(after, includeRolledBack: true).filter { $0.rolledBack == true }.compactMap(\.id) == Array(turns[1...4]))
        let later = try await after.runTurn(id, "turn 7")
        let laterTexts = try #require(later.modelRequests.first?.context).filter { $0.kind == .userInput }.compactMap(\.text)
        #expect(laterTexts == ["turn 1", "turn 6", "#hold", "turn 7"])
    }

    @Test("rolling back every turn gives the model the v2 hint and the mode fragment again at the next turn")
    func rollbackEverything() async throws {
        let server = try await InProcessServer.launch(config: Self.echoV2Config)
        let client = try await server.client()
        let id = try #require(try await client.startThread(Wire.ThreadStartParams(multiAgentMode: .proactive)).thread?.id)
        try await client.runTurn(id, "one")
        try await client.runTurn(id, "two")
        _ = try await client.result(.threadRollback(Wire.ThreadRollbackParams(threadId: id, numTurns: 2)))
        let fresh = try await client.runTurn(id, "three")
        let context = try #require(fresh.modelRequests.first?.context)
        #expect(context.compactMap(\.kind) == [.baseInstructions, .usageHint, .multiAgentMode, .userInput])
        #expect(modeFragments(context) == ["proactive"])
    }

    @Test("two clients rolling back at the same moment each take one turn: both acknowledged, neither lost")
    func concurrentRollbacks() async throws {
        let server = try await InProcessServer.launch()
        let (a, b) = (try await server.client(), try await server.client())
        let id = try #require(try await a.startThread().thread?.id)
        var turns: [String] = []
        for n in 1...3 { turns.append(try #require(try await a.runTurn(id, "t\(n)").id)) }
        async let first = a.result(.threadRollback(Wire.ThreadRollbackParams(threadId: id, numTurns: 1)))
        async let second = b.result(.threadRollback(Wire.ThreadRollbackParams(threadId: id, numTurns: 1)))
        let taken = try await [first, second].flatMap { result -> [String] in
            if case let .threadRollback(r) = result { r.turnIds } else { [] }
        }
        #expect(Set(taken) == Set(turns[1...2]) && taken.count == 2)
        let next = try await a.runTurn(id, "t4")
        #expect(next.modelRequests.first?.context.filter { $0.kind == .userInput }.compactMap(\.text) == ["t1", "t4"])
    }

    // MARK: Steering

    /// A client tool that holds its call until `release` yields: a turn
    /// waits on it for as long as a test needs, without timing.
    static func heldTool(_ client: ThreadwireClient) -> (called: AsyncStream<Void>, release: AsyncStream<Void>.Continuation) {
        let (called, calledSink) = AsyncStream<Void>.makeStream()
        let (release, releaseSink) = AsyncStream<Void>.makeStream()
        _ = client.serveClientTools { _, _ in
            calledSink.yield()
            for await _ in release { break }
            return Wire.ToolCallResult(output: "file contents")
        }
        return (called, releaseSink)
    }

    static func steer(_ client: ThreadwireClient, _ thread: String, _ turn: String, _ text: String) async throws -> Wire.TurnSteerResult {
        guard case let .turnSteer(result) = try await client.result(.turnSteer(Wire.TurnSteerParams(
            threadId: thread, expectedTurnId: turn, input: [Wire.UserInput(content: .text(text))]))) else { throw TestTimeout(description: "bad result") }
        return result
    }

    @Test("steering joins the turn at once and reaches the model after the running tool call, at the next request; refused for an ended or another turn; durable across kill -9")
    func steering() async throws {
        let server = try await ServerProcess.launch()
        defer { server.stopInBackground() }
        let client = try await server.capableClient()
        let inbox = Inbox(client)
        let tool = Self.heldTool(client)
        let id = try #require(try await client.startThread(ClientToolTests.startParams()).thread?.id)

        let turn = try await client.startTurn(id, "#tool read_file {\"path\":\"a\"}\nfirst")
        for await _ in tool.called { break }
        let steered = try await Self.steer(client, id, turn, "and also this")
        #expect(steered.turnId == turn && steered.item?.type == .userMessage)
        try await inbox.waitFor("item/completed of the steering input") {
            if case let .itemCompleted(n) = $0 { n.item?.id == steered.item?.id } else { false }
        }
        tool.release.yield()
        let done = try await client.waitForTurn(id, turn)
        #expect(done.status == .completed)
        #expect(done.items.map(\.type) == [.userMessage, .toolCall, .userMessage, .agentMessage])
        #expect(done.items.last?.text == "echo: and also this")
        #expect(done.modelRequests.count == 2)
        let second = try #require(done.modelRequests.last?.context)
        #expect(second.suffix(3).compactMap(\.kind) == [.toolCall, .toolOutput, .userInput], "after the tool call finished")
        #expect(second.last?.text == "and also this")

        // A model that answers without tool calls while input waits gets one more request.
        // Ten seconds of model: the steer lands while it thinks, also when
        // the suite's other tests hold the cores (fresh-clone run 55: 3 s passed first).
        let slow = try await client.startTurn(id, "#sleep 10000\nslow")
        // Steer only once the first request is out; earlier, the input would join that request.
        for _ in 0..<3000 {
            if try await client.read(id).thread?.turns.first(where: { $0.id == slow })?.modelRequests.count == 1 { break }
            try await Task.sleep(for: .milliseconds(5))
        }
        _ = try await Self.steer(client, id, slow, "while it thinks")
        let answered = try await client.waitForTurn(id, slow, timeout: .seconds(40))
        #expect(answered.items.compactMap(\.text) == ["#sleep 10000\nslow", "while it thinks", "echo: slow", "echo: while it thinks"])
        #expect(answered.modelRequests.count == 2)

        await expectStatus(9, mentioning: "has ended (completed)") { _ = try await Self.steer(client, id, turn, "too late") }
        let held = try await client.startTurn(id, "#hold")
        await expectStatus(9, mentioning: "the running turn is \(held)") { _ = try await Self.steer(client, id, turn, "wrong turn") }
        await expectStatus(3, mentioning: "non-empty") { _ = try await Self.steer(client, id, held, "") }
        let kept = try await Self.steer(client, id, held, "kept across a crash")

        await server.kill9()
        try await server.start()
        let recovered = try #require(try await server.client().read(id).thread?.turns.first { $0.id == held })
        #expect(recovered.status == .interrupted)
        #expect(recovered.items.contains { $0.id == kept.item?.id && $0.text == "kept across a crash" })
    }

    @Test("steering from several clients at once: every acknowledged input reaches the model, none twice")
    func concurrentSteering() async throws {
        let server = try await InProcessServer.launch()
        let ide = try await server.capableClient()
        let tool = Self.heldTool(ide)
        let clients = try await (0..<4).asyncMap { _ in try await server.client() }
        let id = try #require(try await ide.startThread(ClientToolTests.startParams()).thread?.id)
        let turn = try await ide.startTurn(id, "#tool read_file {\"path\":\"a\"}\nbase")
        for await _ in tool.called { break }
        let acknowledged = try await withThrowingTaskGroup(of: [String].self) { group in
            for (n, client) in clients.enumerated() {
                group.addTask {
                    var sent: [String] = []
                    for k in 0..<5 {
                        let text = "steer \(n)-\(k)"
                        _ = try await Self.steer(client, id, turn, text)
                        sent.append(text)
                    }
                    return sent
                }
            }
            return try await group.reduce(into: []) { $0 += $1 }
        }
        #expect(acknowledged.count == 20)
        tool.release.yield()
        let done = try await ide.waitForTurn(id, turn)
        let given = done.modelRequests.last?.context.filter { $0.kind == .userInput }.compactMap(\.text) ?? []
        #expect(Set(given.dropFirst()) == Set(acknowledged))
        #expect(given.count == 21, "each input once")
    }

    @Test("the CLI names, searches, steers, compacts and rolls back")
    func cli() async throws {
        let server = try await ServerProcess.launch()
        defer { server.stopInBackground() }
        let client = try await server.client()
        let id = try #require(try await client.startThread().thread?.id)
        let first = try #require(try await client.runTurn(id, "kept").id)
        let second = try #require(try await client.runTurn(id, "taken back").id)
        let address = ["--server", "127.0.0.1:\(server.port)"]

        #expect(try await runCLI(["thread", "name", id, "cli named thread"] + address).0 == 0)
        let (listed, list) = try await runCLI(["thread", "list", "--search", "NAMED THR"] + address)
        #expect(listed == 0 && list.contains(id))
        let (_, none) = try await runCLI(["thread", "list", "--search", "unnamed"] + address)
        #expect(!none.contains(id))
        let (rolled, rollback) = try await runCLI(["thread", "rollback", id, "1"] + address)
        #expect(rolled == 0 && rollback.contains(second) && !rollback.contains(first))
        let (compacted, compaction) = try await runCLI(["thread", "compact", id] + address)
        #expect(compacted == 0 && compaction.contains("summary of"), "the compaction turn's item is printed")

        let held = try await client.startTurn(id, "#hold")
        let (steered, steer) = try await runCLI(["turn", "steer", id, held, "from the command line"] + address)
        #expect(steered == 0 && steer.contains(held))
        let (refused, _) = try await runCLI(["turn", "steer", id, first, "to an ended turn"] + address)
        #expect(refused != 0)
        let turn = try #require(try await client.read(id).thread?.turns.first { $0.id == held })
        #expect(turn.items.contains { $0.text == "from the command line" })
    }

    @Test("the CLI forks at a turn, reverts from one, lists items and loaded threads, and sets a sticky reasoning effort")
    func cliBranches() async throws {
        let server = try await ServerProcess.launch()
        defer { server.stopInBackground() }
        let client = try await server.client()
        let id = try #require(try await client.startThread().thread?.id)
        let first = try #require(try await client.runTurn(id, "one").id)
        let second = try #require(try await client.runTurn(id, "two").id)
        let address = ["--server", "127.0.0.1:\(server.port)"]

        let (forked, _) = try await runCLI(["thread", "fork", id, "--at", first] + address)
        #expect(forked == 0)
        guard case let .threadList(listed) = try await client.result(.threadList(Wire.ThreadListParams(limit: 10))) else {
            throw UnexpectedResult(expected: "thread/list")
        }
        let forkID = try #require(listed.data.first { $0.forkedFromId == id }?.id)
        #expect(try await client.read(forkID).thread?.turns.map(\.id) == [first], "the fork holds the first turn only")
        let (bad, _) = try await runCLI(["thread", "fork", id, "--at", first, "--before", second] + address)
        #expect(bad != 0)
        let (itemsRun, items) = try await runCLI(["thread", "items", id, "--limit", "3"] + address)
        #expect(itemsRun == 0 && items.contains("echo: one") && items.contains("next_cursor"))
        let (loadedRun, loaded) = try await runCLI(["thread", "loaded"] + address)
        #expect(loadedRun == 0 && loaded.contains(id))
        let (tableRun, table) = try await runCLI(["thread", "list", "-o", "table"] + address)
        let lines = table.split(separator: "\n")
        #expect(tableRun == 0 && lines.first?.hasPrefix("ID") == true && lines.contains { $0.hasPrefix(id) && $0.contains("echo") == false })
        #expect(lines.count == 3, "a header and one line per thread (the source and its fork): \(table)")
        let (reverted, revert) = try await runCLI(["thread", "revert", id, "--before", second] + address)
        #expect(reverted == 0 && revert.contains(second) && !revert.contains(first))
        #expect(try await client.read(id).thread?.turns.map(\.id) == [first], "the reverted turn is out of the transcript's default view")
        let (effortRun, _) = try await runCLI(["turn", "start", id, "three", "--effort", "high"] + address)
        #expect(effortRun == 0)
        #expect(try await client.read(id).settings?.reasoningEffort == "high")

        // turn interrupt without a turn id: the running one.
        let held = try await client.startTurn(id, "#hold")
        #expect(try await runCLI(["turn", "interrupt", id] + address).0 == 0)
        #expect(try await client.waitForTurn(id, held).status == .interrupted)
        #expect(try await runCLI(["turn", "interrupt", id] + address).0 == 73, "no running turn: FAILED_PRECONDITION, 64 + 9")
    }

    @Test("CLI exit codes: 0, 2 for usage, 64 + the status for a refused call with its name on stderr, 78 when the server is out of reach; --version")
    func cliExitCodes() async throws {
        let server = try await ServerProcess.launch()
        defer { server.stopInBackground() }
        let address = ["--server", "127.0.0.1:\(server.port)"]
        let cli = ServerProcess.binary.replacingOccurrences(of: "threadwire-server", with: "threadwire")

        #expect(try await runCLI(["health"] + address).0 == 0)
        let (missing, _, missingError) = try await runBinary(cli, ["thread", "read", "no-such-thread"] + address)
        #expect(missing == 69, "NOT_FOUND is 64 + 5")
        #expect(missingError.contains("\"status\" : \"NOT_FOUND\"") || missingError.contains("\"status\": \"NOT_FOUND\""), "\(missingError)")
        let (invalid, _, _) = try await runBinary(cli, ["turn", "start", "no-such-thread", ""] + address)
        #expect(invalid == 67 || invalid == 69, "a refused call exits 64 + its status, got \(invalid)")
        let (usage, _, _) = try await runBinary(cli, ["thread", "read"] + address)
        #expect(usage == 2)
        let (version, out, _) = try await runBinary(cli, ["--version"])
        #expect(version == 0 && out.contains("0.1"))
        // A port nobody listens on: one attempt, UNAVAILABLE's 78, one line.
        let (unreachable, _, said) = try await runBinary(cli, ["health", "--server", "127.0.0.1:1"])
        #expect(unreachable == 78)
        #expect(said.contains("UNAVAILABLE: cannot reach the server"), "\(said)")
    }

    // MARK: Names and search

    static func nameAndSearch(_ server: ServerProcess) async throws {
        let client = try await server.client()
        let inbox = Inbox(client)
        let ids = try await ["Fix the login bug", "write release notes", "refactor parser"].asyncMap { text -> String in
            let id = try #require(try await client.startThread().thread?.id)
            try await client.runTurn(id, "please \(text)")
            return id
        }
        // Named at once from several clients.
        let others = try await (0..<3).asyncMap { _ in try await server.client() }
        try await withThrowingTaskGroup(of: Void.self) { group in
            for (index, name) in ["Auth work", "Docs", "Parser cleanup"].enumerated() {
                group.addTask { _ = try await others[index].result(.threadNameSet(Wire.ThreadNameSetParams(threadId: ids[index], name: name))) }
            }
            try await group.waitForAll()
        }
        try await inbox.waitFor("thread/name/updated") { if case let .threadNameUpdated(n) = $0 { n.threadId == ids[0] && n.name == "Auth work" } else { false } }

        func search(_ client: ThreadwireClient, _ term: String) async throws -> [String] {
            guard case let .threadList(list) = try await client.result(.threadList(Wire.ThreadListParams(searchTerm: term))) else {
                throw TestTimeout(description: "bad result")
            }
            return list.data.compactMap(\.id)
        }
        #expect(try await search(client, "AUTH") == [ids[0]], "names match, ignoring case")
        #expect(try await search(client, "release not") == [ids[1]], "previews match")
        #expect(Set(try await search(client, "par")) == [ids[2]])
        #expect(try await search(client, "nothing like it").isEmpty)
        await expectStatus(3, mentioning: "at least 3") { _ = try await search(client, "ab") }
        await expectStatus(3, mentioning: "at most 200") {
            _ = try await client.result(.threadNameSet(Wire.ThreadNameSetParams(threadId: ids[0], name: String(repeating: "n", count: 201))))
        }
        _ = try await client.result(.threadNameSet(Wire.ThreadNameSetParams(threadId: ids[1], name: "")))
        #expect(try await client.read(ids[1]).thread?.name == nil, "an empty name clears it")

        await server.kill9()
        try await server.start()
        let after = try await server.client()
        #expect(try await search(after, "parser cleanup") == [ids[2]], "names survive kill -9")
        #expect(try await search(after, "docs").isEmpty, "a cleared name is not found")
        #expect(try await after.read(ids[0]).thread?.name == "Auth work")
    }

    @Test("names set, listed and searched on SQLite, across kill -9")
    func namesOnSQLite() async throws {
        let server = try await ServerProcess.launch()
        defer { server.stopInBackground() }
        try await Self.nameAndSearch(server)
    }

    @Test("names set, listed and searched on PostgreSQL, across kill -9")
    func namesOnPostgres() async throws {
        let url = try await PostgresCluster.database()
        let server = try await ServerProcess.launch(arguments: ["--store", url])
        defer { server.stopInBackground() }
        try await Self.nameAndSearch(server)
    }
}
