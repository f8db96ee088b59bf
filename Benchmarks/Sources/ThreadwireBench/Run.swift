import ArgumentParser
import Foundation
import GRPCCore
import GRPCNIOTransportHTTP2
import Histogram
import SwiftProtobuf
import ThreadwireCore
import ThreadwireSQLite
import ThreadwireWire

#if canImport(Glibc)
import Glibc
#endif

/// Runs every comparison and prints Markdown tables (medians of `--repeats` runs).
struct Run: AsyncParsableCommand {
    @Option(help: "The release threadwire-server binary.") var serverBin = "../.build/release/threadwire-server"
    @Option(help: "Seconds per load measurement.") var seconds = 3.0
    @Option(help: "Runs per figure; the median is reported.") var repeats = 3
    @Option(help: "Sections to run: codec, transport, grpc, listeners, record, writes, scale (default: all).") var only: [String] = []
    @Option(help: "Turns of the scale section's long thread.") var longTurns = 100_000
    @Option(help: "Subscribed connections in the scale section.") var subscribers = 10_000

    func wants(_ section: String) -> Bool { only.isEmpty || only.contains(section) }

    func run() async throws {
        raiseFileLimit()
        let bench = CommandLine.arguments[0]
        print("# threadwire benchmarks (\(Date()))\n")
        print("machine: \(ProcessInfo.processInfo.activeProcessorCount) cores, \(ProcessInfo.processInfo.physicalMemory >> 30) GiB; seconds per load \(seconds); medians of \(repeats) runs\n")
        if wants("codec") { try codec() }
        if wants("transport") || wants("grpc") { try await transport(bench: bench) }
        if wants("listeners") { try await listeners() }
        if wants("record") { try await recording() }
        if wants("writes") { try await writes() }
        if wants("scale") { try await scale() }
    }

    func median(_ values: [Double]) -> Double { values.sorted()[values.count / 2] }

    func medianLoad(_ body: () async throws -> LoadResult) async throws -> LoadResult {
        var results: [LoadResult] = []
        for _ in 0..<repeats { results.append(try await body()) }
        return results.sorted { $0.throughput < $1.throughput }[results.count / 2]
    }

    // MARK: codec

    func timeNs(_ body: () throws -> Void) rethrows -> Double {
        var iterations = 100
        while true {
            let start = ContinuousClock.now
            for _ in 0..<iterations { try body() }
            let elapsed = (ContinuousClock.now - start).secondsValue
            if elapsed > 0.3 { return elapsed * 1e9 / Double(iterations) }
            iterations *= 4
        }
    }

    func codec() throws {
        print("## Codec: threadwire (Swift over protobuf-c) vs swift-protobuf, same .proto\n")
        print("| message | bytes | tw encode ns | swift-protobuf encode ns | ratio | tw decode ns | swift-protobuf decode ns | ratio |")
        print("|---|---|---|---|---|---|---|---|")
        let threadStart = Wire.Envelope(kind: .request(Wire.Request(id: 42, params: .threadStart(Wire.ThreadStartParams(
            model: "gpt-x", cwd: "/work/repo", config: [Wire.KeyValue(key: "features.multi_agent_v2", value: "true")],
            multiAgentMode: .proactive, name: "refactor the parser")))))
        let turnStart = Wire.Envelope(kind: .request(Wire.Request(id: 43, params: .turnStart(Wire.TurnStartParams(
            threadId: "01a2009d-034d-7cb8-915e-5dcfcfc5f2ae",
            input: [Wire.UserInput(content: .text(String(repeating: "0123456789abcdef", count: 64)))], model: "gpt-x")))))
        let items = (0..<50).map { i in
            Wire.ThreadItem(id: "item-\(i)", type: i % 2 == 0 ? .userMessage : .agentMessage,
                            text: "message number \(i) with some representative text in it")
        }
        let turns = (0..<5).map { t in
            Wire.Turn(id: "turn-\(t)", status: .completed, startedAt: 1_795_306_619_725, completedAt: 1_795_306_619_860,
                      items: Array(items[(t * 10)..<(t * 10 + 10)]),
                      context: Wire.TurnContext(model: "gpt-x", multiAgentRuntime: .v2, effectiveMultiAgentMode: .proactive, cwd: "/work"))
        }
        let threadRead = Wire.Envelope(kind: .response(Wire.Response(id: 44, code: 0, result: .threadRead(Wire.ThreadReadResult(
            thread: Wire.Thread(id: "01a2009d-034d-7cb8-915e-5dcfcfc5f2ae", sessionId: "01a2009d-034d-7cb8-915e-5dcfcfc5f2ae",
                                preview: "refactor", createdAt: 1, updatedAt: 2, status: Wire.ThreadStatus(type: .idle),
                                multiAgentRuntime: .v2, multiAgentMode: .proactive, model: "gpt-x", cwd: "/work", turns: turns))))))
        for (name, message) in [("thread/start request", threadStart), ("turn/start, 1 KiB input", turnStart),
                                ("thread/read result, 50 items", threadRead)] {
            let bytes = message.serializedBytes()
            let peer = try Threadwire_V1_Envelope(serializedBytes: bytes)
            let peerBytes: [UInt8] = try peer.serializedBytes()
            // Both implementations must agree on the bytes, or the comparison is not like for like.
            guard peerBytes == bytes else { throw BenchError("swift-protobuf re-encodes \(name) differently") }
            var encodeTW: [Double] = [], encodeSP: [Double] = [], decodeTW: [Double] = [], decodeSP: [Double] = []
            for _ in 0..<repeats {
                encodeTW.append(timeNs { _ = message.serializedBytes() })
                encodeSP.append(try timeNs { let _: [UInt8] = try peer.serializedBytes() })
                decodeTW.append(try timeNs { _ = try Wire.Envelope(serializedBytes: bytes) })
                decodeSP.append(try timeNs { _ = try Threadwire_V1_Envelope(serializedBytes: bytes) })
            }
            let (et, es, dt, ds) = (median(encodeTW), median(encodeSP), median(decodeTW), median(decodeSP))
            print(String(format: "| %@ | %d | %.0f | %.0f | %.2f× | %.0f | %.0f | %.2f× |",
                         name, bytes.count, et, es, es / et, dt, ds, ds / dt))
        }
        print("\nratio = swift-protobuf time / threadwire time (above 1: threadwire faster).\n")
    }

    // MARK: transport and gRPC

    func transport(bench: String) async throws {
        let dir = NSTemporaryDirectory() + "threadwire-bench-" + UUID().uuidString
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let echo = try Spawned(bench, ["echo-server"])
        let threadwire = try Spawned(serverBin, ["--listen", "127.0.0.1:0", "--data-dir", dir + "/tw", "--log-level", "error"])
        let grpc = wants("grpc") ? try Spawned(bench, ["grpc-server", "--data-dir", dir + "/grpc"]) : nil
        defer { echo.stop(); threadwire.stop(); grpc?.stop() }

        print("## Transport: threadwire vs the bare NIO echo ceiling\(grpc == nil ? "" : " and grpc-swift-2")\n")
        print("Same raw-frame load generator, closed loop (one request in flight per connection); grpc-swift-2 uses its own client (one HTTP/2 connection per client), unary calls with the same Wire messages.\n")
        print("| workload | connections | echo req/s | threadwire req/s | % of echo | grpc-swift-2 req/s | threadwire / grpc | tw p50 µs | tw p99 µs |")
        print("|---|---|---|---|---|---|---|---|---|")
        var halfRates: [(String, Int, Double)] = []
        for workload in ["health/check", "thread/read"] {
            for count in [1, 16, 64] {
                let echoConnections = try await (0..<count).asyncMap { _ in try await FrameConnection.connect(port: echo.port) }
                let twConnections = try await (0..<count).asyncMap { _ in try await Frames.initialized(port: threadwire.port) }
                let threadIDs = try await twConnections.asyncMap { try await Frames.startThread($0) }
                let payloads = twConnections.indices.map { index -> [UInt8] in
                    workload == "health/check"
                        ? Frames.request(7, .healthCheck(.init()))
                        : Frames.request(7, .threadRead(Wire.ThreadReadParams(threadId: threadIDs[index])))
                }
                // The generator matches answers by their id's first bytes only; check once that it reads them right.
                let sample = try await twConnections[0].roundTrip(payloads[0], until: { Frames.response($0)?.id == 7 })
                guard let full = Frames.response(sample), full.code == 0, Frames.responseID(sample) == full.id else {
                    throw BenchError("unexpected \(workload) answer, or its id misread")
                }
                let echoResult = try await medianLoad {
                    try await FrameLoad.run(connections: echoConnections, seconds: seconds) { i, _ in .init(payload: payloads[i]) }
                }
                let twResult = try await medianLoad {
                    try await FrameLoad.run(connections: twConnections, seconds: seconds) { i, _ in
                        .init(payload: payloads[i], until: { Frames.responseID($0) == 7 })
                    }
                }
                var grpcText = "-", ratioText = "-"
                if let grpc {
                    let grpcResult = try await medianLoad { try await grpcLoad(port: grpc.port, connections: count, workload: workload) }
                    grpcText = String(format: "%.0f", grpcResult.throughput)
                    ratioText = String(format: "%.2f×", twResult.throughput / grpcResult.throughput)
                }
                print(String(format: "| %@ | %d | %.0f | %.0f | %.0f%% | %@ | %@ | %d | %d |", workload, count,
                             echoResult.throughput, twResult.throughput, 100 * twResult.throughput / echoResult.throughput,
                             grpcText, ratioText, twResult.p50, twResult.p99))
                halfRates.append((workload, count, twResult.throughput / 2))
                for c in echoConnections + twConnections { await c.close() }
            }
        }
        print("\n### Latency at half of the maximum throughput (paced, coordinated-omission corrected)\n")
        print("| workload | connections | rate req/s | p50 µs | p90 µs | p99 µs | p99.9 µs | max µs |")
        print("|---|---|---|---|---|---|---|---|")
        for (workload, count, rate) in halfRates where count != 1 {
            let connections = try await (0..<count).asyncMap { _ in try await Frames.initialized(port: threadwire.port) }
            let threadIDs = try await connections.asyncMap { try await Frames.startThread($0) }
            let result = try await medianLoad {
                try await FrameLoad.run(connections: connections, seconds: seconds, totalRate: rate) { i, _ in
                    let payload = workload == "health/check" ? Frames.request(7, .healthCheck(.init()))
                        : Frames.request(7, .threadRead(Wire.ThreadReadParams(threadId: threadIDs[i])))
                    return .init(payload: payload, until: { Frames.responseID($0) == 7 })
                }
            }
            print(String(format: "| %@ | %d | %.0f | %d | %d | %d | %d | %d |", workload, count, rate,
                         result.p50, result.p90, result.p99, result.p999, result.max))
            for c in connections { await c.close() }
        }
        print("")
    }

    /// Whose gRPC methods a load calls: the grpc-swift-2 peer's or threadwire's own service.
    enum GRPCMethods {
        case peer, threadwire
        var health: MethodDescriptor { self == .peer ? PeerMethods.health : .init(fullyQualifiedService: WireSchema.serviceName, method: "HealthCheck") }
        var read: MethodDescriptor { self == .peer ? PeerMethods.read : .init(fullyQualifiedService: WireSchema.serviceName, method: "ThreadRead") }
        var start: MethodDescriptor { self == .peer ? PeerMethods.start : .init(fullyQualifiedService: WireSchema.serviceName, method: "ThreadStart") }
    }

    func grpcLoad(port: Int, connections count: Int, workload: String, methods: GRPCMethods = .peer) async throws -> LoadResult {
        let clients = try (0..<count).map { _ in
            GRPCClient(transport: try HTTP2ClientTransport.Posix(target: .ipv4(address: "127.0.0.1", port: port), transportSecurity: .plaintext))
        }
        return try await withThrowingTaskGroup(of: Void.self) { runners in
            for client in clients { runners.addTask { try await client.runConnections() } }
            defer { for client in clients { client.beginGracefulShutdown() } }
            var threadIDs: [String] = []
            for client in clients {
                let started = try await client.unary(
                    request: ClientRequest(message: Wire.ThreadStartParams()), descriptor: methods.start,
                    serializer: WireSerializer<Wire.ThreadStartParams>(), deserializer: WireDeserializer<Wire.ThreadLifecycleResult>(),
                    options: .defaults) { try $0.message }
                threadIDs.append(started.thread?.id ?? "")
            }
            let ids = threadIDs
            return try await ClosedLoop.run(connections: count, seconds: seconds) { index, _ in
                let client = clients[index]
                if workload == "health/check" {
                    _ = try await client.unary(
                        request: ClientRequest(message: Wire.HealthCheckParams()), descriptor: methods.health,
                        serializer: WireSerializer<Wire.HealthCheckParams>(), deserializer: WireDeserializer<Wire.HealthCheckResult>(),
                        options: .defaults) { try $0.message }
                } else {
                    _ = try await client.unary(
                        request: ClientRequest(message: Wire.ThreadReadParams(threadId: ids[index])), descriptor: methods.read,
                        serializer: WireSerializer<Wire.ThreadReadParams>(), deserializer: WireDeserializer<Wire.ThreadReadResult>(),
                        options: .defaults) { try $0.message }
                }
            }
        }
    }

    // MARK: capture overhead

    /// The same load with and without --record; runs alternate so drift hits both.
    func recording() async throws {
        let dir = NSTemporaryDirectory() + "threadwire-bench-" + UUID().uuidString
        defer { try? FileManager.default.removeItem(atPath: dir) }
        print("## Capture overhead (--record), 16 connections\n")
        print("| workload | without req/s | with --record req/s | change |")
        print("|---|---|---|---|")
        for workload in ["health/check", "thread/read"] {
            var plain: [Double] = [], recorded: [Double] = []
            for run in 0..<(2 * repeats) {
                let record = run % 2 == 1
                var arguments = ["--listen", "127.0.0.1:0", "--data-dir", dir + "/r\(run)", "--log-level", "error"]
                if record { arguments += ["--record", dir + "/capture-\(run)"] }
                let server = try Spawned(serverBin, arguments)
                let connections = try await (0..<16).asyncMap { _ in try await Frames.initialized(port: server.port) }
                let threadIDs = try await connections.asyncMap { try await Frames.startThread($0) }
                let result = try await FrameLoad.run(connections: connections, seconds: seconds) { i, _ in
                    let payload = workload == "health/check" ? Frames.request(7, .healthCheck(.init()))
                        : Frames.request(7, .threadRead(Wire.ThreadReadParams(threadId: threadIDs[i])))
                    return .init(payload: payload, until: { Frames.responseID($0) == 7 })
                }
                if record { recorded.append(result.throughput) } else { plain.append(result.throughput) }
                for c in connections { await c.close() }
                server.stop()
            }
            let (a, b) = (median(plain), median(recorded))
            print(String(format: "| %@ | %.0f | %.0f | %+.1f%% |", workload, a, b, 100 * (b - a) / a))
        }
        print("")
    }

    // MARK: durable writes

    func writes() async throws {
        let dir = NSTemporaryDirectory() + "threadwire-bench-" + UUID().uuidString
        defer { try? FileManager.default.removeItem(atPath: dir) }
        print("## Durable writes (SQLite WAL, synchronous=FULL; acknowledged = committed)\n")
        print("| what | connections | ops/s | p50 µs | p99 µs |")
        print("|---|---|---|---|---|")
        let count = 16
        // The store's own ceiling: the same thread record written by 16 concurrent tasks, no protocol.
        let store = try SQLiteThreadStore(directory: dir + "/raw")
        var records: [ThreadRecord] = []
        for i in 0..<count {
            let record = ThreadRecord(id: "raw-\(i)", sessionID: "raw-\(i)", source: .appServer, createdAt: 1, model: "m", cwd: "/")
            records.append(record)
            try await store.commit([.putThread(record)])
        }
        var rawRates: [Double] = []
        for _ in 0..<repeats {
            let end = ContinuousClock.now + .milliseconds(Int(seconds * 1000))
            let start = ContinuousClock.now
            let snapshot = records
            let (total, latest) = try await withThrowingTaskGroup(of: (Int, Int, ThreadRecord).self) { group in
                for i in 0..<count {
                    let base = snapshot[i]
                    group.addTask {
                        var n = 0
                        var record = base
                        while ContinuousClock.now < end {
                            record.model = "m\(n)"
                            // Versioned commits (compare-and-set): each writes the next version.
                            record.version += 1
                            try await store.commit([.putThread(record)])
                            n += 1
                        }
                        return (i, n, record)
                    }
                }
                var sum = 0
                var latest = snapshot
                for try await (i, n, record) in group {
                    sum += n
                    latest[i] = record
                }
                return (sum, latest)
            }
            records = latest
            rawRates.append(Double(total) / (ContinuousClock.now - start).secondsValue)
        }
        let raw = median(rawRates)
        print(String(format: "| store ceiling: thread record commits | %d tasks | %.0f | - | - |", count, raw))

        let server = try Spawned(serverBin, ["--listen", "127.0.0.1:0", "--data-dir", dir + "/tw", "--log-level", "error"])
        defer { server.stop() }
        let connections = try await (0..<count).asyncMap { _ in try await Frames.initialized(port: server.port) }
        let threadIDs = try await connections.asyncMap { try await Frames.startThread($0) }
        let settings = try await medianLoad {
            try await FrameLoad.run(connections: connections, seconds: seconds) { i, n in
                .init(payload: Frames.request(UInt64(n + 10), .threadSettingsUpdate(Wire.ThreadSettingsUpdateParams(threadId: threadIDs[i], model: "m\(n)"))),
                      until: { Frames.responseID($0) == UInt64(n + 10) })
            }
        }
        print(String(format: "| thread/settings/update (acknowledged) | %d | %.0f | %d | %d |", count, settings.throughput, settings.p50, settings.p99))
        let turns = try await medianLoad {
            try await FrameLoad.run(connections: connections, seconds: seconds) { i, n in
                let thread = threadIDs[i]
                return .init(payload: Frames.request(UInt64(n + 1_000_000), .turnStart(Wire.TurnStartParams(threadId: thread, input: [Wire.UserInput(content: .text("step \(n)"))]))),
                             until: { frame in
                                 if case let .notification(note)? = try? Wire.Envelope(serializedBytes: frame).kind,
                                    case let .turnCompleted(done)? = note.payload { return done.threadId == thread }
                                 return false
                             })
            }
        }
        print(String(format: "| turn/start to turn/completed (several commits each) | %d | %.0f | %d | %d |", count, turns.throughput, turns.p50, turns.p99))
        print(String(format: "\nsettings updates reach %.0f%% of the store's raw commit rate.\n", 100 * settings.throughput / raw))
        for c in connections { await c.close() }
    }

    // MARK: scale

    func scale() async throws {
        let dir = NSTemporaryDirectory() + "threadwire-bench-" + UUID().uuidString
        defer { try? FileManager.default.removeItem(atPath: dir) }
        print("## Scale\n")
        print("| stored threads | thread/list first page p50 µs | deep page p50 µs | cold thread/resume p50 µs | cold resume p99 µs |")
        print("|---|---|---|---|---|")
        var populated = 0
        var ids: [String] = []
        for target in [1_000, 10_000, 100_000] {
            let store = try SQLiteThreadStore(directory: dir)
            while populated < target {
                let batch = (populated..<min(target, populated + 2_000)).map { i -> StoreOperation in
                    let id = String(format: "t-%08d", i)
                    ids.append(id)
                    return .putThread(ThreadRecord(id: id, sessionID: id, source: .appServer, createdAt: Millis(i), model: "m", cwd: "/"))
                }
                try await store.commit(batch)
                populated = min(target, populated + 2_000)
            }
            let server = try Spawned(serverBin, ["--listen", "127.0.0.1:0", "--data-dir", dir, "--log-level", "error"])
            let client = try await Frames.initialized(port: server.port)
            var first = Histogram<UInt64>(highestTrackableValue: 60_000_000, numberOfSignificantValueDigits: .three)
            var deep = first, resume = first
            let middle = ids[ids.count / 2]
            let cursor = "\(Int(middle.dropFirst(2))!)|\(middle)"
            for n in 0..<200 {
                var start = ContinuousClock.now
                _ = try await client.roundTrip(Frames.request(UInt64(10 + n), .threadList(Wire.ThreadListParams(limit: 50)))) { Frames.response($0) != nil }
                _ = first.record(UInt64((ContinuousClock.now - start).micros))
                start = ContinuousClock.now
                _ = try await client.roundTrip(Frames.request(UInt64(10 + n), .threadList(Wire.ThreadListParams(cursor: cursor, limit: 50)))) { Frames.response($0) != nil }
                _ = deep.record(UInt64((ContinuousClock.now - start).micros))
                let victim = ids[Int.random(in: 0..<ids.count)]
                start = ContinuousClock.now
                _ = try await client.roundTrip(Frames.request(UInt64(10 + n), .threadResume(Wire.ThreadResumeParams(threadId: victim, excludeTurns: true)))) { Frames.response($0) != nil }
                _ = resume.record(UInt64((ContinuousClock.now - start).micros))
            }
            print("| \(target) | \(first.valueAtPercentile(50)) | \(deep.valueAtPercentile(50)) | \(resume.valueAtPercentile(50)) | \(resume.valueAtPercentile(99)) |")
            await client.close()
            server.stop()
        }

        let server = try Spawned(serverBin, ["--listen", "127.0.0.1:0", "--data-dir", dir + "/idle", "--log-level", "error",
                                             "--handshake-timeout-ms", "600000", "--max-connections", "6000"])
        defer { server.stop() }
        let before = server.residentKiB()
        var idle: [FrameConnection] = []
        for _ in 0..<5_000 { idle.append(try await Frames.initialized(port: server.port)) }
        try await Task.sleep(for: .milliseconds(500))
        let after = server.residentKiB()
        print(String(format: "\n5,000 idle initialized connections: server RSS %d KiB -> %d KiB, %.1f KiB per connection.\n",
                     before, after, Double(after - before) / 5_000))
        for c in idle { await c.close() }
        server.stop()

        try await longThread(directory: dir + "/long", turns: longTurns)
        try await subscribedConnections(directory: dir + "/subscribed", count: subscribers)
    }

    /// Waits for `turn/completed` of the turn a turn/start or
    /// thread/compact/start (request `id`) began; milliseconds from sending.
    private func turnMillis(_ connection: FrameConnection, id: UInt64, _ params: Wire.Request.Params, thread: String) async throws -> Double {
        let start = ContinuousClock.now
        _ = try await connection.roundTrip(Frames.request(id, params)) { frame in
            if case let .notification(note)? = try? Wire.Envelope(serializedBytes: frame).kind,
               case let .turnCompleted(done)? = note.payload { return done.threadId == thread }
            if let response = Frames.response(frame), response.id == id, (response.code ?? 0) != 0 { return true }
            return false
        }
        return (ContinuousClock.now - start).millis
    }

    /// One thread of `turns` turns (issue 46): two real turns made through
    /// the server, then the last one's records (turn, items, history) copied
    /// into the store under new ids until the thread has `turns`; then the
    /// server opens it cold: resume, reads, pages, new turns, compaction, RSS.
    func longThread(directory: String, turns: Int) async throws {
        print("\n## One thread of \(turns) turns\n")
        var server = try Spawned(serverBin, ["--listen", "127.0.0.1:0", "--data-dir", directory, "--log-level", "error"])
        var client = try await Frames.initialized(port: server.port)
        let thread = try await Frames.startThread(client)
        for n in 0..<2 {
            _ = try await turnMillis(client, id: UInt64(10 + n), .turnStart(Wire.TurnStartParams(threadId: thread, input: [Wire.UserInput(content: .text("look at file_\(n).swift"))])), thread: thread)
        }
        await client.close()
        server.stop()

        let filling = ContinuousClock.now
        let store = try SQLiteThreadStore(directory: directory)
        guard let seed = try await store.loadThread(thread), let template = seed.turns.array.last, let historyStart = template.historyStart else {
            throw BenchError("the seed thread has no turn to copy")
        }
        let templateHistory = Array(seed.history.array[historyStart...])
        var history = seed.history.count
        var record = seed.record
        var made = seed.turns.count
        while made < turns {
            var operations: [StoreOperation] = []
            for sequence in made..<min(turns, made + 1_000) {
                var turn = template
                turn.id = newID()
                turn.sequence = sequence
                turn.historyStart = history
                turn.items = template.items.map { item in var item = item; item.id = newID(); return item }
                operations.append(.appendHistory(thread, firstSequence: history, items: templateHistory))
                operations.append(.putTurn(turn))
                history += templateHistory.count
            }
            made = min(turns, made + 1_000)
            record.version += 1
            operations.insert(.putThread(record), at: 0)
            try await store.commit(operations)
        }
        let fileBytes = (try? FileManager.default.subpathsOfDirectory(atPath: directory).reduce(0) { total, name in
            total + ((try? FileManager.default.attributesOfItem(atPath: directory + "/" + name)[.size] as? Int) ?? 0)
        }) ?? 0
        print(String(format: "%d turns (%d history items) in the store in %.1f s; store files %.0f MiB.\n",
                     turns, history, (ContinuousClock.now - filling).millis / 1000, Double(fileBytes) / 1_048_576))

        server = try Spawned(serverBin, ["--listen", "127.0.0.1:0", "--data-dir", directory, "--log-level", "error"])
        defer { server.stop() }
        client = try await Frames.initialized(port: server.port)
        let idle = server.residentKiB()
        var histogram = Histogram<UInt64>(highestTrackableValue: 600_000_000, numberOfSignificantValueDigits: .three)
        func timed(_ rounds: Int, _ request: (Int) -> [UInt8]) async throws -> (p50: Double, p99: Double) {
            histogram.reset()
            for n in 0..<rounds {
                let start = ContinuousClock.now
                _ = try await client.roundTrip(request(n)) { Frames.response($0) != nil }
                _ = histogram.record(UInt64((ContinuousClock.now - start).micros))
            }
            return (Double(histogram.valueAtPercentile(50)) / 1000, Double(histogram.valueAtPercentile(99)) / 1000)
        }
        func read(_ n: Int) -> [UInt8] {
            var params = Wire.ThreadReadParams()
            params.threadId = thread
            params.includeTurns = true
            params.turnsLimit = 10
            return Frames.request(UInt64(100 + n), .threadRead(params))
        }
        let coldRead = try await timed(1, read)
        print("| operation on the thread of \(turns) turns | p50 ms | p99 ms | samples |")
        print("|---|---|---|---|")
        print(String(format: "| thread/read, newest 10 turns, not loaded (from the store) | %.2f | | 1 |", coldRead.p50))
        let coldResume = try await timed(1) { n in Frames.request(UInt64(200 + n), .threadResume(Wire.ThreadResumeParams(threadId: thread, excludeTurns: true))) }
        let loaded = server.residentKiB()
        print(String(format: "| thread/resume, cold (loads every turn and item) | %.1f | | 1 |", coldResume.p50))
        let warmRead = try await timed(200, read)
        print(String(format: "| thread/read, newest 10 turns, loaded | %.2f | %.2f | 200 |", warmRead.p50, warmRead.p99))
        var cursor: String? = nil
        var pages = 0
        histogram.reset()
        while pages < 1_000 {
            var params = Wire.ThreadTurnsListParams(threadId: thread, cursor: cursor, limit: 100, sortDirection: .descending)
            params.cursor = cursor
            let start = ContinuousClock.now
            let reply = try await client.roundTrip(Frames.request(UInt64(1_000 + pages), .threadTurnsList(params))) { Frames.response($0) != nil }
            _ = histogram.record(UInt64((ContinuousClock.now - start).micros))
            pages += 1
            guard case let .threadTurnsList(page)? = Frames.response(reply)?.result, let next = page.nextCursor else { break }
            cursor = next
        }
        print(String(format: "| thread/turns/list, 100 a page, newest to oldest | %.2f | %.2f | %d pages |",
                     Double(histogram.valueAtPercentile(50)) / 1000, Double(histogram.valueAtPercentile(99)) / 1000, pages))
        var samples: [Double] = []
        for n in 0..<10 {
            samples.append(try await turnMillis(client, id: UInt64(5_000 + n), .turnStart(Wire.TurnStartParams(threadId: thread, input: [Wire.UserInput(content: .text("one more \(n)"))])), thread: thread))
        }
        samples.sort()
        print(String(format: "| turn/start to turn/completed (the model request carries the whole history) | %.1f | %.1f | 10 |", samples[5], samples[9]))
        let compaction = try await turnMillis(client, id: 6_000, .threadCompactStart(Wire.ThreadCompactStartParams(threadId: thread)), thread: thread)
        print(String(format: "| thread/compact/start to turn/completed | %.1f | | 1 |", compaction))
        samples = []
        for n in 0..<10 {
            samples.append(try await turnMillis(client, id: UInt64(7_000 + n), .turnStart(Wire.TurnStartParams(threadId: thread, input: [Wire.UserInput(content: .text("after compaction \(n)"))])), thread: thread))
        }
        samples.sort()
        print(String(format: "| turn/start to turn/completed after the compaction | %.1f | %.1f | 10 |", samples[5], samples[9]))
        print(String(format: "\nServer RSS: %.0f MiB started, %.0f MiB with the thread loaded, %.0f MiB at the end.",
                     Double(idle) / 1024, Double(loaded) / 1024, Double(server.residentKiB()) / 1024))
        await client.close()
    }

    /// `count` connections subscribed to one thread (thread/resume), then one
    /// settings change: how long until every one of them has heard it, and
    /// the server's memory per subscribed connection.
    func subscribedConnections(directory: String, count: Int) async throws {
        print("\n## \(count) subscribed connections\n")
        let server = try Spawned(serverBin, ["--listen", "127.0.0.1:0", "--data-dir", directory, "--log-level", "error",
                                             "--max-connections", "\(count + 100)", "--handshake-timeout-ms", "600000"])
        defer { server.stop() }
        let writer = try await Frames.initialized(port: server.port)
        let thread = try await Frames.startThread(writer)
        let before = server.residentKiB()
        let connecting = ContinuousClock.now
        var watchers: [FrameConnection] = []
        for _ in 0..<count {
            let watcher = try await Frames.initialized(port: server.port)
            _ = try await watcher.roundTrip(Frames.request(3, .threadResume(Wire.ThreadResumeParams(threadId: thread, excludeTurns: true)))) { Frames.response($0)?.id == 3 }
            watchers.append(watcher)
        }
        let connected = (ContinuousClock.now - connecting).millis / 1000
        try await Task.sleep(for: .milliseconds(500))
        let after = server.residentKiB()
        print(String(format: "Connected, initialized and subscribed %d connections in %.1f s; server RSS %.0f -> %.0f MiB, %.1f KiB per subscribed connection.",
                     count, connected, Double(before) / 1024, Double(after) / 1024, Double(after - before) / Double(count)))
        for round in 0..<3 {
            let sent = ContinuousClock.now
            var update = Wire.ThreadSettingsUpdateParams()
            update.threadId = thread
            update.model = "model-\(round)"
            async let acknowledged = writer.roundTrip(Frames.request(UInt64(10 + round), .threadSettingsUpdate(update))) { Frames.response($0)?.id == UInt64(10 + round) }
            let arrivals = try await withThrowingTaskGroup(of: Double.self) { group in
                for watcher in watchers {
                    group.addTask {
                        while true {
                            let frame = try await watcher.next()
                            if case let .notification(note)? = try? Wire.Envelope(serializedBytes: frame).kind,
                               case let .threadSettingsUpdated(changed)? = note.payload, changed.settings?.model == "model-\(round)" {
                                return (ContinuousClock.now - sent).millis
                            }
                        }
                    }
                }
                var all: [Double] = []
                for try await arrival in group { all.append(arrival) }
                return all.sorted()
            }
            _ = try await acknowledged
            print(String(format: "Settings change %d: all %d subscribers heard it within %.0f ms (median %.0f ms, p99 %.0f ms).",
                         round + 1, arrivals.count, arrivals.last ?? 0, arrivals[arrivals.count / 2], arrivals[arrivals.count * 99 / 100]))
        }
        for watcher in watchers { await watcher.close() }
        await writer.close()
    }

    func raiseFileLimit() {
        var limit = rlimit()
        getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
        limit.rlim_cur = max(limit.rlim_cur, min(limit.rlim_max, 65_536))
        setrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
    }
}

/// A server process that prints "... listening on HOST:PORT".
final class Spawned: @unchecked Sendable {
    let process = Process()
    let port: Int

    /// The lines it printed before `lines` were complete (the first names the port).
    let printed: [String]

    init(_ path: String, _ arguments: [String], lines: Int = 1) throws {
        process.executableURL = URL(fileURLWithPath: path)
        process.arguments = arguments
        let pipe = Pipe()
        process.standardOutput = pipe
        try process.run()
        var text = Data()
        while text.filter({ $0 == UInt8(ascii: "\n") }).count < lines {
            let chunk = pipe.fileHandleForReading.availableData
            if chunk.isEmpty { throw BenchError("\(path) exited before listening") }
            text.append(chunk)
        }
        printed = String(decoding: text, as: UTF8.self).split(separator: "\n").map(String.init)
        guard let port = Int(printed[0].trimmingCharacters(in: .whitespacesAndNewlines).split(separator: ":").last ?? "") else {
            throw BenchError("\(path) printed no port")
        }
        self.port = port
    }

    /// The port on the printed line that starts with `prefix`.
    func port(after prefix: String) -> Int? {
        printed.first { $0.hasPrefix(prefix) }.flatMap { Int($0.split(separator: ":").last ?? "") }
    }

    func residentKiB() -> Int {
        let status = (try? String(contentsOfFile: "/proc/\(process.processIdentifier)/status", encoding: .utf8)) ?? ""
        let line = status.split(separator: "\n").first { $0.hasPrefix("VmRSS:") } ?? ""
        return Int(line.split(separator: " ").dropFirst().first ?? "") ?? 0
    }

    func stop() {
        guard process.isRunning else { return }
        kill(process.processIdentifier, SIGKILL)
        var status: Int32 = 0
        waitpid(process.processIdentifier, &status, 0)
    }
}

extension Sequence {
    func asyncMap<T>(_ transform: (Element) async throws -> T) async rethrows -> [T] {
        var out: [T] = []
        for element in self { out.append(try await transform(element)) }
        return out
    }
}
