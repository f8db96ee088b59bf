import Foundation
import Testing
import ThreadwireServerTesting
import ThreadwireClient
import ThreadwireWire

@Suite("thread lifecycle and durability (real server)", .timeLimit(.minutes(3)))
struct LifecycleTests {
    @Test("kill -9 during a stream of writes loses no acknowledged change")
    func killNineDurability() async throws {
        let server = try await ServerProcess.launch()
        // Four connections write concurrently. Each owns a thread whose model it
        // sets to a counter (settings update), and starts new threads in between;
        // every acknowledged write is recorded.
        let writers = try await (0..<4).asyncMap { _ in try await server.client() }
        let owned = try await writers.asyncMap { try #require(try await $0.startThread().thread?.id) }
        let acknowledged = Acknowledged()
        let stream = acknowledged.writeUntilFailure(writers, owned: owned)
        // Kill at a random moment once the stream is well under way.
        while await acknowledged.count < 40 { try await Task.sleep(for: .milliseconds(5)) }
        try await Task.sleep(for: .milliseconds(Int.random(in: 0...150)))
        await server.kill9()
        await stream.value
        let threads = await acknowledged.threads
        let lastModels = await acknowledged.lastModels

        try await server.start()
        let client = try await server.client()
        try await Acknowledged.expectPresent(threads: threads, lastModels: lastModels, owned: owned, client)
    }

    @Test("thread/list pages with a cursor, sorts, filters by parent and archived")
    func listPaging() async throws {
        let server = try await InProcessServer.launch()
        let client = try await server.client()
        var ids: [String] = []
        for i in 0..<7 { ids.append(try #require(try await client.startThread(Wire.ThreadStartParams(name: "t\(i)")).thread?.id)) }
        var seen: [String] = []
        var cursor: String?
        repeat {
            guard case let .threadList(page) = try await client.result(.threadList(Wire.ThreadListParams(cursor: cursor, limit: 3))) else { throw UnexpectedResult(expected: "threadList") }
            seen += page.data.compactMap(\.id)
            cursor = page.nextCursor
        } while cursor != nil
        #expect(seen == ids.reversed(), "newest first, every thread once")
        guard case let .threadList(ascending) = try await client.result(.threadList(Wire.ThreadListParams(limit: 2, sortDirection: .ascending))) else { throw UnexpectedResult(expected: "threadList") }
        #expect(ascending.data.compactMap(\.id) == Array(ids.prefix(2)))

        try await client.runTurn(ids[0], "hi")
        let child = try #require(try await client.spawn(ids[0]).thread?.id)
        guard case let .threadList(children) = try await client.result(.threadList(Wire.ThreadListParams(parentThreadId: ids[0]))) else { throw UnexpectedResult(expected: "threadList") }
        #expect(children.data.compactMap(\.id) == [child])
        await expectStatus(3, mentioning: "cursor") { _ = try await client.result(.threadList(Wire.ThreadListParams(cursor: "garbage"))) }
        await expectStatus(3, mentioning: "limit") { _ = try await client.result(.threadList(Wire.ThreadListParams(limit: 0))) }
    }

    @Test("archive and unarchive move a thread between lists and notify subscribers")
    func archive() async throws {
        let server = try await InProcessServer.launch()
        let client = try await server.client()
        let inbox = Inbox(client)
        let id = try #require(try await client.startThread().thread?.id)
        _ = try await client.result(.threadArchive(Wire.ThreadArchiveParams(threadId: id)))
        try await inbox.waitFor("thread/archived") { if case let .threadArchived(n) = $0 { return n.threadId == id } else { return false } }
        guard case let .threadList(archived) = try await client.result(.threadList(Wire.ThreadListParams(archived: true))) else { throw UnexpectedResult(expected: "threadList") }
        #expect(archived.data.compactMap(\.id) == [id])
        await expectStatus(9, mentioning: "archived") { _ = try await client.startTurn(id, "hi") }
        guard case let .threadUnarchive(result) = try await client.result(.threadUnarchive(Wire.ThreadUnarchiveParams(threadId: id))) else { throw UnexpectedResult(expected: "threadUnarchive") }
        #expect(result.thread?.archived == false)
        try await inbox.waitFor("thread/unarchived") { if case let .threadUnarchived(n) = $0 { return n.threadId == id } else { return false } }
        await expectStatus(5, mentioning: "not found") { _ = try await client.result(.threadArchive(Wire.ThreadArchiveParams(threadId: "missing"))) }
    }

    @Test("an unsubscribed idle thread is unloaded: thread/closed, status NOT_LOADED, cold resume works")
    func unsubscribeUnloads() async throws {
        let server = try await InProcessServer.launch(arguments: ["--idle-unload-seconds", "0.2"])
        let client = try await server.client()
        let inbox = Inbox(client)
        let id = try #require(try await client.startThread().thread?.id)
        try await client.runTurn(id, "hi")
        guard case let .threadUnsubscribe(result) = try await client.result(.threadUnsubscribe(Wire.ThreadUnsubscribeParams(threadId: id))) else { throw UnexpectedResult(expected: "threadUnsubscribe") }
        #expect(result.wasSubscribed == true)
        try await inbox.waitFor("thread/closed") { if case let .threadClosed(n) = $0 { return n.threadId == id } else { return false } }
        #expect(try await client.read(id, turns: false).thread?.status?.type == .notLoaded)
        let resumed = try await client.resume(id)
        #expect(resumed.thread?.status?.type == .idle)
        #expect(resumed.thread?.turns.count == 1)
    }

    @Test("a turn streams turn/started, item events and turn/completed to subscribers, with increasing sequence numbers")
    func turnNotifications() async throws {
        let server = try await InProcessServer.launch()
        let client = try await server.client()
        let watcher = try await server.client(optOut: ["item/started"])
        let inbox = Inbox(client)
        let watched = Inbox(watcher)
        let id = try #require(try await client.startThread().thread?.id)
        _ = try await watcher.resume(id)
        let turn = try await client.startTurn(id, "hello")
        try await inbox.waitFor("turn/completed") { if case let .turnCompleted(n) = $0 { return n.turn?.id == turn } else { return false } }
        let names = await inbox.payloads().map(\.fieldName)
        #expect(names.first == "thread_started")
        #expect(names.contains("turn_started") && names.contains("item_started") && names.contains("item_completed"))
        #expect(names.firstIndex(of: "turn_started")! < names.firstIndex(of: "turn_completed")!)
        let sequences = await inbox.all.compactMap(\.sequence)
        #expect(sequences == Array(1...UInt64(sequences.count)))
        try await watched.waitFor("turn/completed on the watcher") { if case .turnCompleted = $0 { return true } else { return false } }
        #expect(await watched.payloads().allSatisfy { $0.fieldName != "item_started" }, "opted out")
    }

    @Test("thread ids that do not exist are NOT_FOUND everywhere")
    func notFound() async throws {
        let server = try await InProcessServer.launch()
        let client = try await server.client()
        await expectStatus(5, mentioning: "missing") { _ = try await client.resume("missing") }
        await expectStatus(5, mentioning: "missing") { _ = try await client.fork("missing") }
        await expectStatus(5, mentioning: "missing") { _ = try await client.read("missing") }
        await expectStatus(5, mentioning: "missing") { _ = try await client.startTurn("missing", "hi") }
        await expectStatus(5, mentioning: "missing") { _ = try await client.spawn("missing") }
        await expectStatus(3, mentioning: "input") { _ = try await client.startTurn(try #require(try await client.startThread().thread?.id), "") }
    }
}

actor Acknowledged {
    var threads: [String] = []
    var lastModels: [Int: Int] = [:]
    var count: Int { threads.count + lastModels.count }
    func thread(_ id: String) { threads.append(id) }
    func model(_ writer: Int, _ n: Int) { lastModels[writer] = n }
}

extension Acknowledged {
    /// Each writer owns `owned[w]`: it alternately starts a thread and sets its
    /// own thread's model to a counter, recording every acknowledged change,
    /// until a call fails (the server died).
    nonisolated func writeUntilFailure(_ writers: [ThreadwireClient], owned: [String]) -> Task<Void, Never> {
        Task {
            await withTaskGroup(of: Void.self) { group in
                for (w, writer) in writers.enumerated() {
                    group.addTask {
                        for n in 0..<100_000 {
                            if n % 2 == 0 {
                                guard let thread = try? await writer.startThread(Wire.ThreadStartParams(name: "w\(w)-\(n)")).thread?.id else { return }
                                await self.thread(thread)
                            } else {
                                let update = Wire.ThreadSettingsUpdateParams(threadId: owned[w], model: "m-\(n)")
                                guard (try? await writer.updateSettings(update)) != nil else { return }
                                await self.model(w, n)
                            }
                        }
                    }
                }
            }
        }
    }

    /// Every acknowledged thread exists, and each owned thread's model is at
    /// least the last acknowledged counter.
    static func expectPresent(threads: [String], lastModels: [Int: Int], owned: [String], _ client: ThreadwireClient) async throws {
        for thread in threads {
            #expect(try await client.read(thread, turns: false).thread?.id == thread, "acknowledged thread \(thread) lost")
        }
        for (w, thread) in owned.enumerated() {
            let stored = try #require(try await client.read(thread, turns: false).thread?.model)
            let counter = stored.hasPrefix("m-") ? Int(stored.dropFirst(2)) ?? -1 : -1
            #expect(counter >= lastModels[w] ?? -1, "writer \(w): stored \(stored), last acknowledged m-\(lastModels[w] ?? -1)")
        }
    }
}

extension Sequence {
    func asyncMap<T>(_ transform: (Element) async throws -> T) async rethrows -> [T] {
        var out: [T] = []
        for element in self { out.append(try await transform(element)) }
        return out
    }
}
