import Foundation
import Testing
import ThreadwireServerTesting
import ThreadwireClient
import ThreadwireWire

/// turn/start's when_busy and the durable turn queue, over the real protocol
/// against the in-process server and its SQLite store.
@Suite("a thread's turn queue (real server)", .timeLimit(.minutes(3)))
struct QueueTests {
    static func params(_ id: String, _ text: String, _ whenBusy: Wire.WhenBusy? = nil) -> Wire.TurnStartParams {
        Wire.TurnStartParams(threadId: id, input: [Wire.UserInput(content: .text(text))], whenBusy: whenBusy)
    }

    static func start(_ client: ThreadwireClient, _ id: String, _ text: String, _ whenBusy: Wire.WhenBusy? = nil) async throws -> Wire.TurnStartResult {
        guard case let .turnStart(result) = try await client.result(.turnStart(params(id, text, whenBusy))) else {
            throw UnexpectedResult(expected: "turn/start")
        }
        return result
    }

    static func queue(_ client: ThreadwireClient, _ id: String) async throws -> [Wire.QueuedTurn] {
        guard case let .threadQueueList(result) = try await client.result(.threadQueueList(Wire.ThreadQueueListParams(threadId: id))) else {
            throw UnexpectedResult(expected: "thread/queue/list")
        }
        return result.data
    }

    /// The user inputs of the thread's turns, in order, once every turn ended.
    static func inputs(_ client: ThreadwireClient, _ id: String, count: Int) async throws -> [String] {
        try await waitUntil("\(count) turns ended", timeout: .seconds(30)) {
            let turns = try await client.read(id, modelRequests: false, turnsLimit: 1000).thread?.turns ?? []
            guard turns.count == count, turns.allSatisfy({ $0.status != .inProgress }) else { return nil }
            return turns.map { $0.items.first?.text ?? "" }
        }
    }

    @Test("enqueued while a turn runs: answered with the queue entry, listed in order, started one by one as each turn ends; notifications tell each change")
    func enqueueRunsInOrder() async throws {
        let server = try await InProcessServer.launch()
        let client = try await server.client()
        let inbox = Inbox(client)
        let id = try #require(try await client.startThread().thread?.id)
        let first = try await Self.start(client, id, "#hold")
        let held = try #require(first.turn?.id)
        #expect(first.queued == nil)
        var queued: [String] = []
        for n in 1...3 {
            let answer = try await Self.start(client, id, "queued \(n)", .enqueue)
            #expect(answer.turn == nil)
            queued.append(try #require(answer.queued?.id))
        }
        #expect(try await Self.queue(client, id).map(\.id) == queued)
        await expectStatus(9, mentioning: "already has an active turn") { _ = try await Self.start(client, id, "refused") }
        _ = try await client.result(.turnInterrupt(Wire.TurnInterruptParams(threadId: id, turnId: held)))
        #expect(try await Self.inputs(client, id, count: 4) == ["#hold", "queued 1", "queued 2", "queued 3"])
        #expect(try await Self.queue(client, id).isEmpty)
        let updates = await inbox.all.compactMap { note -> Int? in
            if case let .threadQueueUpdated(update)? = note.payload { return update.queue.count } else { return nil }
        }
        #expect(updates == [1, 2, 3, 2, 1, 0], "each enqueue and each start tells the queue's new length")
    }

    @Test("interrupt: the running turn is interrupted and the new one starts; steer: the input joins the running turn")
    func interruptAndSteer() async throws {
        let server = try await InProcessServer.launch()
        let client = try await server.client()
        let id = try #require(try await client.startThread().thread?.id)
        let held = try #require(try await Self.start(client, id, "#hold").turn?.id)
        let replacing = try #require(try await Self.start(client, id, "#hold\ninstead", .interrupt).turn?.id)
        #expect(replacing != held)
        let steered = try await Self.start(client, id, "and this too", .steer)
        #expect(steered.turn?.id == replacing, "the answer is the running turn")
        _ = try await client.result(.turnInterrupt(Wire.TurnInterruptParams(threadId: id, turnId: replacing)))
        let turns = try await waitUntil("both turns ended") { () -> [Wire.Turn]? in
            let turns = try await client.read(id, modelRequests: false).thread?.turns ?? []
            return turns.count == 2 && turns.allSatisfy { $0.status != .inProgress } ? turns : nil
        }
        #expect(turns.map(\.id) == [held, replacing])
        #expect(turns[0].status == .interrupted, "interrupted by the second turn/start")
        #expect(turns[1].items.contains { $0.text == "and this too" }, "the steered input joined the running turn")
    }

    @Test("update, delete and reorder queued turns; a stale reorder or a gone entry is refused")
    func queueCommands() async throws {
        let server = try await InProcessServer.launch()
        let client = try await server.client()
        let id = try #require(try await client.startThread().thread?.id)
        let held = try #require(try await Self.start(client, id, "#hold").turn?.id)
        var ids: [String] = []
        for n in 1...3 { ids.append(try #require(try await Self.start(client, id, "q\(n)", .enqueue).queued?.id)) }
        _ = try await client.result(.threadQueueUpdate(Wire.ThreadQueueUpdateParams(threadId: id, queuedId: ids[1],
                                                                                     input: [Wire.UserInput(content: .text("q2 changed"))])))
        _ = try await client.result(.threadQueueDelete(Wire.ThreadQueueDeleteParams(threadId: id, queuedId: ids[0])))
        await expectStatus(5, mentioning: "not in thread") {
            _ = try await client.result(.threadQueueDelete(Wire.ThreadQueueDeleteParams(threadId: id, queuedId: ids[0])))
        }
        await expectStatus(9, mentioning: "every queued turn") {
            _ = try await client.result(.threadQueueReorder(Wire.ThreadQueueReorderParams(threadId: id, queuedIds: ids)))
        }
        _ = try await client.result(.threadQueueReorder(Wire.ThreadQueueReorderParams(threadId: id, queuedIds: [ids[2], ids[1]])))
        #expect(try await Self.queue(client, id).map(\.input) == [["q3"], ["q2 changed"]])
        _ = try await client.result(.turnInterrupt(Wire.TurnInterruptParams(threadId: id, turnId: held)))
        #expect(try await Self.inputs(client, id, count: 3) == ["#hold", "q3", "q2 changed"])
    }

    @Test("two clients enqueue at once while a turn ends, an interrupt and a settings update race them: every queued turn runs once, each client's in its order")
    func concurrentEnqueues() async throws {
        let server = try await InProcessServer.launch()
        let owner = try await server.client()
        let id = try #require(try await owner.startThread().thread?.id)
        _ = try await Self.start(owner, id, "#sleep 200\nfirst")
        let clients = [try await server.client(), try await server.client()]
        try await withThrowingTaskGroup(of: Void.self) { group in
            for (c, client) in clients.enumerated() {
                group.addTask {
                    for n in 0..<10 { _ = try await Self.start(client, id, "c\(c)-\(n)", .enqueue) }
                }
            }
            group.addTask {
                _ = try await owner.updateSettings(Wire.ThreadSettingsUpdateParams(threadId: id, multiAgentModeUpdate: .multiAgentMode(.proactive)))
            }
            group.addTask {
                // An interrupt races them: it ends whichever turn runs and starts now.
                _ = try await Self.start(owner, id, "interrupter", .interrupt)
            }
            try await group.waitForAll()
        }
        let ran = try await Self.inputs(client: owner, id, count: 22)
        #expect(ran.filter { $0 == "interrupter" }.count == 1)
        #expect(Set(ran.filter { $0.hasPrefix("c") }).count == 20, "each queued turn once")
        for c in 0..<2 {
            #expect(ran.filter { $0.hasPrefix("c\(c)-") } == (0..<10).map { "c\(c)-\($0)" }, "client \(c)'s turns in its order")
        }
        #expect(try await owner.read(id).settings?.multiAgentMode == .proactive, "the racing settings update landed too")
    }
}

extension QueueTests {
    static func inputs(client: ThreadwireClient, _ id: String, count: Int) async throws -> [String] {
        try await inputs(client, id, count: count)
    }
}
