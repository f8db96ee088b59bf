import Foundation
import Testing
import ThreadwireServerTesting
import ThreadwireClient
import ThreadwireTesting
import ThreadwireWire

extension ThreadwireClient {
    /// One keyed request; its response whatever the status.
    func keyed(_ key: String, _ params: Wire.Request.Params) async throws -> Wire.Response {
        try await call(params, idempotencyKey: key)
    }
}

func turnStartParams(_ thread: String, _ text: String) -> Wire.Request.Params {
    .turnStart(Wire.TurnStartParams(threadId: thread, input: [Wire.UserInput(content: .text(text))]))
}

/// Request.idempotency_key against the real server binary and its store:
/// repeats on other connections, at the same moment, after kill -9, after a
/// crash between a change and its recorded answer, and across instances.
@Suite("retries that apply once (idempotency keys, real server)", .timeLimit(.minutes(5)))
struct IdempotencyTests {
    @Test("a keyed thread/start and turn/start repeated from other connections are applied once and answered with the first answers, also after kill -9")
    func repeatsApplyOnce() async throws {
        let server = try await ServerProcess.launch()
        let first = try await server.client()
        let started = try await first.keyed("start-1", .threadStart(Wire.ThreadStartParams(model: "echo-1", name: "keyed")))
        #expect(started.code == 0)
        guard case let .threadStart(lifecycle)? = started.result, let thread = lifecycle.thread?.id else {
            Issue.record("thread/start did not answer a thread: \(started)")
            return
        }
        let turn = try await first.keyed("turn-1", turnStartParams(thread, "hello once"))
        guard case let .turnStart(result)? = turn.result, let turnID = result.turn?.id else {
            Issue.record("turn/start did not answer a turn: \(turn)")
            return
        }
        let second = try await server.client()
        let again = try await second.keyed("start-1", .threadStart(Wire.ThreadStartParams(model: "echo-1", name: "keyed")))
        guard case let .threadStart(repeated)? = again.result else {
            Issue.record("the repeat was not answered as thread/start: \(again)")
            return
        }
        #expect(repeated.thread?.id == thread, "the repeat answered another thread")
        let turnAgain = try await second.keyed("turn-1", turnStartParams(thread, "hello once"))
        guard case let .turnStart(turnRepeated)? = turnAgain.result else {
            Issue.record("the repeat was not answered as turn/start: \(turnAgain)")
            return
        }
        #expect(turnRepeated.turn?.id == turnID)
        _ = try await second.waitForTurn(thread, turnID)
        let list = try await second.result(.threadList(Wire.ThreadListParams(limit: 100)))
        guard case let .threadList(threads) = list else { throw TestTimeout(description: "bad list") }
        #expect(threads.data.count == 1, "a repeated thread/start made a second thread")
        #expect(try await second.read(thread).thread?.turns.count == 1, "a repeated turn/start made a second turn")

        await server.kill9()
        try await server.start()
        let third = try await server.client()
        let afterCrash = try await third.keyed("turn-1", turnStartParams(thread, "hello once"))
        guard case let .turnStart(afterResult)? = afterCrash.result else {
            Issue.record("after kill -9 the repeat was not answered: \(afterCrash)")
            return
        }
        #expect(afterResult.turn?.id == turnID)
        #expect(try await third.read(thread).thread?.turns.count == 1)
    }

    @Test("eight connections send the same keyed turn/start at the same moment: one turn, and all eight get its id")
    func concurrentRepeats() async throws {
        let server = try await ServerProcess.launch()
        let owner = try await server.client()
        let thread = try #require(try await owner.startThread().thread?.id)
        let clients = try await (0..<8).asyncMap { _ in try await server.client() }
        for round in 0..<5 {
            let barrier = Barrier(clients.count)
            let key = "race-\(round)"
            let answers = try await withThrowingTaskGroup(of: Wire.Response.self) { group in
                for client in clients {
                    group.addTask {
                        await barrier.arrive()
                        return try await client.keyed(key, turnStartParams(thread, "round \(round)"))
                    }
                }
                var all: [Wire.Response] = []
                for try await answer in group { all.append(answer) }
                return all
            }
            let ids = Set(answers.compactMap { answer -> String? in
                guard case let .turnStart(result)? = answer.result else { return nil }
                return result.turn?.id
            })
            #expect(answers.allSatisfy { $0.code == 0 }, "round \(round): \(answers.map { $0.message ?? "ok" })")
            #expect(ids.count == 1, "round \(round): \(ids.count) different turns were answered")
            _ = try await owner.waitForTurn(thread, try #require(ids.first))
        }
        let turns = try #require(try await owner.read(thread).thread?.turns)
        #expect(turns.count == 5, "five keys, \(turns.count) turns")
        await server.kill9()
        try await server.start()
        #expect(try await server.client().read(thread).thread?.turns.count == 5)
    }

    @Test("eight connections send the same keyed settings/update at once while another client changes the thread: one change per key, all eight answered alike, the other change kept; repeats after later changes and after kill -9 get the first answer and undo nothing")
    func concurrentSettingsRepeats() async throws {
        let server = try await ServerProcess.launch()
        let owner = try await server.client()
        let thread = try #require(try await owner.startThread().thread?.id)
        let clients = try await (0..<8).asyncMap { _ in try await server.client() }
        let other = try await server.client()
        func bytes(_ response: Wire.Response) -> [UInt8] {
            var response = response
            response.id = nil
            return response.serializedBytes()
        }
        func params(_ round: Int) -> Wire.Request.Params {
            .threadSettingsUpdate(Wire.ThreadSettingsUpdateParams(threadId: thread, model: "m-\(round)"))
        }
        var firstAnswers: [[UInt8]] = []
        for round in 0..<5 {
            let barrier = Barrier(clients.count + 1)
            let answers = try await withThrowingTaskGroup(of: Wire.Response?.self) { group in
                for client in clients {
                    group.addTask {
                        await barrier.arrive()
                        return try await client.keyed("settings-\(round)", params(round))
                    }
                }
                group.addTask {
                    await barrier.arrive()
                    let plain = try await other.call(.threadSettingsUpdate(Wire.ThreadSettingsUpdateParams(threadId: thread, cwd: "/w-\(round)")))
                    #expect(plain.code == 0, "the unkeyed change: \(plain)")
                    return nil
                }
                var all: [Wire.Response] = []
                for try await answer in group { if let answer { all.append(answer) } }
                return all
            }
            #expect(answers.allSatisfy { $0.code == 0 }, "round \(round): \(answers.map { $0.message ?? "ok" })")
            #expect(Set(answers.map(bytes)).count == 1, "round \(round): the eight attempts were answered differently")
            guard case let .threadSettingsUpdate(result)? = answers.first?.result else {
                Issue.record("round \(round): not a settings answer")
                return
            }
            #expect(result.changed == true && result.settings?.model == "m-\(round)")
            firstAnswers.append(bytes(answers[0]))
            let stored = try #require(try await owner.read(thread, turns: false).thread)
            #expect(stored.model == "m-\(round)" && stored.cwd == "/w-\(round)", "round \(round): a change was lost: \(stored.model ?? "-") \(stored.cwd ?? "-")")
        }
        // Repeats after later changes: the first answer, and the thread as the later changes left it.
        for round in [0, 2] {
            #expect(bytes(try await clients[round].keyed("settings-\(round)", params(round))) == firstAnswers[round], "repeat of round \(round)")
        }
        #expect(try await owner.read(thread, turns: false).thread?.model == "m-4", "a repeat undid a later change")
        await server.kill9()
        try await server.start()
        let afterKill = try await server.client()
        #expect(bytes(try await afterKill.keyed("settings-1", params(1))) == firstAnswers[1], "repeat after kill -9")
        let final = try #require(try await afterKill.read(thread, turns: false).thread)
        #expect(final.model == "m-4" && final.cwd == "/w-4")
    }

    @Test("a key reused with other params or for another method is INVALID_ARGUMENT and changes nothing; a bad key is refused; reads ignore keys")
    func misuse() async throws {
        let server = try await InProcessServer.launch()
        let client = try await server.client()
        let thread = try #require(try await client.startThread().thread?.id)
        let set = try await client.keyed("k", .threadSettingsUpdate(Wire.ThreadSettingsUpdateParams(threadId: thread, model: "m-1")))
        #expect(set.code == 0)
        let other = try await client.keyed("k", .threadSettingsUpdate(Wire.ThreadSettingsUpdateParams(threadId: thread, model: "m-2")))
        #expect(other.code == 3 && (other.message ?? "").contains("other params"), "\(other)")
        let method = try await client.keyed("k", .threadNameSet(Wire.ThreadNameSetParams(threadId: thread, name: "x")))
        #expect(method.code == 3 && (method.message ?? "").contains("thread/settings/update"), "\(method)")
        let stored = try #require(try await client.read(thread, turns: false).thread)
        #expect(stored.model == "m-1" && stored.name == nil)
        for bad in ["", "has space", String(repeating: "x", count: 129), "naïve"] {
            let refused = try await client.keyed(bad, .threadNameSet(Wire.ThreadNameSetParams(threadId: thread, name: "y")))
            #expect(refused.code == 3 && (refused.message ?? "").contains("idempotency_key"), "key \(bad): \(refused)")
        }
        // Reads are safe to repeat: the same key on two reads answers both.
        let read1 = try await client.keyed("r", .threadRead(Wire.ThreadReadParams(threadId: thread)))
        let read2 = try await client.keyed("r", .threadList(Wire.ThreadListParams()))
        #expect(read1.code == 0 && read2.code == 0)
        await server.stop()
    }

    @Test("a refusal is remembered: a keyed rollback refused for lack of turns stays refused after turns exist, and a fresh key is carried out")
    func refusalsRemembered() async throws {
        let server = try await InProcessServer.launch()
        let client = try await server.client()
        let thread = try #require(try await client.startThread().thread?.id)
        let rollback = Wire.Request.Params.threadRollback(Wire.ThreadRollbackParams(threadId: thread, numTurns: 1))
        let refused = try await client.keyed("rb", rollback)
        #expect(refused.code == 3)
        try await client.runTurn(thread, "now there is a turn")
        let repeated = try await client.keyed("rb", rollback)
        #expect(repeated.code == 3 && repeated.message == refused.message)
        let turns = try #require(try await client.read(thread).thread?.turns)
        #expect(turns.count == 1 && turns[0].rolledBack != true, "the repeat was carried out")
        // A fresh key is carried out.
        #expect(try await client.keyed("rb-2", rollback).code == 0)
        await server.stop()
    }

    @Test("the server dies (SIGKILL) between a keyed change's commit and recording its answer: the repeat is answered from what was made, once")
    func crashBetweenChangeAndAnswer() async throws {
        let faulty = try await ServerProcess.launch(environment: ["THREADWIRE_FAULT_POINTS": "idempotency.after-change"])
        let client = try await faulty.client()
        do {
            let answer = try await client.keyed("crash-start", .threadStart(Wire.ThreadStartParams(name: "made before the crash")))
            Issue.record("the fault point did not kill the server: \(answer)")
        } catch {}
        // The same data directory, without the fault point.
        try await faulty.restart(environment: [:])
        let again = try await faulty.client()
        let repeated = try await again.keyed("crash-start", .threadStart(Wire.ThreadStartParams(name: "made before the crash")))
        guard case let .threadStart(lifecycle)? = repeated.result, let thread = lifecycle.thread?.id else {
            Issue.record("the repeat was not answered with the thread: \(repeated)")
            return
        }
        #expect(lifecycle.thread?.name == "made before the crash")
        let list = try await again.result(.threadList(Wire.ThreadListParams(limit: 10)))
        guard case let .threadList(threads) = list else { throw TestTimeout(description: "bad list") }
        #expect(threads.data.map(\.id) == [thread], "the repeat made another thread")

        // A turn: the crash comes after the turn's commit.
        try await faulty.restart(environment: ["THREADWIRE_FAULT_POINTS": "idempotency.after-change"])
        let third = try await faulty.client()
        _ = try? await third.keyed("crash-turn", turnStartParams(thread, "before the crash"))
        try await faulty.restart(environment: [:])
        let fourth = try await faulty.client()
        let turnAgain = try await fourth.keyed("crash-turn", turnStartParams(thread, "before the crash"))
        guard case let .turnStart(result)? = turnAgain.result, let turnID = result.turn?.id else {
            Issue.record("the repeated turn/start was not answered with its turn: \(turnAgain)")
            return
        }
        let turns = try #require(try await fourth.read(thread).thread?.turns)
        #expect(turns.map(\.id) == [turnID], "one turn, the one answered")
        // Answered once more, now from the recorded answer.
        let third2 = try await fourth.keyed("crash-turn", turnStartParams(thread, "before the crash"))
        guard case let .turnStart(result2)? = third2.result else { throw TestTimeout(description: "no answer") }
        #expect(result2.turn?.id == turnID)
    }

    @Test("a keyed settings update killed (SIGKILL) before it answered, repeated after another client changed the setting: the repeat gets the answer stored with the change and undoes nothing")
    func answerStoredWithTheChange() async throws {
        let server = try await ServerProcess.launch()
        let thread = try #require(try await server.client().startThread().thread?.id)
        try await server.restart(environment: ["THREADWIRE_FAULT_POINTS": "idempotency.after-change"])
        let first = Wire.Request.Params.threadSettingsUpdate(Wire.ThreadSettingsUpdateParams(threadId: thread, model: "first"))
        _ = try? await server.client().keyed("settings-crash", first)
        try await server.restart(environment: [:])
        let other = try await server.client()
        _ = try await other.updateSettings(Wire.ThreadSettingsUpdateParams(threadId: thread, model: "later"))
        let repeated = try await other.keyed("settings-crash", first)
        guard case let .threadSettingsUpdate(result)? = repeated.result else {
            Issue.record("the repeat was not answered: \(repeated)")
            return
        }
        #expect(result.changed == true)
        // Only the change's own transaction can have stored "first": the
        // process died before it could write anything after it.
        #expect(result.settings?.model == "first", "the answer was not the one stored with the change: \(result)")
        #expect(try await other.read(thread, turns: false).thread?.model == "later", "the repeat undid a later change")
    }

    @Test("answers stored in the change's own transaction (settings, tools, turn, name, archive) are the first attempt's answers byte for byte, after kill -9 too")
    func storedAnswersMatchTheFirst() async throws {
        let server = try await ServerProcess.launch()
        let client = try await server.client()
        let thread = try #require(try await client.startThread().thread?.id)
        let tool = Wire.ToolSpec(name: "grep", description: "Searches.", parametersJsonSchema: #"{"type":"object"}"#)
        let requests: [(key: String, params: Wire.Request.Params)] = [
            ("settings", .threadSettingsUpdate(Wire.ThreadSettingsUpdateParams(threadId: thread, model: "stored-with-change"))),
            ("tools", .threadToolsUpdate(Wire.ThreadToolsUpdateParams(threadId: thread, clientTools: [tool]))),
            ("turn", turnStartParams(thread, "stored with its change")),
            ("name", .threadNameSet(Wire.ThreadNameSetParams(threadId: thread, name: "named"))),
            ("archive", .threadArchive(Wire.ThreadArchiveParams(threadId: thread))),
        ]
        func bytes(_ response: Wire.Response) -> [UInt8] {
            var response = response
            response.id = nil
            return response.serializedBytes()
        }
        var firstAnswers: [String: [UInt8]] = [:]
        for request in requests {
            let answer = try await client.keyed(request.key, request.params)
            #expect(answer.code == 0, "\(request.key): \(answer)")
            firstAnswers[request.key] = bytes(answer)
            if case let .turnStart(started)? = answer.result, let turn = started.turn?.id {
                _ = try await client.waitForTurn(thread, turn)
            }
        }
        let sameProcess = try await server.client()
        for request in requests {
            #expect(bytes(try await sameProcess.keyed(request.key, request.params)) == firstAnswers[request.key], "\(request.key)")
        }
        await server.kill9()
        try await server.start()
        let afterKill = try await server.client()
        for request in requests {
            #expect(bytes(try await afterKill.keyed(request.key, request.params)) == firstAnswers[request.key],
                    "\(request.key) after kill -9")
        }
        #expect(try await afterKill.read(thread).thread?.turns.count == 1)
    }

    @Test("keys are forgotten after the retention window: a repeat then is a new request")
    func retention() async throws {
        // 0.003 h = 10.8 s (long enough for the first repeat on a loaded
        // machine); the keeper looks every tenth of it.
        let server = try await InProcessServer.launch(arguments: ["--idempotency-retention-hours", "0.003"])
        let client = try await server.client()
        let params = Wire.Request.Params.threadStart(Wire.ThreadStartParams())
        let first = try await client.keyed("kept-briefly", params)
        let soon = try await client.keyed("kept-briefly", params)
        guard case let .threadStart(a)? = first.result, case let .threadStart(b)? = soon.result else { throw TestTimeout(description: "bad") }
        #expect(a.thread?.id == b.thread?.id)
        try await Task.sleep(for: .seconds(13))
        let later = try await client.keyed("kept-briefly", params)
        guard case let .threadStart(c)? = later.result else { throw TestTimeout(description: "bad") }
        #expect(c.thread?.id != a.thread?.id, "the key outlived its retention")
        await server.stop()
    }

    @Test("reflection says which methods mutate (so clients know which need a key to be retried)")
    func reflectionMutates() async throws {
        let server = try await InProcessServer.launch()
        let client = try await server.client()
        guard case let .reflectionDescriptors(schema) = try await client.result(.reflectionDescriptors(.init())) else {
            throw TestTimeout(description: "bad result")
        }
        let mutating = Set(schema.methods.filter { $0.mutates == true }.compactMap(\.name))
        #expect(mutating.contains("turn/start") && mutating.contains("thread/settings/update") && mutating.contains("thread/start"))
        #expect(!mutating.contains("thread/read") && !mutating.contains("health/check") && !mutating.contains("thread/list"))
        // The Swift client's own table (which calls get a key) agrees for every method.
        for method in schema.methods {
            let params = try #require(try Wire.Request.Params.fromJSON(fieldName: method.field ?? "", .object([]), path: ""))
            #expect(params.mutates == (method.mutates == true), "\(method.name ?? "?")")
        }
        await server.stop()
    }

    @Test("the Swift client's ReconnectingClient: the server dies after applying a turn/start and before answering; the client reconnects to the restarted server, resends with the same key, and there is one turn")
    func clientRetriesAcrossACrash() async throws {
        let server = try await ServerProcess.launch()
        let setup = try await server.client()
        let thread = try #require(try await setup.startThread().thread?.id)
        try await server.restart(environment: ["THREADWIRE_FAULT_POINTS": "idempotency.after-change"])
        var policy = RetryPolicy()
        policy.maxAttempts = 300  // up to a minute: the restart of a debug server on a loaded machine
        policy.initialBackoff = .milliseconds(50)
        policy.maxBackoff = .milliseconds(300)
        let port = server.port
        let client = ReconnectingClient(policy: policy) {
            let connection = try await ThreadwireClient.connect(host: "127.0.0.1", port: port)
            try await connection.initialize(name: "retrying")
            return connection
        }
        // The first attempt kills the server; it comes back (same port) without the fault point.
        let restarted = Task {
            while server.process?.isRunning == true { try await Task.sleep(for: .milliseconds(20)) }
            try await server.restart(environment: [:], port: port)
        }
        let answer = try await client.call(turnStartParams(thread, "survives the crash"))
        try await restarted.value
        guard case let .turnStart(result)? = answer.result, let turnID = result.turn?.id else {
            Issue.record("the retried turn/start was not answered with a turn: \(answer)")
            return
        }
        #expect(client.connections >= 2, "the client never reconnected")
        let turns = try #require(try await server.client().read(thread).thread?.turns)
        #expect(turns.map(\.id) == [turnID], "the retry applied the change again")
        await client.close()
    }
}

/// Across instances on one PostgreSQL: the key lives in the shared store,
/// written with the change, so a repeat that reaches another instance (the
/// first one died, or both got it at once) is applied once too.
@Suite("idempotency keys across instances (real servers, real PostgreSQL)", .timeLimit(.minutes(4)))
struct ClusterIdempotencyTests {
    @Test("the same keyed thread/start sent to two instances at once makes one thread; a keyed turn/start repeated on a survivor after kill -9 of the owner is applied once")
    func acrossInstances() async throws {
        let group = try await InstanceGroup.start(2, leaseSeconds: 2)
        defer { group.stopAll() }
        let a = try await group.instances[0].client()
        let b = try await group.instances[1].client()
        for round in 0..<5 {
            let key = "both-\(round)"
            let (x, y) = await race(
                { try await a.keyed(key, .threadStart(Wire.ThreadStartParams(name: "race \(round)"))) },
                { try await b.keyed(key, .threadStart(Wire.ThreadStartParams(name: "race \(round)"))) })
            let answers = [try x.get(), try y.get()]
            let ids = Set(answers.compactMap { answer -> String? in
                guard case let .threadStart(result)? = answer.result else { return nil }
                return result.thread?.id
            })
            #expect(answers.allSatisfy { $0.code == 0 }, "round \(round): \(answers.map { $0.message ?? "ok" })")
            #expect(ids.count == 1, "round \(round): two threads for one key")
        }
        let list = try await a.result(.threadList(Wire.ThreadListParams(limit: 100)))
        guard case let .threadList(threads) = list else { throw TestTimeout(description: "bad list") }
        #expect(threads.data.count == 5)

        // Instance 0 owns this thread; its turn is keyed.
        let thread = try #require(try await a.startThread().thread?.id)
        let turn = try await a.keyed("owner-dies", turnStartParams(thread, "once"))
        guard case let .turnStart(started)? = turn.result, let turnID = started.turn?.id else { throw TestTimeout(description: "no turn") }
        _ = try await a.waitForTurn(thread, turnID)
        await group.instances[0].kill9()
        // The repeat reaches the survivor, which takes the tree over once the lease lapses.
        let repeated = try await b.keyed("owner-dies", turnStartParams(thread, "once"))
        guard case let .turnStart(again)? = repeated.result else {
            Issue.record("the repeat on the survivor was not answered: \(repeated)")
            return
        }
        #expect(again.turn?.id == turnID)
        #expect(try await b.read(thread).thread?.turns.count == 1, "the repeat on another instance made a second turn")
    }
}
