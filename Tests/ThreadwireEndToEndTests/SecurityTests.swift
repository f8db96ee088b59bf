import Foundation
import Testing
import ThreadwireServerTesting
import ThreadwireClient
import ThreadwireNIO
@testable import ThreadwireServer
import ThreadwireWire

let unauthenticated: UInt32 = 16
let notFound: UInt32 = 5
let resourceExhausted: UInt32 = 8
let failedPrecondition: UInt32 = 9

let aliceToken = "alice-7f3c9a1e5b2d4c6f8a0e"
let bobToken = "bob-2c4e6a8b0d1f3a5c7e9b"
let carolToken = "carol-9e8d7c6b5a4f3e2d1c0b"

/// A server that authenticates with a tokens file of alice and bob.
func authenticatingServer(config: String? = nil, arguments: [String] = [], environment: [String: String] = [:]) async throws -> (ServerProcess, String) {
    let tokens = NSTemporaryDirectory() + "threadwire-tokens-" + UUID().uuidString
    try "# principal token\nalice \(aliceToken)\n\nbob \(bobToken)\n".write(toFile: tokens, atomically: true, encoding: .utf8)
    chmod(tokens, 0o600)
    return (try await ServerProcess.launch(config: config, arguments: ["--auth-tokens", tokens] + arguments, environment: environment), tokens)
}

func connect(_ server: ServerProcess, token: String?) async throws -> ThreadwireClient {
    let client = try await ThreadwireClient.connect(host: "127.0.0.1", port: server.port)
    try await client.initialize(name: "security-tests", authToken: token)
    return client
}

func initializeParams(token: String?) -> Wire.Request.Params {
    .initialize(Wire.InitializeParams(clientInfo: Wire.ClientInfo(name: "security-tests"), protocolVersion: 1, authToken: token))
}

/// The connection is closed by the server within a few seconds.
func expectClosed(_ client: ThreadwireClient, sourceLocation: SourceLocation = #_sourceLocation) async {
    let closed = await withTaskGroup(of: Bool.self) { group in
        group.addTask { await client.waitUntilClosed(); return true }
        group.addTask { try? await Task.sleep(for: .seconds(10)); return false }
        let first = await group.next()!
        group.cancelAll()
        return first
    }
    #expect(closed, "the server should close the connection", sourceLocation: sourceLocation)
}

@Suite("authentication and tenant isolation (real server)", .timeLimit(.minutes(3)))
struct SecurityTests {
    @Test("missing and wrong tokens get UNAUTHENTICATED and a close; before initialize only health/check and reflection/descriptors answer and frames stay small")
    func missingAndWrongTokens() async throws {
        let (server, _) = try await authenticatingServer()
        defer { server.stopInBackground() }

        // Missing token.
        let missing = try await ThreadwireClient.connect(host: "127.0.0.1", port: server.port)
        let refused = try await missing.call(initializeParams(token: nil))
        #expect(refused.code == unauthenticated)
        #expect(refused.message?.contains("auth_token") == true)
        await expectClosed(missing)

        // Wrong tokens: one a byte off, one a prefix, one longer.
        for wrong in [String(aliceToken.dropLast()) + "x", String(aliceToken.dropLast()), aliceToken + "0"] {
            let client = try await ThreadwireClient.connect(host: "127.0.0.1", port: server.port)
            let response = try await client.call(initializeParams(token: wrong))
            #expect(response.code == unauthenticated)
            #expect(response.message?.contains(wrong) == false, "an error never repeats a token")
            await expectClosed(client)
        }

        // Before initialize: health/check answers, other methods do not, and
        // a frame over 64 KiB is refused from its header with a close.
        let early = try await ThreadwireClient.connect(host: "127.0.0.1", port: server.port)
        #expect(try await early.call(.healthCheck(Wire.HealthCheckParams())).code == 0)
        // The schema is public, like gRPC reflection: no token needed.
        #expect(try await early.call(.reflectionDescriptors(Wire.ReflectionDescriptorsParams())).code == 0)
        #expect(try await early.call(.threadList(Wire.ThreadListParams())).code == failedPrecondition)
        let socket = try RawSocket(port: server.port)
        defer { socket.close() }
        try socket.send([0, 0, 1, 0x20, 0])  // a 70,144-byte frame header
        let (envelopes, closed) = await socket.readUntilClosed(seconds: 10)
        #expect(closed)
        guard case let .response(tooLarge)? = envelopes.first?.kind else {
            Issue.record("expected an error frame before the close")
            return
        }
        #expect(tooLarge.code == resourceExhausted)
        #expect(tooLarge.message?.contains("65536") == true)

        // The right token: OK, the principal reported, and the full frame limit after it.
        let alice = try await ThreadwireClient.connect(host: "127.0.0.1", port: server.port)
        guard case let .initialize(result) = try await alice.result(initializeParams(token: aliceToken)) else {
            Issue.record("initialize gave another result")
            return
        }
        #expect(result.principal == "alice")
        let big = String(repeating: "b", count: 200_000)
        let thread = try await alice.startThread(Wire.ThreadStartParams(baseInstructions: big))
        #expect(thread.thread?.id != nil)
        #expect(alice.isActive)
    }

    @Test("SIGHUP re-reads the tokens file: a revoked token's connections close and it no longer authenticates; a new token works; a broken file changes nothing")
    func revokedTokens() async throws {
        let (server, tokens) = try await authenticatingServer()
        defer { server.stopInBackground() }
        let alice = try await connect(server, token: aliceToken)
        let bob = try await connect(server, token: bobToken)
        let bobThread = try #require(try await bob.startThread().thread?.id)

        // Revoke bob, add carol.
        try "alice \(aliceToken)\ncarol \(carolToken)\n".write(toFile: tokens, atomically: true, encoding: .utf8)
        kill(server.pid, SIGHUP)
        await expectClosed(bob)
        var bobAgain: Wire.Response?
        for _ in 0..<100 {
            // The reload is asynchronous to the signal: retry until it took.
            let client = try await ThreadwireClient.connect(host: "127.0.0.1", port: server.port)
            let response = try await client.call(initializeParams(token: bobToken))
            await client.close()
            bobAgain = response
            if response.code == unauthenticated { break }
            try await Task.sleep(for: .milliseconds(50))
        }
        #expect(bobAgain?.code == unauthenticated)
        let carol = try await connect(server, token: carolToken)
        // Carol is a principal of her own: bob's thread is not hers.
        await expectStatus(notFound, mentioning: "not found") { _ = try await carol.read(bobThread) }
        // Alice's connection was not disturbed.
        #expect(try await alice.startThread().thread?.id != nil)

        // A file that does not parse leaves the tokens as they were.
        try "alice\n".write(toFile: tokens, atomically: true, encoding: .utf8)
        kill(server.pid, SIGHUP)
        // The reload is asynchronous to the signal: wait for its refusal in the log.
        _ = try await waitUntil("the refused reload logged") {
            (try? String(contentsOfFile: server.stderrPath, encoding: .utf8))?.contains("auth tokens not reloaded") == true ? true : nil
        }
        _ = try await connect(server, token: carolToken)
        #expect(alice.isActive)
    }

    @Test("THREADWIRE_AUTH_TOKEN alone authenticates one principal, 'default'")
    func environmentToken() async throws {
        let server = try await ServerProcess.launch(environment: ["THREADWIRE_AUTH_TOKEN": carolToken])
        defer { server.stopInBackground() }
        let refused = try await ThreadwireClient.connect(host: "127.0.0.1", port: server.port)
        #expect(try await refused.call(initializeParams(token: aliceToken)).code == unauthenticated)
        let client = try await ThreadwireClient.connect(host: "127.0.0.1", port: server.port)
        guard case let .initialize(result) = try await client.result(initializeParams(token: carolToken)) else {
            Issue.record("initialize gave another result")
            return
        }
        #expect(result.principal == "default")
        // The CLI adds its token to an initialize written by hand.
        let (status, output) = try await runCLI(["call", "initialize", "--json", #"{"client_info": {"name": "by hand"}}"#,
                                           "--server", "127.0.0.1:\(server.port)", "--auth-token", carolToken])
        #expect(status == 0)
        #expect(output.contains(#""principal": "default""#))
    }

    @Test("tokens appear in no log line and no capture file, at trace level, for accepted and refused initializes")
    func tokensNeverLeak() async throws {
        let capture = NSTemporaryDirectory() + "threadwire-capture-" + UUID().uuidString
        let (server, _) = try await authenticatingServer(arguments: ["--record", capture, "--log-level", "trace"])
        let alice = try await connect(server, token: aliceToken)
        _ = try await alice.startThread()
        let wrong = try await ThreadwireClient.connect(host: "127.0.0.1", port: server.port)
        _ = try await wrong.call(initializeParams(token: carolToken))
        await expectClosed(wrong)
        // A peer hello (this server has no peer secret: refused) and an
        // initialize that does not decode (a stray byte after it), both
        // carrying secrets, before any initialize succeeded.
        let peerSecret = "peer-secret-0a1b2c3d4e5f6a7b8c9d"
        let peer = try await ThreadwireClient.connect(host: "127.0.0.1", port: server.port)
        var hello = Wire.InitializeParams(clientInfo: Wire.ClientInfo(name: "peer"), protocolVersion: 1)
        hello.peer = Wire.PeerHello(token: peerSecret, principal: "alice")
        _ = try? await peer.call(.initialize(hello))
        let torn = try await ThreadwireClient.connect(host: "127.0.0.1", port: server.port)
        var broken = Wire.Envelope(kind: .request(Wire.Request(id: 1, params: initializeParams(token: bobToken)))).serializedBytes()
        broken += [0xFF]  // field 31, wire type 7: not protobuf
        try await torn.sendRaw(Framing.frame(broken))
        // Answered in order: once health/check is, the torn frame was read (and recorded).
        #expect(try await torn.call(.healthCheck(Wire.HealthCheckParams())).code ?? 0 == 0)
        #expect(await server.stop() == 0)
        let log = try String(contentsOfFile: server.stderrPath, encoding: .utf8)
        #expect(log.contains("authentication failed"), "the refusal is logged")
        let recorded = try #require(FileManager.default.contents(atPath: capture))
        #expect(recorded.count > 100, "the capture holds the session")
        for token in [aliceToken, bobToken, carolToken, peerSecret] {
            #expect(!log.contains(token))
            #expect(recorded.range(of: Data(token.utf8)) == nil)
        }
    }

    @Test("another principal gets NOT_FOUND for every method on a thread, never sees it listed and never hears of it; forks and children stay the owner's")
    func isolationForEveryMethod() async throws {
        let (server, _) = try await authenticatingServer(config: #"{"features": {"multi_agent": true}}"#)
        defer { server.stopInBackground() }
        let alice = try await connect(server, token: aliceToken)
        let aliceInbox = Inbox(alice)
        let bob = try await connect(server, token: bobToken)
        let bobInbox = Inbox(bob)

        let thread = try #require(try await alice.startThread(Wire.ThreadStartParams(name: "alice's")).thread?.id)
        let turn = try await alice.startTurn(thread, "#hold")
        let child = try #require(try await alice.spawn(thread, message: "child work").thread?.id)
        let fork = try #require(try await alice.fork(thread).thread?.id)
        let bobOwn = try #require(try await bob.startThread().thread?.id)
        let missing = "0196a000-0000-7000-8000-00000000dead"

        // Every method that names a thread, on alice's threads and on one
        // that does not exist: the same code and the same words.
        func calls(_ id: String) -> [(String, Wire.Request.Params)] {
            [
                ("thread/resume", .threadResume(Wire.ThreadResumeParams(threadId: id))),
                ("thread/subscribe", .threadSubscribe(Wire.ThreadSubscribeParams(threadId: id))),
                ("thread/fork", .threadFork(Wire.ThreadForkParams(threadId: id))),
                ("thread/read", .threadRead(Wire.ThreadReadParams(threadId: id))),
                ("thread/read turns", .threadRead(Wire.ThreadReadParams(threadId: id, includeTurns: true))),
                ("thread/turns/list", .threadTurnsList(Wire.ThreadTurnsListParams(threadId: id))),
                ("thread/archive", .threadArchive(Wire.ThreadArchiveParams(threadId: id))),
                ("thread/unarchive", .threadUnarchive(Wire.ThreadUnarchiveParams(threadId: id))),
                ("thread/unsubscribe", .threadUnsubscribe(Wire.ThreadUnsubscribeParams(threadId: id))),
                ("thread/settings/update", .threadSettingsUpdate(Wire.ThreadSettingsUpdateParams(threadId: id, model: "stolen"))),
                ("agent/spawn", .agentSpawn(Wire.AgentSpawnParams(parentThreadId: id, message: "hi"))),
                ("turn/start", .turnStart(Wire.TurnStartParams(threadId: id, input: [Wire.UserInput(content: .text("hi"))]))),
                ("turn/interrupt", .turnInterrupt(Wire.TurnInterruptParams(threadId: id, turnId: turn))),
            ]
        }
        for id in [thread, child, fork] {
            let expected = zip(calls(missing), calls(id))
            for ((_, missingCall), (method, call)) in expected {
                let probe = try await bob.call(missingCall)
                let response = try await bob.call(call)
                #expect(response.code == notFound, "\(method) on \(id)")
                #expect(response.message == probe.message?.replacingOccurrences(of: missing, with: id), "\(method): \(response.message ?? "")")
            }
        }

        // Lists: bob sees his own thread only, also filtered by alice's parent.
        guard case let .threadList(bobList) = try await bob.result(.threadList(Wire.ThreadListParams(limit: 100))) else { throw UnexpectedResult(expected: "threadList") }
        #expect(bobList.data.map(\.id) == [bobOwn])
        guard case let .threadList(children) = try await bob.result(.threadList(Wire.ThreadListParams(parentThreadId: thread))) else { throw UnexpectedResult(expected: "threadList") }
        #expect(children.data.isEmpty)
        guard case let .threadList(aliceList) = try await alice.result(.threadList(Wire.ThreadListParams(limit: 100))) else { throw UnexpectedResult(expected: "threadList") }
        #expect(Set(aliceList.data.compactMap(\.id)) == [thread, child, fork])

        // Nothing bob tried changed alice's thread; alice's own changes reach
        // alice and none of them reach bob.
        try await alice.call(.turnInterrupt(Wire.TurnInterruptParams(threadId: thread, turnId: turn))).expectOK()
        _ = try await alice.waitForTurn(thread, turn)
        _ = try await alice.updateSettings(Wire.ThreadSettingsUpdateParams(threadId: thread, multiAgentModeUpdate: .multiAgentMode(.proactive)))
        _ = try await alice.runTurn(thread, "after")
        try await alice.call(.threadArchive(Wire.ThreadArchiveParams(threadId: thread))).expectOK()
        try await aliceInbox.waitFor("thread/archived") { if case .threadArchived = $0 { true } else { false } }
        let read = try await alice.read(thread)
        #expect(read.thread?.model != "stolen")
        #expect(read.thread?.turns.count == 2, "bob's turn/start never ran")
        _ = try await bob.runTurn(bobOwn, "mine")
        let aliceIDs: Set<String> = [thread, child, fork]
        for notification in await bobInbox.all {
            let text = "\(notification)"
            #expect(!aliceIDs.contains { text.contains($0) }, "bob heard of alice's thread: \(text)")
        }
        #expect(await bobInbox.all.count > 0, "bob hears of his own thread")

        // After a restart (nothing loaded, the store answers): still NOT_FOUND.
        await server.stop()
        try await server.start()
        let bobAgain = try await connect(server, token: bobToken)
        for id in [thread, child, fork] {
            let response = try await bobAgain.call(.threadRead(Wire.ThreadReadParams(threadId: id)))
            #expect(response.code == notFound)
            #expect(try await bobAgain.call(.threadResume(Wire.ThreadResumeParams(threadId: id))).code == notFound)
        }
        let aliceAgain = try await connect(server, token: aliceToken)
        #expect(try await aliceAgain.read(thread).thread?.id == thread)
    }

    @Test("threadwire import --owner gives the imported thread to that principal only")
    func importOwner() async throws {
        let (server, _) = try await authenticatingServer()
        await server.stop()
        let rollout = server.dataDir + "/rollout.jsonl"
        try """
            {"timestamp":"2026-05-01T10:00:00.000Z","type":"session_meta","payload":{"id":"0196a000-0000-7000-8000-0000000a11ce","timestamp":"2026-05-01T10:00:00.000Z","cwd":"/repo","originator":"codex_cli_rs","cli_version":"0.40.0","source":"cli","model_provider":"openai"}}
            {"timestamp":"2026-05-01T10:00:01.500Z","type":"response_item","payload":{"type":"message","role":"user","content":[{"type":"input_text","text":"fix the bug"}]}}
            """.write(toFile: rollout, atomically: true, encoding: .utf8)
        let (status, _) = try await runCLI(["import", "--owner", "alice", "--data-dir", server.dataDir + "/store", rollout])
        #expect(status == 0)
        try await server.start()
        defer { server.stopInBackground() }
        let id = "0196a000-0000-7000-8000-0000000a11ce"
        let alice = try await connect(server, token: aliceToken)
        #expect(try await alice.read(id).thread?.id == id)
        let bob = try await connect(server, token: bobToken)
        #expect(try await bob.call(.threadRead(Wire.ThreadReadParams(threadId: id))).code == notFound)
    }

    @Test("per-principal limits: threads started per minute and turns running at once are RESOURCE_EXHAUSTED naming the limit, also under concurrent requests; other principals are unaffected")
    func principalLimits() async throws {
        let (server, _) = try await authenticatingServer(arguments: ["--max-threads-started-per-minute", "4", "--max-running-turns", "2"])
        defer { server.stopInBackground() }
        let alice1 = try await connect(server, token: aliceToken)
        let alice2 = try await connect(server, token: aliceToken)
        guard case let .initialize(info) = try await (try await ThreadwireClient.connect(host: "127.0.0.1", port: server.port))
            .result(initializeParams(token: bobToken)) else { throw UnexpectedResult(expected: "initialize") }
        #expect(info.limits?.maxThreadsStartedPerMinute == 4)
        #expect(info.limits?.maxRunningTurns == 2)

        // 12 concurrent thread/start from two connections of one principal: exactly 4 pass.
        let responses = await withTaskGroup(of: Wire.Response?.self) { group in
            for index in 0..<12 {
                let client = index % 2 == 0 ? alice1 : alice2
                group.addTask { try? await client.call(.threadStart(Wire.ThreadStartParams())) }
            }
            var all: [Wire.Response?] = []
            for await response in group { all.append(response) }
            return all
        }
        let started = responses.compactMap { $0 }.filter { $0.code == 0 }
        let refused = responses.compactMap { $0 }.filter { $0.code == resourceExhausted }
        #expect(started.count == 4)
        #expect(refused.count == 8)
        #expect(refused.allSatisfy { $0.message?.contains("max_threads_started_per_minute") == true })
        // A fork counts too.
        let first = try #require(started.first.flatMap { if case let .threadStart(r)? = $0.result { r.thread?.id } else { nil } })
        #expect(try await alice1.call(.threadFork(Wire.ThreadForkParams(threadId: first))).code == resourceExhausted)

        // Bob has his own budget: his threads start, and his turns run.
        let bob = try await connect(server, token: bobToken)
        var bobThreads: [String] = []
        for _ in 0..<3 { bobThreads.append(try #require(try await bob.startThread().thread?.id)) }

        // Turns: alice's 4 threads, 4 concurrent held turns, 2 pass.
        let aliceThreads = started.compactMap { if case let .threadStart(r)? = $0.result { r.thread?.id } else { nil } }
        let turnResponses = await withTaskGroup(of: (String, Wire.Response?).self) { group in
            for (index, id) in aliceThreads.enumerated() {
                let client = index % 2 == 0 ? alice1 : alice2
                group.addTask {
                    (id, try? await client.call(.turnStart(Wire.TurnStartParams(threadId: id, input: [Wire.UserInput(content: .text("#hold"))]))))
                }
            }
            var all: [(String, Wire.Response?)] = []
            for await response in group { all.append(response) }
            return all
        }
        let running = turnResponses.filter { $0.1?.code == 0 }
        let turnRefusals = turnResponses.compactMap(\.1).filter { $0.code == resourceExhausted }
        #expect(running.count == 2)
        #expect(turnRefusals.count == 2)
        #expect(turnRefusals.allSatisfy { $0.message?.contains("max_running_turns") == true })
        // Bob's turns are not alice's.
        for id in bobThreads.prefix(2) { _ = try await bob.startTurn(id, "#hold") }

        // One of alice's turns ends: a slot frees.
        let (heldThread, heldResponse) = try #require(running.first)
        guard case let .turnStart(held)? = heldResponse?.result, let heldTurn = held.turn?.id else { throw UnexpectedResult(expected: "turnStart") }
        try await alice1.call(.turnInterrupt(Wire.TurnInterruptParams(threadId: heldThread, turnId: heldTurn))).expectOK()
        _ = try await alice1.waitForTurn(heldThread, heldTurn)
        let runningThreads = Set(running.map(\.0))
        let idle = try #require(aliceThreads.first { !runningThreads.contains($0) })
        #expect(try await alice1.call(.turnStart(Wire.TurnStartParams(threadId: idle, input: [Wire.UserInput(content: .text("#hold"))]))).code == 0)
    }

    @Test("with authentication every per-principal limit has its documented default, reported by initialize; without authentication (one user) there are none unless configured")
    func principalLimitDefaults() async throws {
        let (server, _) = try await authenticatingServer()
        defer { server.stopInBackground() }
        guard case let .initialize(info) = try await (try await ThreadwireClient.connect(host: "127.0.0.1", port: server.port))
            .result(initializeParams(token: aliceToken)) else { throw UnexpectedResult(expected: "initialize") }
        #expect(info.limits?.maxThreadsStartedPerMinute == 600)
        #expect(info.limits?.maxRunningTurns == 64)
        #expect(info.limits?.maxRequestsPerSecond == 1000)
        #expect(info.limits?.requestBurst == 2000)
        #expect(info.limits?.maxStoredBytes == 10 << 30)

        let (configured, _) = try await authenticatingServer(arguments: ["--max-running-turns", "0", "--max-requests-per-second", "50"])
        defer { configured.stopInBackground() }
        guard case let .initialize(chosen) = try await (try await ThreadwireClient.connect(host: "127.0.0.1", port: configured.port))
            .result(initializeParams(token: aliceToken)) else { throw UnexpectedResult(expected: "initialize") }
        #expect(chosen.limits?.maxRunningTurns == 0, "0 configured means no limit, not the default")
        #expect(chosen.limits?.maxRequestsPerSecond == 50)
        #expect(chosen.limits?.requestBurst == 100)
        #expect(chosen.limits?.maxThreadsStartedPerMinute == 600)

        let alone = try await ServerProcess.launch()
        defer { alone.stopInBackground() }
        guard case let .initialize(single) = try await (try await ThreadwireClient.connect(host: "127.0.0.1", port: alone.port))
            .result(initializeParams(token: nil)) else { throw UnexpectedResult(expected: "initialize") }
        #expect(single.limits?.maxThreadsStartedPerMinute == 0)
        #expect(single.limits?.maxRunningTurns == 0)
        #expect(single.limits?.maxRequestsPerSecond == 0)
        #expect(single.limits?.maxStoredBytes == 0)
    }

    @Test("requests per second: past its burst a principal gets RESOURCE_EXHAUSTED naming the limit and when to retry, also under concurrent requests on two connections; another principal is served meanwhile; after the wait it is served again")
    func requestRate() async throws {
        let (server, _) = try await authenticatingServer(arguments: ["--max-requests-per-second", "1", "--request-burst", "5"])
        defer { server.stopInBackground() }
        let alice1 = try await connect(server, token: aliceToken)
        let alice2 = try await connect(server, token: aliceToken)
        let began = ContinuousClock.now
        let responses = await withTaskGroup(of: Wire.Response?.self) { group in
            for index in 0..<20 {
                let client = index % 2 == 0 ? alice1 : alice2
                group.addTask { try? await client.call(.threadList(Wire.ThreadListParams())) }
            }
            var all: [Wire.Response?] = []
            for await response in group { all.append(response) }
            return all
        }
        let elapsed = ContinuousClock.now - began
        let admitted = responses.compactMap { $0 }.filter { $0.code == 0 }.count
        let refused = responses.compactMap { $0 }.filter { $0.code == resourceExhausted }
        #expect(admitted >= 5 && admitted <= 5 + Int(elapsed.components.seconds), "admitted \(admitted) of 20 in \(elapsed)")
        #expect(admitted + refused.count == 20)
        let message = try #require(refused.first?.message)
        #expect(message.contains("max_requests_per_second (1 per second, bursts of 5)"), "\(message)")
        let retry = try #require(message.split(separator: "retry in ").last.flatMap { Int($0.prefix { $0.isNumber }) }, "\(message)")
        #expect(retry > 0 && retry <= 1000)

        let bob = try await connect(server, token: bobToken)
        for _ in 0..<5 { #expect(try await bob.call(.threadList(Wire.ThreadListParams())).code == 0) }

        try await Task.sleep(for: .milliseconds(retry + 50))
        #expect(try await alice1.call(.threadList(Wire.ThreadListParams())).code == 0)
    }

    @Test("stored bytes: once a principal's turns and history reach limits.max_stored_bytes it can start no turn and no thread (RESOURCE_EXHAUSTED naming the limit) but still reads; another principal is unaffected")
    func storedBytesLimit() async throws {
        let (server, _) = try await authenticatingServer(arguments: ["--max-stored-bytes", "20000"])
        defer { server.stopInBackground() }
        let alice = try await connect(server, token: aliceToken)
        let thread = try #require(try await alice.startThread().thread?.id)
        let text = String(repeating: "abcdefgh", count: 500)
        // The measure is at most a few seconds old: turns go on until it sees the bytes.
        var refusal: Wire.Response?
        let deadline = ContinuousClock.now + .seconds(30)
        while refusal == nil, ContinuousClock.now < deadline {
            let response = try await alice.call(.turnStart(Wire.TurnStartParams(threadId: thread, input: [Wire.UserInput(content: .text(text))])))
            if response.code == resourceExhausted {
                refusal = response
            } else {
                guard response.code == 0, case let .turnStart(started)? = response.result, let turn = started.turn?.id else {
                    throw UnexpectedResult(expected: "turn/start to start or be refused, got \(response)")
                }
                _ = try await alice.waitForTurn(thread, turn)
            }
        }
        let refused = try #require(refusal, "no refusal within 30 s")
        #expect(refused.message?.contains("limits.max_stored_bytes is 20000") == true, "\(refused)")
        let newThread = try await alice.call(.threadStart(Wire.ThreadStartParams()))
        #expect(newThread.code == resourceExhausted && newThread.message?.contains("max_stored_bytes") == true, "\(newThread)")
        #expect(try await alice.read(thread).thread?.turns.isEmpty == false, "reads still work")

        let bob = try await connect(server, token: bobToken)
        let bobThread = try #require(try await bob.startThread().thread?.id)
        _ = try await bob.runTurn(bobThread, "hello")
    }

    @Test("listening off loopback without authentication refuses to start and names both ways out; --allow-unauthenticated starts with a warning")
    func refusesInsecureExposure() async throws {
        let dataDir = NSTemporaryDirectory() + "threadwire-exposure-" + UUID().uuidString
        func run(_ arguments: [String], environment: [String: String] = [:]) async throws -> (status: Int32?, stdout: String, stderr: String) {
            try await offThread { try runBlocking(arguments, environment: environment) }
        }
        @Sendable func runBlocking(_ arguments: [String], environment: [String: String]) throws -> (status: Int32?, stdout: String, stderr: String) {
            let process = Process()
            process.executableURL = URL(fileURLWithPath: ServerProcess.binary)
            process.arguments = ["--listen", "0.0.0.0:0", "--data-dir", dataDir] + arguments
            var env = ProcessInfo.processInfo.environment
            env["THREADWIRE_AUTH_TOKEN"] = nil
            process.environment = env.merging(environment) { $1 }
            let out = Pipe(), err = Pipe()
            process.standardOutput = out
            process.standardError = err
            try process.run()
            // A server that started is told to stop once it printed its address.
            var stdout = Data()
            while process.isRunning {
                let chunk = out.fileHandleForReading.availableData
                if chunk.isEmpty { break }
                stdout.append(chunk)
                if String(decoding: stdout, as: UTF8.self).contains("listening on") {
                    process.terminate()
                    break
                }
            }
            process.waitForExit()
            stdout.append(out.fileHandleForReading.readDataToEndOfFile())
            return (process.terminationStatus, String(decoding: stdout, as: UTF8.self),
                    String(decoding: err.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self))
        }
        let refused = try await run([])
        #expect(refused.status != 0)
        #expect(!refused.stdout.contains("listening on"))
        #expect(refused.stderr.contains("--auth-tokens"))
        #expect(refused.stderr.contains("--allow-unauthenticated"))

        let allowed = try await run(["--allow-unauthenticated"])
        #expect(allowed.stdout.contains("listening on"))
        #expect(allowed.stderr.contains("WITHOUT authentication"))

        let authenticated = try await run([], environment: ["THREADWIRE_AUTH_TOKEN": carolToken])
        #expect(authenticated.stdout.contains("listening on"))
        #expect(!authenticated.stderr.contains("WITHOUT authentication"))

        // Client certificates authenticate too.
        let certs = try await makeCertificates()
        let mutual = try await run(["--tls-cert", certs + "/server.pem", "--tls-key", certs + "/server.key", "--tls-client-ca", certs + "/ca.pem"])
        #expect(mutual.stdout.contains("listening on"))
        #expect(!mutual.stderr.contains("WITHOUT authentication"))

        // The admin endpoint off loopback: a token, or the same explicit flag.
        let adminRefused = try await run(["--admin-listen", "0.0.0.0:0"], environment: ["THREADWIRE_AUTH_TOKEN": carolToken])
        #expect(adminRefused.status != 0)
        #expect(!adminRefused.stdout.contains("listening on"))
        #expect(adminRefused.stderr.contains("--admin-token-file") && adminRefused.stderr.contains("--allow-unauthenticated"), "\(adminRefused.stderr)")
        let adminToken = try await run(["--admin-listen", "0.0.0.0:0"],
                                       environment: ["THREADWIRE_AUTH_TOKEN": carolToken, "THREADWIRE_ADMIN_TOKEN": "admin-0123456789abcdef"])
        #expect(adminToken.stdout.contains("listening on"), "\(adminToken.stderr)")
        #expect(!adminToken.stderr.contains("WITHOUT a token"))
        let adminAllowed = try await run(["--admin-listen", "0.0.0.0:0", "--allow-unauthenticated"])
        #expect(adminAllowed.stdout.contains("listening on"))
        #expect(adminAllowed.stderr.contains("admin endpoint") && adminAllowed.stderr.contains("WITHOUT a token"), "\(adminAllowed.stderr)")
    }

    @Test("with an admin token, /metrics, /readyz and /leases answer 401 without 'Authorization: Bearer TOKEN' or with a wrong one, and 200 with it; /livez stays open for probes")
    func adminToken() async throws {
        let token = "admin-0123456789abcdef"
        let server = try await ServerProcess.launch(arguments: ["--admin-listen", "127.0.0.1:0"], environment: ["THREADWIRE_ADMIN_TOKEN": token])
        defer { server.stopInBackground() }
        #expect(try await httpGet(port: server.adminPort, path: "/livez").status == 200)
        for path in ["/metrics", "/readyz", "/leases"] {
            let bare = try await httpGet(port: server.adminPort, path: path)
            #expect(bare.status == 401 && bare.body.contains("Authorization: Bearer"), "\(path): \(bare)")
            #expect(!bare.body.contains(token))
            #expect(try await httpGet(port: server.adminPort, path: path, headers: ["Authorization": "Bearer \(token)x"]).status == 401)
            #expect(try await httpGet(port: server.adminPort, path: path, headers: ["Authorization": token]).status == 401)
            let good = try await httpGet(port: server.adminPort, path: path, headers: ["Authorization": "Bearer \(token)"])
            #expect(good.status == 200, "\(path): \(good)")
        }
    }
}

extension Wire.Response {
    func expectOK(sourceLocation: SourceLocation = #_sourceLocation) {
        #expect(code ?? 0 == 0, "\(message ?? "")", sourceLocation: sourceLocation)
    }
}
