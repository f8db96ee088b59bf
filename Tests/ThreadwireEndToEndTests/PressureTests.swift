import Foundation
import Testing
import ThreadwireServerTesting
import ThreadwireClient
import ThreadwireNIO
import ThreadwireWire

/// Clients that do not read: the real server keeps its memory bounded and
/// keeps answering everyone else (issue 9).
@Suite("serving under pressure (real server)", .serialized)
struct PressureTests {
    static let rssCeiling = 256 * 1024 * 1024

    /// Samples the server's RSS while `body` runs; returns the largest seen.
    func peakRSS(of server: ServerProcess, while body: @escaping @Sendable () async throws -> Void) async throws -> Int {
        let work = Task { try await body() }
        var peak = server.residentBytes()
        while true {
            peak = max(peak, server.residentBytes())
            if Task.isCancelled { break }
            // Done? Sample once more after it ends.
            let finished = await withTaskGroup(of: Bool.self) { group in
                group.addTask { _ = try? await work.value; return true }
                group.addTask { try? await Task.sleep(for: .milliseconds(50)); return false }
                let first = await group.next()!
                group.cancelAll()
                return first
            }
            if finished { break }
        }
        try await work.value
        return max(peak, server.residentBytes())
    }

    func runTurnQuietly(_ client: ThreadwireClient, _ thread: String, _ text: String) async throws {
        let id = try await client.startTurn(thread, text)
        let deadline = ContinuousClock.now + .seconds(30)
        while ContinuousClock.now < deadline {
            guard case let .threadTurnsList(page) = try await client.result(.threadTurnsList(
                Wire.ThreadTurnsListParams(threadId: thread, limit: 1))) else { throw TestTimeout(description: "bad result") }
            if let turn = page.data.first, turn.id == id, turn.status != .inProgress { return }
            try await Task.sleep(for: .milliseconds(10))
        }
        throw TestTimeout(description: "turn \(id) did not finish")
    }

    @Test("3,000 pipelined thread/read include_turns never read: RSS stays under 256 MiB and another client keeps getting answers")
    func pipelinedReadsNeverRead() async throws {
        let server = try await ServerProcess.launch()
        let good = try await server.client()
        let thread = try #require(try await good.startThread().thread?.id)
        // About 2 MB per answer: ten turns of 100 KB input, echoed back.
        let text = String(repeating: "x", count: 100_000)
        for _ in 0..<10 { try await runTurnQuietly(good, thread, text) }

        let raw = try RawSocket(port: server.port, receiveBuffer: 4096)
        defer { raw.close() }
        try raw.send(RawSocket.initialize)
        let read = RawSocket.frame(id: 2, .threadRead(Wire.ThreadReadParams(threadId: thread, includeTurns: true)))
        let peak = try await peakRSS(of: server) {
            let sent = await raw.push(repeating: read, seconds: 30, maxBytes: read.count * 3000)
            #expect(sent > 0)
            for _ in 0..<20 {
                // Answered, however long the loaded machine takes: how fast is a benchmark's question.
                guard case let .healthCheck(health) = try await good.result(.healthCheck(.init())) else {
                    throw UnexpectedResult(expected: "health/check")
                }
                #expect(health.status == .serving)
                _ = try await good.read(thread, turns: false, modelRequests: false)
            }
        }
        #expect(peak < Self.rssCeiling, "peak RSS \(peak / 1_048_576) MiB")
        raw.close()
        _ = try await good.result(.healthCheck(.init()))
        #expect(server.residentBytes() < Self.rssCeiling)
    }

    @Test("2,000,000 pipelined health checks never read: RSS stays under 256 MiB and another client keeps getting answers")
    func pipelinedHealthNeverRead() async throws {
        let server = try await ServerProcess.launch()
        let good = try await server.client()
        let raw = try RawSocket(port: server.port, receiveBuffer: 4096)
        defer { raw.close() }
        let health = RawSocket.frame(id: 7, .healthCheck(.init()))
        let batch = Array([[UInt8]](repeating: health, count: 10_000).joined())
        let peak = try await peakRSS(of: server) {
            let sent = await raw.push(repeating: batch, seconds: 60, maxBytes: health.count * 2_000_000, stallSeconds: 3)
            #expect(sent > 0)
            for _ in 0..<20 {
                // Answered, however long the loaded machine takes: how fast is a benchmark's question.
                guard case let .healthCheck(answer) = try await good.result(.healthCheck(.init())) else {
                    throw UnexpectedResult(expected: "health/check")
                }
                #expect(answer.status == .serving)
            }
        }
        #expect(peak < Self.rssCeiling, "peak RSS \(peak / 1_048_576) MiB")
    }

    @Test("a subscriber that never reads notifications is cut off at the backlog limit with RESOURCE_EXHAUSTED; other subscribers get every notification; resuming after the last event it read, it loses nothing")
    func slowSubscriberIsCutOff() async throws {
        let server = try await ServerProcess.launch(arguments: ["--max-notification-backlog-bytes", "1048576", "--admin-listen", "127.0.0.1:0"])
        let driver = try await server.client()
        let thread = try #require(try await driver.startThread().thread?.id)
        let listener = try await server.client()
        let inbox = Inbox(listener)
        _ = try await listener.resume(thread)

        let raw = try RawSocket(port: server.port, receiveBuffer: 4096)
        defer { raw.close() }
        try raw.send(RawSocket.initialize + RawSocket.frame(id: 2, .threadResume(Wire.ThreadResumeParams(threadId: thread, excludeTurns: true))))
        // The raw client's resume must be in before the turns start.
        try await driver.waitForThread(thread) { _ in true }
        try await Task.sleep(for: .milliseconds(200))

        // The raw client starts reading once the server has counted the
        // cut-off: the error frame waits behind the backlog, and a client
        // that still reads nothing is closed 5 s later without it.
        let adminPort = server.adminPort
        let cutOff = Task { () -> (envelopes: [Wire.Envelope], closed: Bool)? in
            let deadline = ContinuousClock.now + .seconds(120)
            while ContinuousClock.now < deadline {
                let metrics = try await httpGet(port: adminPort, path: "/metrics").body
                if metricValue(metrics, "threadwire_slow_subscriber_disconnects_total") ?? 0 >= 1 {
                    return await raw.readUntilClosed(seconds: 10)
                }
                try await Task.sleep(for: .milliseconds(50))
            }
            return nil
        }
        let text = String(repeating: "y", count: 50_000)
        let turns = 120
        let peak = try await peakRSS(of: server) {
            for _ in 0..<turns { try await runTurnQuietly(driver, thread, text) }
        }
        #expect(peak < Self.rssCeiling, "peak RSS \(peak / 1_048_576) MiB")

        // The server counted the cut-off, and the raw client, reading at
        // last, found the error frame, then the close.
        let (frames, closed) = try #require(try await cutOff.value, "the server never counted a slow-subscriber cut-off")
        #expect(closed)
        let last = try #require(frames.last?.response)
        #expect(last.code == 8 && last.id == nil)
        #expect(last.message?.contains("max_notification_backlog_bytes") == true, "\(last.message ?? "")")

        // The reading subscriber saw every turn complete.
        try await inbox.waitFor("all turn/completed", timeout: .seconds(20)) { _ in true }
        let deadline = ContinuousClock.now + .seconds(20)
        var completed = 0
        while ContinuousClock.now < deadline {
            completed = await inbox.payloads().filter { if case .turnCompleted = $0 { return true }; return false }.count
            if completed == turns { break }
            try await Task.sleep(for: .milliseconds(20))
        }
        #expect(completed == turns)

        // Cut off, it loses nothing: resumed after the last event it read,
        // it gets every later one (issue 49).
        let numbers = frames.compactMap { $0.notification?.threadSequence }
        let lastRead = try #require(numbers.last, "the cut-off subscriber read some numbered events first")
        #expect(numbers == Array((numbers.first ?? 0)...lastRead), "what it read before the cut has no gap")
        let head = try #require(try await driver.read(thread, turns: false).thread?.threadSequence)
        #expect(lastRead < head, "the cut came before the end")
        let again = try await server.client()
        let resumed = Inbox(again)
        _ = try await again.result(.threadResume(Wire.ThreadResumeParams(threadId: thread, excludeTurns: true, afterThreadSequence: lastRead)))
        let until = ContinuousClock.now + .seconds(30)
        var rest: [UInt64] = []
        while ContinuousClock.now < until {
            rest = await resumed.all.compactMap(\.threadSequence)
            if rest.last == head { break }
            try await Task.sleep(for: .milliseconds(20))
        }
        #expect(rest == Array((lastRead + 1)...head), "resumed after \(lastRead): \(rest.count) events up to \(rest.last ?? 0) of \(head)")
    }

    @Test("200 subscribers of one busy thread each get every notification once, numbered without gaps, in the same order as every other subscriber")
    func manySubscribersGetEveryNotificationInOrder() async throws {
        let server = try await InProcessServer.launch()
        let driver = try await server.client()
        let thread = try #require(try await driver.startThread().thread?.id)
        var subscribers: [(client: ThreadwireClient, inbox: Inbox)] = []
        for _ in 0..<200 {
            let client = try await server.client()
            let inbox = Inbox(client)
            _ = try await client.resume(thread)
            subscribers.append((client, inbox))
        }
        // Notifications are queued per subscriber and written in batches when
        // the event loops are busy; each subscriber must still see them all.
        let turns = 20
        for turn in 0..<turns {
            try await runTurnQuietly(driver, thread, "turn \(turn): " + String(repeating: "word ", count: 200))
        }
        var reference: [String]?
        for (index, subscriber) in subscribers.enumerated() {
            let deadline = ContinuousClock.now + .seconds(30)
            var received: [Wire.Notification] = []
            while ContinuousClock.now < deadline {
                received = await subscriber.inbox.all
                // The last turn's last notification is the thread going idle.
                let completed = received.filter { if case .turnCompleted = $0.payload { return true }; return false }.count
                if completed == turns, case .threadStatusChanged? = received.last?.payload { break }
                try await Task.sleep(for: .milliseconds(10))
            }
            let sequences = received.compactMap(\.sequence)
            #expect(sequences.count == received.count && !sequences.isEmpty)
            #expect(sequences == Array(sequences.first!..<sequences.first! + UInt64(sequences.count)),
                    "subscriber \(index): sequence numbers with gaps or out of order")
            // Short and comparable: the method and a digest of the whole payload.
            let payloads = received.map { notification in
                notification.payload.map { "\($0.methodName) #\(String(describing: $0).hashValue)" } ?? "nil"
            }
            #expect(payloads.filter { $0.hasPrefix("turn/completed ") }.count == turns, "subscriber \(index)")
            if let reference {
                #expect(payloads == reference, "subscriber \(index) saw other notifications or another order")
            } else {
                reference = payloads
                #expect(payloads.count > turns * 3, "\(payloads.count) notifications for \(turns) turns")
            }
        }
        for subscriber in subscribers { await subscriber.client.close() }
    }

    @Test("a thread with about 30 MB of turns is read page by page; no frame exceeds the advertised limit, loaded or not")
    func largeThreadPages() async throws {
        let server = try await ServerProcess.launch()
        var client = try await server.client()
        let limit = Int(try #require(try await ThreadwireClient.connect(host: "127.0.0.1", port: server.port)
            .initialize(name: "limits").limits?.maxFrameBytes))
        let thread = try #require(try await client.startThread().thread?.id)
        // 1 MB of input echoed back: about 2 MB per turn, 15 turns.
        var ids: [String] = []
        for index in 0..<15 {
            let text = String(repeating: Character(UnicodeScalar(UInt8(97 + index))), count: 1_000_000)
            try await runTurnQuietly(client, thread, text)
            ids.append(try #require(try await lastTurnID(client, thread)))
        }

        for pass in ["loaded", "from the store"] {
            if pass == "from the store" {
                try await server.restart()
                client = try await server.client()
            }
            // The client's decoder refuses any frame over `limit`, so every
            // answer below arrived within it.
            guard case let .threadRead(read) = try await client.result(.threadRead(Wire.ThreadReadParams(threadId: thread, includeTurns: true))) else {
                Issue.record("bad result"); return
            }
            let newest = read.thread?.turns.compactMap(\.id) ?? []
            #expect(!newest.isEmpty && newest.count < ids.count, "\(pass): thread/read holds the newest turns that fit")
            #expect(newest == Array(ids.suffix(newest.count)))
            var cursor = try #require(read.turnsNextCursor)
            var older: [String] = []
            var pages = 0
            while true {
                guard case let .threadTurnsList(page) = try await client.result(.threadTurnsList(Wire.ThreadTurnsListParams(
                    threadId: thread, cursor: cursor, limit: 100))) else { Issue.record("bad result"); return }
                older += page.data.compactMap(\.id)
                pages += 1
                guard let next = page.nextCursor else { break }
                cursor = next
            }
            #expect(pages > 1, "\(pass): 30 MB cannot come in one \(limit)-byte page")
            #expect(Array(older.reversed()) + newest == ids, "\(pass): every turn exactly once, in order")

            // Ascending from the start gives the same turns.
            var ascending: [String] = []
            var next: String?
            repeat {
                guard case let .threadTurnsList(page) = try await client.result(.threadTurnsList(Wire.ThreadTurnsListParams(
                    threadId: thread, cursor: next, limit: 3, sortDirection: .ascending))) else { Issue.record("bad result"); return }
                ascending += page.data.compactMap(\.id)
                next = page.nextCursor
            } while next != nil
            #expect(ascending == ids)
        }
        await expectStatus(3, mentioning: "cursor") {
            _ = try await client.result(.threadTurnsList(Wire.ThreadTurnsListParams(threadId: thread, cursor: "bogus")))
        }
        await expectStatus(3, mentioning: "limit") {
            _ = try await client.result(.threadTurnsList(Wire.ThreadTurnsListParams(threadId: thread, limit: 0)))
        }
        await expectStatus(5, mentioning: "not found") {
            _ = try await client.result(.threadTurnsList(Wire.ThreadTurnsListParams(threadId: "thr_missing")))
        }
    }

    @Test("one turn too large for any frame is RESOURCE_EXHAUSTED naming the limit, never a bigger frame")
    func turnTooLargeForAnyFrame() async throws {
        let server = try await ServerProcess.launch(arguments: ["--max-frame-bytes", "65536"])
        let client = try await ThreadwireClient.connect(host: "127.0.0.1", port: server.port, maxFrameBytes: 65536)
        try await client.initialize(name: "tests")
        let thread = try #require(try await client.startThread().thread?.id)
        // 40 KB in, echoed: the stored turn is over 64 KiB.
        let id = try await client.startTurn(thread, String(repeating: "z", count: 40_000))
        let deadline = ContinuousClock.now + .seconds(10)
        while ContinuousClock.now < deadline {
            let view = try await client.read(thread, turns: false, modelRequests: false)
            if view.thread?.status?.type == .idle { break }
            try await Task.sleep(for: .milliseconds(10))
        }
        await expectStatus(8, mentioning: "max_frame_bytes (65536)") {
            _ = try await client.result(.threadTurnsList(Wire.ThreadTurnsListParams(threadId: thread)))
        }
        // thread/read leaves it out and points at it.
        guard case let .threadRead(read) = try await client.result(.threadRead(Wire.ThreadReadParams(threadId: thread, includeTurns: true))) else {
            Issue.record("bad result"); return
        }
        #expect(read.thread?.turns.isEmpty == true)
        #expect(read.turnsNextCursor != nil)
        #expect(client.isActive)
        _ = id
    }

    @Test("a thread/list page of large threads is cut to fit the frame and continues by cursor")
    func threadListFitsTheFrame() async throws {
        let server = try await ServerProcess.launch(arguments: ["--max-frame-bytes", "65536", "--max-partial-frame-bytes", "1048576"])
        let client = try await ThreadwireClient.connect(host: "127.0.0.1", port: server.port, maxFrameBytes: 65536)
        try await client.initialize(name: "tests")
        var created: Set<String> = []
        for index in 0..<40 {
            // Large by their working directory (4,096 bytes at most, docs/protocol.md, Limits).
            let cwd = "/" + String(repeating: "n", count: 3000) + "\(index)"
            created.insert(try #require(try await client.startThread(Wire.ThreadStartParams(cwd: cwd)).thread?.id))
        }
        var listed: [String] = []
        var cursor: String?
        var pages = 0
        repeat {
            guard case let .threadList(page) = try await client.result(.threadList(Wire.ThreadListParams(cursor: cursor, limit: 1000))) else {
                Issue.record("bad result"); return
            }
            listed += page.data.compactMap(\.id)
            cursor = page.nextCursor
            pages += 1
        } while cursor != nil
        #expect(pages > 1)
        #expect(listed.count == 40 && Set(listed) == created)
    }

    @Test("pipelined requests mixing inline answers (health/check, thread/read) with stored changes are answered in request order")
    func inlineAnswersKeepOrder() async throws {
        let server = try await ServerProcess.launch()
        let setup = try await server.client()
        let thread = try #require(try await setup.startThread().thread?.id)
        let raw = try RawSocket(port: server.port)
        defer { raw.close() }
        var stream = RawSocket.initialize
        var expected: [UInt64] = [1]
        for index in 0..<300 {
            let id = UInt64(index + 2)
            let params: Wire.Request.Params
            switch index % 3 {
            case 0: params = .threadSettingsUpdate(Wire.ThreadSettingsUpdateParams(threadId: thread, cwd: "/w/\(index)"))
            case 1: params = .healthCheck(.init())
            default: params = .threadRead(Wire.ThreadReadParams(threadId: thread))
            }
            stream += RawSocket.frame(id: id, params)
            expected.append(id)
        }
        try raw.send(stream)
        let responses = await raw.readFrames(301, seconds: 20).compactMap(\.response)
        #expect(responses.map { $0.id ?? 0 } == expected)
        #expect(responses.allSatisfy { $0.code == 0 })
    }

    func lastTurnID(_ client: ThreadwireClient, _ thread: String) async throws -> String? {
        guard case let .threadTurnsList(page) = try await client.result(.threadTurnsList(
            Wire.ThreadTurnsListParams(threadId: thread, limit: 1))) else { return nil }
        return page.data.first?.id
    }
}

/// The value of an unlabelled Prometheus sample, or the sum over its labels.
func metricValue(_ text: String, _ name: String, labels: String? = nil) -> Double? {
    var total: Double?
    for line in text.split(separator: "\n") where !line.hasPrefix("#") {
        let parts = line.split(separator: " ")
        guard parts.count >= 2 else { continue }
        let series = parts[0]
        guard series == name || series.hasPrefix(name + "{") else { continue }
        if let labels, !series.contains(labels) { continue }
        total = (total ?? 0) + (Double(parts[1]) ?? 0)
    }
    return total
}
