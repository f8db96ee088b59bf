import Foundation
import Synchronization
import Testing
import ThreadwireClient
import ThreadwireServerTesting
import ThreadwireWire

/// Issue 49: a thread's events are numbered in its commits and kept, and a
/// client that lost its connection resumes after the last one it handled.
@Suite("events numbered per thread and resumed after a position", .timeLimit(.minutes(3)))
struct EventResumeTests {
    typealias Event = KeptEvent

    static func kept(_ notifications: [Wire.Notification], thread: String) -> [Event] { KeptEvent.of(notifications, thread: thread) }

    @Test("every kept notification of a thread is numbered 1, 2, 3 in commit order; deltas are not; thread/read and lifecycle results report the newest")
    func numberedInCommitOrder() async throws {
        let server = try await InProcessServer.launch()
        let client = try await server.client()
        let inbox = Inbox(client)
        let started = try await client.startThread()
        let id = try #require(started.thread?.id)
        #expect(started.thread?.threadSequence == 1, "thread/started is the thread's first event")
        for model in ["m-1", "m-2", "m-3"] {
            _ = try await client.updateSettings(Wire.ThreadSettingsUpdateParams(threadId: id, model: model))
        }
        try await client.runTurn(id, "hello")
        let head = try #require(try await client.read(id).thread?.threadSequence)
        let events = try await inbox.kept(of: id, through: head)
        #expect(events.map(\.number) == Array(1...head), "numbers without gap or repeat, in order: \(events)")
        #expect(events.first.map { if case .threadStarted = $0.payload { true } else { false } } == true)
        #expect(events.filter { if case .threadSettingsUpdated = $0.payload { true } else { false } }.count == 3)
        #expect(events.contains { if case .turnCompleted = $0.payload { true } else { false } })
        let deltas = await inbox.all.filter { if case .itemAgentMessageDelta = $0.payload { true } else { false } }
        #expect(deltas.allSatisfy { $0.threadSequence == nil }, "deltas are not kept, so not numbered")
        #expect(try await client.resume(id).thread?.threadSequence == head)
    }

    @Test("a subscriber whose connection is cut again and again while three clients change the thread, resuming after the last event it handled, hears exactly what a subscriber never cut heard, in order, none twice",
          arguments: Joining.allCases)
    func resumeAcrossCuts(joining: Joining) async throws {
        let server = try await InProcessServer.launch()
        let owner = try await server.client()
        let steady = Inbox(owner)
        let id = try #require(try await owner.startThread().thread?.id)

        // Writers: settings from two clients, turns from a third.
        let writing = RunningFlag()
        let writers = Task {
            defer { writing.lower() }
            try await withThrowingTaskGroup(of: Void.self) { group in
                for writer in 0..<2 {
                    group.addTask {
                        let client = try await server.client()
                        for n in 0..<40 {
                            _ = try await client.updateSettings(Wire.ThreadSettingsUpdateParams(threadId: id, model: "w\(writer)-\(n)"))
                        }
                        await client.close()
                    }
                }
                group.addTask {
                    let client = try await server.client()
                    for n in 0..<8 { try await client.runTurn(id, "turn \(n)") }
                    await client.close()
                }
                try await group.waitForAll()
            }
        }

        // The resuming subscriber: each connection lives a few milliseconds.
        var heard: [Event] = []
        var cuts = 0
        var finished = false
        while true {
            let client = try await server.client()
            let inbox = Inbox(client)
            let after = heard.last?.number ?? 0
            _ = try await client.result(joining.request(id, after: after))
            try await Task.sleep(for: .milliseconds(finished ? 300 : Int.random(in: 5...40)))
            await client.close()
            let got = Self.kept(await inbox.all, thread: id)
            #expect(got.first.map { $0.number == after + 1 } ?? true, "the first event after a resume follows the last one handled: \(after) then \(got.first?.description ?? "")")
            heard += got
            cuts += 1
            if finished { break }
            // One more connection after the writers end: it hears the rest.
            if !writing.isRaised { finished = true }
        }
        try await writers.value

        let head = try #require(try await owner.read(id).thread?.threadSequence)
        let reference = try await steady.kept(of: id, through: head)
        #expect(cuts >= 5, "the subscriber was cut \(cuts) times")
        #expect(reference.map(\.number) == Array(1...head))
        #expect(heard.count == reference.count, "heard \(heard.count) events across \(cuts) connections, the steady subscriber \(reference.count)")
        #expect(heard == reference, "the resumed events equal the steady subscriber's, one for one")
    }

    actor Collected {
        var events: [Event] = []
        var byThread: [String: [Event]] = [:]
        var gaps = 0
        func add(_ event: Event) { events.append(event) }
        func add(_ event: Event, thread: String) { byThread[thread, default: []].append(event) }
        func numbers(of thread: String) -> [UInt64] { byThread[thread]?.map(\.number) ?? [] }
        func first(of thread: String) -> Wire.Notification.Payload? { byThread[thread]?.first?.payload }
        func gap() { gaps += 1 }
    }

    @Test("ResumingSubscription: across two restarts of the server, the application gets every kept event once, in order, each connection resuming after the last number handed on")
    func resumingSubscriptionAcrossRestarts() async throws {
        let server = try await InProcessServer.launch()
        let writer = try await server.client()
        let id = try #require(try await writer.startThread().thread?.id)
        let collected = Collected()
        var subscription = ResumingSubscription(threads: [id]) { try await server.client() }
        subscription.retry.initialBackoff = .milliseconds(20)
        subscription.retry.maxBackoff = .milliseconds(200)
        subscription.onGap = { _, _ in await collected.gap() }
        let running = Task {
            await subscription.run(after: [id: 1]) { note in
                if let number = note.threadSequence, let payload = note.payload { await collected.add(Event(number: number, payload: payload)) }
            }
        }
        defer { running.cancel() }
        var client = writer
        for round in 0..<3 {
            for n in 0..<20 {
                _ = try await client.updateSettings(Wire.ThreadSettingsUpdateParams(threadId: id, model: "r\(round)-\(n)"))
            }
            if round < 2 {
                try await server.restart()
                client = try await server.client()
            }
        }
        let head = try #require(try await client.read(id, turns: false).thread?.threadSequence)
        #expect(head == 61)
        let deadline = ContinuousClock.now + .seconds(10)
        while ContinuousClock.now < deadline, await collected.events.last?.number != head {
            try await Task.sleep(for: .milliseconds(20))
        }
        let numbers = await collected.events.map(\.number)
        #expect(numbers == Array(2...head), "every change once, in order, across the restarts: \(numbers)")
        #expect(await collected.gaps == 0)
    }

    @Test("ResumingSubscription of a root: a child agent spawned while the connection was down is heard from its first event, one spawned later live, each child's events once and in order")
    func childrenSpawnedWhileAway() async throws {
        let server = try await InProcessServer.launch(config: #"{"features": {"multi_agent": true}}"#)
        var writer = try await server.client()
        let root = try #require(try await writer.startThread().thread?.id)
        try await writer.runTurn(root, "resolves the runtime, so that it can spawn")
        let collected = Collected()
        // While on, the subscription cannot connect again: what happens meanwhile happens while it is away.
        let holding = Switch()
        var subscription = ResumingSubscription(threads: [root]) {
            while holding.isOn { try await Task.sleep(for: .milliseconds(5)) }
            return try await server.client()
        }
        subscription.retry.initialBackoff = .milliseconds(20)
        subscription.retry.maxBackoff = .milliseconds(100)
        subscription.onGap = { _, _ in await collected.gap() }
        let running = Task {
            await subscription.run(after: [root: 0]) { note in
                if let number = note.threadSequence, let payload = note.payload, let id = payload.threadID {
                    await collected.add(Event(number: number, payload: payload), thread: id)
                }
            }
        }
        defer { running.cancel() }
        _ = try await writer.updateSettings(Wire.ThreadSettingsUpdateParams(threadId: root, model: "before"))
        let before = try #require(try await writer.read(root, turns: false).thread?.threadSequence)
        _ = try await waitUntil("the root's events up to \(before)") { await collected.numbers(of: root).last == before ? true : nil }

        holding.set(true)
        try await server.restart()
        writer = try await server.client()
        let away1 = try #require(try await writer.spawn(root).thread?.id)
        for n in 0..<3 { _ = try await writer.updateSettings(Wire.ThreadSettingsUpdateParams(threadId: away1, model: "away-\(n)")) }
        _ = try await writer.updateSettings(Wire.ThreadSettingsUpdateParams(threadId: root, model: "while away"))
        holding.set(false)

        let rootHead = try #require(try await writer.read(root, turns: false).thread?.threadSequence)
        _ = try await waitUntil("the root's events up to \(rootHead)") { await collected.numbers(of: root).last == rootHead ? true : nil }
        let later = try #require(try await writer.spawn(root).thread?.id)
        _ = try await writer.updateSettings(Wire.ThreadSettingsUpdateParams(threadId: later, model: "live"))
        for child in [away1, later] {
            let head = try #require(try await writer.read(child, turns: false).thread?.threadSequence)
            _ = try await waitUntil("child \(child)'s events up to \(head)") { await collected.numbers(of: child).last == head ? true : nil }
            let numbers = await collected.numbers(of: child)
            #expect(numbers == Array(1...head), "child \(child): every kept event once, in order, from thread/started: \(numbers)")
            if case .threadStarted? = await collected.first(of: child) {} else {
                Issue.record("child \(child)'s first event is not thread/started")
            }
        }
        #expect(await collected.numbers(of: root) == Array(1...rootHead))
        #expect(await collected.gaps == 0)
    }

    @Test("a resume refused for its position subscribes nobody and leaves the thread to unload when idle")
    func refusedResumeUnloads() async throws {
        let server = try await InProcessServer.launch(arguments: ["--idle-unload-seconds", "0.2"])
        let creator = try await server.client()
        let id = try #require(try await creator.startThread().thread?.id)
        await creator.close()
        let client = try await server.client()
        func unloaded() async throws -> Bool {
            let deadline = ContinuousClock.now + .seconds(10)
            while ContinuousClock.now < deadline {
                if try await client.read(id, turns: false).thread?.status?.type == .notLoaded { return true }
                try await Task.sleep(for: .milliseconds(50))
            }
            return false
        }
        #expect(try await unloaded(), "unloaded once its only subscriber left")
        let refused = await #expect(throws: ClientError.self) {
            _ = try await client.result(.threadResume(Wire.ThreadResumeParams(threadId: id, excludeTurns: true, afterThreadSequence: 9)))
        }
        guard case let .status(code, _)? = refused else { throw UnexpectedResult(expected: "INVALID_ARGUMENT") }
        #expect(code == 3)
        #expect(try await unloaded(), "loaded for the refused resume, then unloaded again")
    }

    @Test("positions: after the newest sends nothing, ahead of it is INVALID_ARGUMENT, older than the oldest kept is OUT_OF_RANGE naming it, and numbers go on after a restart")
    func positionsAndRestart() async throws {
        let server = try await InProcessServer.launch(config: #"{"events": {"keep_count": 100, "trim_interval_ms": 50}}"#)
        let client = try await server.client()
        let id = try #require(try await client.startThread().thread?.id)
        for n in 0..<200 {
            _ = try await client.updateSettings(Wire.ThreadSettingsUpdateParams(threadId: id, model: "m-\(n)"))
        }
        let head = try #require(try await client.read(id).thread?.threadSequence)
        #expect(head == 201)

        func resume(after: UInt64) async throws -> [Event] {
            let other = try await server.client()
            let inbox = Inbox(other)
            _ = try await other.result(.threadResume(Wire.ThreadResumeParams(threadId: id, excludeTurns: true, afterThreadSequence: after)))
            _ = try await other.result(.healthCheck(Wire.HealthCheckParams()))
            try await Task.sleep(for: .milliseconds(100))
            await other.close()
            return Self.kept(await inbox.all, thread: id)
        }
        #expect(try await resume(after: head).isEmpty)
        let tail = try await resume(after: head - 10)
        #expect(tail.map(\.number) == Array((head - 9)...head))

        let ahead = await #expect(throws: ClientError.self) { _ = try await resume(after: head + 1) }
        guard case let .status(code, message)? = ahead else { throw UnexpectedResult(expected: "INVALID_ARGUMENT") }
        #expect(code == 3, "INVALID_ARGUMENT: \(message)")
        #expect(message.contains("ahead"), "\(message)")
        // The trim runs every 50 ms: the newest 100 are kept.
        var trimmed: ClientError?
        let deadline = ContinuousClock.now + .seconds(10)
        while trimmed == nil, ContinuousClock.now < deadline {
            do { _ = try await resume(after: 5) } catch let error as ClientError { trimmed = error }
            try await Task.sleep(for: .milliseconds(50))
        }
        if case let .status(code, message)? = trimmed {
            #expect(code == 11, "OUT_OF_RANGE: \(message)")
            let oldest = try #require(message.firstMatch(of: /keeps events from (\d+) on/).flatMap { UInt64($0.1) }, "\(message)")
            #expect(oldest == head - 99, "the newest 100 are kept: \(message)")
            let replayed = try await resume(after: oldest - 1)
            #expect(replayed.map(\.number) == Array(oldest...head), "from the oldest kept number the replay is whole")
        } else {
            throw UnexpectedResult(expected: "OUT_OF_RANGE")
        }

        try await server.restart()
        let again = try await server.client()
        _ = try await again.updateSettings(Wire.ThreadSettingsUpdateParams(threadId: id, model: "after-restart"))
        #expect(try await again.read(id).thread?.threadSequence == head + 1, "the number goes on from the stored one")
        let after = try await resume(after: head)
        #expect(after.map(\.number) == [head + 1])
        if case let .threadSettingsUpdated(update)? = after.first?.payload {
            #expect(update.settings?.model == "after-restart")
        } else {
            Issue.record("expected thread/settings/updated, got \(after)")
        }
    }

    actor Requests {
        var received: [Wire.ServerRequest] = []
        func add(_ request: Wire.ServerRequest) { received.append(request) }
    }

    /// A client that declares every kind of server request, its requests collected.
    static func participant(_ server: InProcessServer) async throws -> (ThreadwireClient, Requests) {
        let client = try await server.client(initialize: false)
        try await client.initialize(name: "ide", authToken: server.token, clientTools: true, approvals: true, userInput: true)
        let requests = Requests()
        Task { for await request in client.serverRequests { await requests.add(request) } }
        return (client, requests)
    }

    @Test("thread/subscribe: a watcher hears the kept events after its position, then live ones, is sent none of the thread's server requests (a resumed client is) nor those of a child spawned meanwhile, and changes nothing")
    func subscribeWatches() async throws {
        let server = try await InProcessServer.launch(config: #"{"features": {"multi_agent": true}}"#)
        let (ide, ideRequests) = try await Self.participant(server)
        var params = Wire.ThreadStartParams(model: "watched-model", approvalPolicy: .onRequest)
        params.clientTools = [Wire.ToolSpec(name: "grep", description: "Searches.", parametersJsonSchema: #"{"type":"object"}"#,
                                            requiresApproval: true)]
        let id = try #require(try await ide.startThread(params).thread?.id)
        _ = try await ide.updateSettings(Wire.ThreadSettingsUpdateParams(threadId: id, model: "watched-model-2"))
        let turnID = try await ide.startTurn(id, #"#tool grep {"pattern":"x"}"#)
        let approval = try await waitUntil("the approval at the IDE") { await ideRequests.received.first }

        // The watcher declares every server request too: only thread/subscribe keeps it from them.
        let (watcher, watcherRequests) = try await Self.participant(server)
        let watched = Inbox(watcher)
        guard case let .threadSubscribe(subscribed) = try await watcher.result(.threadSubscribe(Wire.ThreadSubscribeParams(
            threadId: id, afterThreadSequence: 1))) else { throw UnexpectedResult(expected: "thread/subscribe") }
        let head = try #require(subscribed.thread?.threadSequence)
        #expect(subscribed.thread?.turns.isEmpty == true, "a subscription returns no turns")
        #expect(subscribed.settings?.model == "watched-model-2")
        let replayed = try await watched.kept(of: id, through: head)
        #expect(replayed.map(\.number) == Array(2...head), "the kept events after 1: \(replayed)")

        let (resumer, resumerRequests) = try await Self.participant(server)
        _ = try await resumer.resume(id)
        let offered = try await waitUntil("the approval offered to the resumed client") { await resumerRequests.received.first }
        #expect(offered.id == approval.id)

        try await ide.answer(Wire.ServerRequestAnswer(id: approval.id, code: 0,
                                                      result: .itemToolRequestApproval(Wire.ApprovalResult(decision: .approve))))
        let run = try await waitUntil("the tool call at the IDE") { await ideRequests.received.dropFirst().first }
        guard case .itemToolCall? = run.params else { throw UnexpectedResult(expected: "item/tool/call") }
        try await ide.answer(Wire.ServerRequestAnswer(id: run.id, code: 0, result: .itemToolCall(Wire.ToolCallResult(output: "1 match"))))
        _ = try await watched.waitFor("turn/completed, live, at the watcher") {
            if case let .turnCompleted(n) = $0 { n.turn?.id == turnID } else { false }
        }
        // Each client's requests are collected by a task of its own, which
        // may lag its connection: the resumer's tool call is waited for.
        _ = try await waitUntil("the tool call at the resumed client, a participant") {
            await resumerRequests.received.first { $0.id == run.id }
        }
        // A server request sent to the watcher would have come before
        // turn/completed on its connection, long collected by now.
        let sentToWatcher = await watcherRequests.received.map(\.id)
        #expect(sentToWatcher.isEmpty, "the watcher was sent \(sentToWatcher)")
        let after = try await ide.read(id)
        #expect(after.settings?.model == "watched-model-2", "subscribing took no model")
        let newest = try #require(after.thread?.threadSequence)
        let all = try await watched.kept(of: id, through: newest)
        #expect(all.map(\.number) == Array(2...newest), "replayed, then live, no gap and none twice")

        // A child spawned now has its parent's subscribers: the watcher hears
        // it, and still only watches (its requests go to the IDE alone).
        let child = try #require(try await ide.spawn(id, message: #"#tool grep {"pattern":"y"}"#).thread?.id)
        var answered = Set<String>()
        var childEnded = false
        let childDeadline = ContinuousClock.now + .seconds(20)
        while !childEnded {
            guard ContinuousClock.now < childDeadline else { throw UnexpectedResult(expected: "the child's turn/completed within 20 s") }
            let pending = await ideRequests.received.filter { $0.threadId == child && !answered.contains($0.id ?? "") }
            for request in pending {
                answered.insert(request.id ?? "")
                switch request.params {
                case .itemToolRequestApproval?:
                    try await ide.answer(Wire.ServerRequestAnswer(id: request.id, code: 0,
                                                                  result: .itemToolRequestApproval(Wire.ApprovalResult(decision: .approve))))
                default:
                    try await ide.answer(Wire.ServerRequestAnswer(id: request.id, code: 0, result: .itemToolCall(Wire.ToolCallResult(output: "2"))))
                }
            }
            childEnded = await watched.all.contains { if case let .turnCompleted(n)? = $0.payload { n.threadId == child } else { false } }
            if !childEnded { try await Task.sleep(for: .milliseconds(10)) }
        }
        #expect(!answered.isEmpty, "the child's turn asked the IDE")
        #expect(await watched.all.contains { if case let .threadStarted(n)? = $0.payload { n.thread?.id == child } else { false } })
        let sentToWatcherAfterChild = await watcherRequests.received.map(\.id)
        #expect(sentToWatcherAfterChild.isEmpty, "the watcher was sent the child's requests \(sentToWatcherAfterChild)")

        let ahead = await #expect(throws: ClientError.self) {
            _ = try await watcher.result(.threadSubscribe(Wire.ThreadSubscribeParams(threadId: id, afterThreadSequence: newest + 5)))
        }
        guard case let .status(code, _)? = ahead else { throw UnexpectedResult(expected: "INVALID_ARGUMENT") }
        #expect(code == 3)
        let missing = await #expect(throws: ClientError.self) {
            _ = try await watcher.result(.threadSubscribe(Wire.ThreadSubscribeParams(threadId: "no-such-thread")))
        }
        guard case let .status(missingCode, _)? = missing else { throw UnexpectedResult(expected: "NOT_FOUND") }
        #expect(missingCode == 5)
    }
}

final class Switch: Sendable {
    private let on = Mutex(false)
    var isOn: Bool { on.withLock { $0 } }
    func set(_ value: Bool) { on.withLock { $0 = value } }
}

