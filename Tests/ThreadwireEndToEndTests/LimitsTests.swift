import Foundation
import Testing
import ThreadwireServerTesting
import ThreadwireClient
import ThreadwireNIO
import ThreadwireWire
import ThreadwireTransport

/// Connection limits, the admin endpoint and health that follows the store,
/// against the real server binary (issue 9).
@Suite("limits and operations (real server)", .serialized)
struct LimitsTests {
    @Test("initialize reports every limit a client must respect, as configured by flags and the config file")
    func initializeReportsLimits() async throws {
        let config = #"{"limits": {"max_queued_requests": 77, "idle_timeout_ms": 45000, "handshake_timeout_ms": 30000}}"#
        let server = try await ServerProcess.launch(config: config, arguments: ["--max-notification-backlog-bytes", "2097152", "--max-queued-requests", "99"])
        let client = try await ThreadwireClient.connect(host: "127.0.0.1", port: server.port)
        let limits = try #require(try await client.initialize(name: "limits").limits)
        #expect(limits.maxFrameBytes == 4_194_304)
        #expect(limits.maxQueuedRequests == 99)  // the flag wins over the file
        #expect(limits.maxQueuedRequestBytes == 8_388_608)
        #expect(limits.maxNotificationBacklogBytes == 2_097_152)
        #expect(limits.idleTimeoutMs == 45000)
        #expect(limits.handshakeTimeoutMs == 30000)
    }

    @Test("a limit that cannot work stops startup with a message naming it; so does a log level that does not exist")
    func badLimitRefused() async throws {
        for (arguments, named) in [(["--max-connections", "0"], "max_connections"),
                                   (["--max-frame-bytes", "2000000", "--max-partial-frame-bytes", "1000000"], "max_partial_frame_bytes"),
                                   (["--tcp-keepalive-ms", "500"], "tcp_keepalive_ms"),
                                   (["--log-level", "bogus"], "The value 'bogus' is invalid for '--log-level <log-level>'")] {
            do {
                _ = try await ServerProcess.launch(arguments: arguments)
                Issue.record("started with \(arguments)")
            } catch let ServerProcessError.exitedEarly(status, stderr) {
                #expect(status != 0)
                #expect(stderr.contains(named), "\(arguments): \(stderr)")
            }
        }
    }

    @Test("client connections carry TCP keepalive (--tcp-keepalive-ms): the kernel's keepalive timer runs on the server's side of each")
    func tcpKeepalive() async throws {
        let server = try await ServerProcess.launch(arguments: ["--tcp-keepalive-ms", "3000"])
        let client = try await server.client()
        _ = try await client.result(.healthCheck(.init()))
        // ss shows the timer running now: a retransmission's while the answer
        // is unacknowledged, the keepalive's once the connection is quiet.
        _ = try await waitUntil("the keepalive timer on the server's side") { () -> Bool? in
            let (status, sockets, err) = try await runBinary("/usr/bin/ss", ["-tnoH", "state", "established", "( sport = :\(server.port) )"])
            try #require(status == 0, "\(err)")
            return !sockets.isEmpty && sockets.split(separator: "\n").allSatisfy { $0.contains("timer:(keepalive") } ? true : nil
        }
        let off = try await ServerProcess.launch(arguments: ["--tcp-keepalive-ms", "0"])
        // Held until ss has looked: a client dropped closes its connection.
        let quiet = try await off.client()
        _ = try await quiet.result(.healthCheck(.init()))
        let (_, unprobed, _) = try await runBinary("/usr/bin/ss", ["-tnoH", "state", "established", "( sport = :\(off.port) )"])
        #expect(!unprobed.isEmpty && !unprobed.contains("keepalive"), "\(unprobed)")
        await quiet.close()
    }

    @Test("past --max-connections a connection gets RESOURCE_EXHAUSTED, then a close; a freed slot is usable again")
    func connectionCap() async throws {
        let server = try await ServerProcess.launch(arguments: ["--max-connections", "2", "--admin-listen", "127.0.0.1:0"])
        let first = try await server.client()
        let second = try await server.client()
        let third = try RawSocket(port: server.port)
        defer { third.close() }
        let (frames, closed) = await third.readUntilClosed(seconds: 10)
        #expect(closed)
        let refusal = try #require(frames.first?.response)
        #expect(refusal.code == 8)
        #expect(refusal.message?.contains("max_connections (2)") == true, "\(refusal.message ?? "")")
        // The two inside are unaffected.
        _ = try await first.result(.healthCheck(.init()))
        _ = try await second.result(.healthCheck(.init()))
        await second.close()
        // The server sees the close asynchronously: wait until its own count
        // says the slot is free, then one client must get in. (A loop of
        // attempts could leak: an attempt admitted but failing later would
        // hold the slot it was waiting for.)
        _ = try await waitUntil("the server counting one open connection", timeout: .seconds(30)) { () -> Bool? in
            let metrics = try await httpGet(port: server.adminPort, path: "/metrics").body
            let line = metrics.split(separator: "\n").first { $0.hasPrefix("threadwire_connections_open ") }
            return line.flatMap { Double($0.split(separator: " ").last ?? "") } == 1 ? true : nil
        }
        let admitted = try await server.client()
        _ = try await admitted.result(.healthCheck(.init()))
        _ = try await first.result(.healthCheck(.init()))
    }

    @Test("an initialized connection with nothing in flight and no subscription is closed after the idle timeout; a subscriber stays, and so does a connection that keeps sending")
    func idleTimeout() async throws {
        let server = try await ServerProcess.launch(arguments: ["--idle-timeout-ms", "1500"])
        // The subscriber's initialize and thread/start in one write: no idle
        // moment between them, however long this process is kept from
        // running (a full suite on 2 cores once held it past the timeout).
        let subscriber = try RawSocket(port: server.port)
        defer { subscriber.close() }
        try subscriber.send(RawSocket.initialize + RawSocket.frame(id: 2, .threadStart(Wire.ThreadStartParams())))
        let started = try #require(await subscriber.response(to: 2, seconds: 10), "no answer to thread/start")
        #expect(started.code == 0, "\(started.message ?? "")")
        let idle = try RawSocket(port: server.port)
        defer { idle.close() }
        try idle.send(RawSocket.initialize)
        let (frames, closed) = await idle.readUntilClosed(seconds: 10)
        #expect(closed)
        let last = try #require(frames.last?.response)
        #expect(last.code == 14 && last.message?.contains("idle_timeout_ms (1500)") == true, "\(last.message ?? "")")
        // A connection that sends every half timeout is never idle: each
        // frame read moves its idle clock on, over two timeouts.
        let busy = try RawSocket(port: server.port)
        defer { busy.close() }
        try busy.send(RawSocket.initialize)
        for id in UInt64(2)...7 {
            try await Task.sleep(for: .milliseconds(500))
            try busy.send(RawSocket.frame(id: id, .healthCheck(.init())))
            let answer = try #require(await busy.response(to: id, seconds: 10), "the busy connection was closed before request \(id)")
            #expect(answer.code == 0, "\(answer.message ?? "")")
        }
        // Two more idle periods later the subscriber is still there.
        try subscriber.send(RawSocket.frame(id: 3, .healthCheck(.init())))
        let health = try #require(await subscriber.response(to: 3, seconds: 10), "the subscriber was closed")
        #expect(health.code == 0, "\(health.message ?? "")")
    }

    @Test("partial frames across connections are capped: the connection that passes the cap is refused, others go on")
    func partialFrameCap() async throws {
        let server = try await ServerProcess.launch(arguments: ["--max-frame-bytes", "1000000", "--max-partial-frame-bytes", "1500000"])
        // A 900 KB frame announced, 800 KB of it sent: held by the server.
        let header: [UInt8] = [0, 0, 0x0D, 0xBB, 0xA0]  // 900,000
        let part = [UInt8](repeating: 0x41, count: 800_000)
        let first = try RawSocket(port: server.port)
        defer { first.close() }
        try first.send(RawSocket.initialize)
        _ = await first.readFrames(1, seconds: 10)
        try first.send(header + part)
        let good = try await server.client()
        // The first connection's share is held before the second arrives:
        // its bytes reached the server's socket, and the server reads eagerly.
        await first.waitUntilSent(seconds: 10)
        _ = try await waitUntil("the server read the first connection's 800 KB") {
            try await serverReadEverything(port: server.port) ? true : nil
        }
        let second = try RawSocket(port: server.port)
        defer { second.close() }
        try second.send(header + part)
        let (frames, closed) = await second.readUntilClosed(seconds: 10)
        #expect(closed)
        let refusal = try #require(frames.last?.response)
        #expect(refusal.code == 8 && refusal.message?.contains("max_partial_frame_bytes") == true, "\(refusal.message ?? "")")
        _ = try await good.result(.healthCheck(.init()))
        // The first completes its frame: it was held, not dropped (the
        // payload is no Envelope, so the answer is INVALID_ARGUMENT).
        try first.send([UInt8](repeating: 0x41, count: 100_000))
        let answer = try #require(await first.readFrames(1, seconds: 10).first?.response)
        #expect(answer.code == 3)
    }

    @Test("past what its file limit leaves connections the server refuses them with UNAVAILABLE and keeps descriptors free: it never runs out, does not spin, and serves again once they free up")
    func fileDescriptorExhaustion() async throws {
        let limit = 64
        let server = try await ServerProcess.launch(fileLimit: limit)
        let established = try await server.client()
        var sockets: [RawSocket] = []
        defer { for socket in sockets { socket.close() } }
        // More connections than descriptors: the server takes what its
        // budget allows and refuses the rest as they come.
        for _ in 0..<120 { if let socket = try? RawSocket(port: server.port) { sockets.append(socket) } }
        try await Task.sleep(for: .milliseconds(500))
        // Six seconds: longer than the store's health probe's period (5 s),
        // so a probe runs meanwhile. Throughout, descriptors stay free for
        // the runtime: libdispatch kills the process when it cannot open one
        // (a CI run died so, of SIGILL, when the server let accept use them up).
        let before = server.cpuSeconds()
        var mostOpen = 0
        let watchUntil = ContinuousClock.now + .seconds(6)
        while ContinuousClock.now < watchUntil {
            mostOpen = max(mostOpen, Self.openDescriptors(of: server.pid, below: limit))
            try await Task.sleep(for: .milliseconds(100))
        }
        let used = server.cpuSeconds() - before
        #expect(used < 0.6, "the server used \(used) s of CPU in 6 s while its connections held all it allows them")
        #expect(mostOpen > limit / 2 && mostOpen <= limit - 4, "at most \(mostOpen) of \(limit) descriptors open")
        // A client that was already connected is served meanwhile, and the
        // store still counts as healthy.
        guard case let .healthCheck(health) = try await established.result(.healthCheck(.init()), timeoutMs: 5000) else {
            Issue.record("bad result"); return
        }
        #expect(health.status == .serving)
        // The connections past the limit were refused with a clear error,
        // not left hanging (the last one queued is one of them).
        let last = try #require(sockets.last)
        let (frames, closed) = await last.readUntilClosed(seconds: 10)
        #expect(closed)
        let refusal = try #require(frames.last?.response)
        #expect(refusal.code == 14 && refusal.message?.contains("out of file descriptors") == true, "\(refusal.message ?? "")")
        for socket in sockets { socket.close() }
        sockets.removeAll()
        // Once descriptors are free a new client is served.
        let deadline = ContinuousClock.now + .seconds(15)
        var served = false
        while ContinuousClock.now < deadline, !served {
            if let client = try? await server.client(), (try? await client.result(.healthCheck(.init()))) != nil {
                served = true
            } else {
                try await Task.sleep(for: .milliseconds(100))
            }
        }
        #expect(served)
    }

    @Test("at startup the server raises its soft file limit to the hard one (as Go does), and connections get what that leaves (/metrics)")
    func raisesSoftFileLimit() async throws {
        let server = try await ServerProcess.launch(arguments: ["--admin-listen", "127.0.0.1:0"], softFileLimit: 256)
        let limits = try String(contentsOfFile: "/proc/\(server.pid)/limits", encoding: .utf8)
        let line = try #require(limits.split(separator: "\n").first { $0.hasPrefix("Max open files") })
        // The soft and hard columns; "unlimited" reads as no ceiling.
        let numbers = line.dropFirst("Max open files".count).split(separator: " ").prefix(2).map { $0 == "unlimited" ? Int.max : Int($0) }
        let soft = try #require(numbers.first ?? nil, "\(line)"), hard = try #require(numbers.last ?? nil, "\(line)")
        try #require(numbers.count == 2, "\(line)")
        #expect(soft == min(hard, 1 << 20) && soft > 256, "\(line)")
        let metrics = try await httpGet(port: server.adminPort, path: "/metrics").body
        let capacity = try #require(metricValue(metrics, "threadwire_connection_descriptors_capacity"))
        #expect(capacity > 256 && Int(capacity) < soft - 8, "capacity \(capacity) of a soft limit of \(soft)")
        _ = try await (try await server.client()).result(.healthCheck(.init()))
    }

    /// Those under `limit`: one the server inherited above it (the test
    /// process's, not close-on-exec) takes no place under the limit.
    static func openDescriptors(of pid: Int32, below limit: Int) -> Int {
        ((try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/fd")) ?? []).compactMap { Int($0) }.filter { $0 < limit }.count
    }

    @Test("before it listens the server holds a timer of every clock (uptime, continuous, wall): out of descriptors, libdispatch could not open one later and that clock's timers would never fire")
    func timersReadyBeforeListening() async throws {
        let server = try await ServerProcess.launch(fileLimit: 64)
        // Realtime (0) and boottime (7) are libdispatch's alone; monotonic
        // (1) is its uptime clock's and the event loops' too.
        let clocks = RuntimeTimers.timerClocks(ofProcess: "\(server.pid)")
        #expect(clocks.isSuperset(of: [0, 1, 7]), "timerfd clocks: \(clocks.sorted())")
        // And a client is served: preparing them took nothing else away.
        let client = try await server.client()
        guard case let .healthCheck(health) = try await client.result(.healthCheck(.init())) else {
            Issue.record("bad result"); return
        }
        #expect(health.status == .serving)
    }

    @Test("a port already in use stops startup with a message naming the address and the cause")
    func portInUse() async throws {
        let first = try await ServerProcess.launch()
        do {
            _ = try await ServerProcess.launch(arguments: ["--listen", "127.0.0.1:\(first.port)"])
            Issue.record("a second server started on a port already in use")
        } catch let ServerProcessError.exitedEarly(status, stderr) {
            #expect(status != 0)
            #expect(stderr.contains("cannot listen on 127.0.0.1:\(first.port): Address already in use"), "\(stderr)")
        }
        _ = try await (try await first.client()).result(.healthCheck(.init()))
    }

    @Test("/metrics is Prometheus text and its counters move with the traffic; /livez and /readyz answer")
    func metricsEndpoint() async throws {
        let server = try await ServerProcess.launch(arguments: ["--admin-listen", "127.0.0.1:0"])
        #expect(server.adminPort > 0)
        #expect(try await httpGet(port: server.adminPort, path: "/livez").status == 200)
        let ready = try await httpGet(port: server.adminPort, path: "/readyz")
        #expect(ready.status == 200)
        let client = try await server.client()
        let before = try await httpGet(port: server.adminPort, path: "/metrics").body
        try expectPrometheusText(before)
        let healthBefore = metricValue(before, "threadwire_requests_total", labels: #"method="health/check""#) ?? 0
        for _ in 0..<25 { _ = try await client.result(.healthCheck(.init())) }
        let thread = try #require(try await client.startThread().thread?.id)
        _ = try await client.read(thread, turns: false, modelRequests: false)
        let after = try await httpGet(port: server.adminPort, path: "/metrics").body
        try expectPrometheusText(after)
        #expect((metricValue(after, "threadwire_requests_total", labels: #"method="health/check""#) ?? 0) - healthBefore == 25)
        #expect(metricValue(after, "threadwire_requests_total", labels: #"method="thread/start""#) == 1)
        #expect((metricValue(after, "threadwire_frames_in_total") ?? 0) >= 28)
        #expect((metricValue(after, "threadwire_bytes_out_total") ?? 0) > (metricValue(before, "threadwire_bytes_out_total") ?? 0))
        #expect(metricValue(after, "threadwire_connections_open") == 1)
        #expect(metricValue(after, "threadwire_loaded_threads") == 1)
        #expect(metricValue(after, "threadwire_store_healthy") == 1)
        #expect(after.contains(#"threadwire_request_duration_seconds_bucket{method="health/check""#))
        let latenciesBefore = metricValue(before, "threadwire_request_duration_seconds_count", labels: #"method="health/check""#) ?? 0
        #expect((metricValue(after, "threadwire_request_duration_seconds_count", labels: #"method="health/check""#) ?? 0) - latenciesBefore == 25,
                "every health/check's latency is in its histogram")
        #expect(metricValue(after, "threadwire_store_commit_seconds_count") ?? 0 >= 1)
        #expect(metricValue(after, "threadwire_store_commit_batch_size_count") ?? 0 >= 1)
        for name in ["threadwire_backpressure_pauses_total", "threadwire_slow_subscriber_disconnects_total", "threadwire_running_turns"] {
            #expect(after.contains("# TYPE \(name)"), "\(name) is exported")
        }
        // Status names, not numbers: a refused call counts under its name.
        await expectStatus(5, mentioning: "not found") { _ = try await client.read("no-such-thread") }
        let named = try await httpGet(port: server.adminPort, path: "/metrics").body
        #expect(metricValue(named, "threadwire_requests_total", labels: #"method="thread/read",code="NOT_FOUND""#) == 1)
        #expect(metricValue(named, "threadwire_requests_total", labels: #"method="thread/start",code="OK""#) == 1)
        // Every metric has its help, the process and the build are there.
        let typed = named.split(separator: "\n").filter { $0.hasPrefix("# TYPE ") }.map { $0.split(separator: " ")[2] }
        let helped = Set(named.split(separator: "\n").filter { $0.hasPrefix("# HELP ") }.map { $0.split(separator: " ")[2] })
        #expect(!typed.isEmpty && typed.allSatisfy(helped.contains), "a # HELP for every metric")
        #expect(!named.contains("(no description)"), "every metric's help is written down (Exposition.help)")
        #expect((metricValue(named, "process_open_fds") ?? 0) > 0)
        #expect((metricValue(named, "process_resident_memory_bytes") ?? 0) > 1_000_000)
        #expect((metricValue(named, "process_max_fds") ?? 0) >= (metricValue(named, "process_open_fds") ?? 1))
        #expect((metricValue(named, "process_start_time_seconds") ?? 0) > 1_700_000_000)
        #expect(named.contains(#"threadwire_build_info{version=""#))
        // Prometheus' own linter (Debian's promtool) takes it as it is.
        let file = NSTemporaryDirectory() + "threadwire-metrics-\(UUID().uuidString)"
        try named.write(toFile: file, atomically: true, encoding: .utf8)
        defer { try? FileManager.default.removeItem(atPath: file) }
        #expect(shell("promtool check metrics < \(file)") == 0, "promtool check metrics passes")
    }

    @Test("SIGTERM: readiness and health fail first while a running turn gets its grace, then the server exits 0")
    func drainingFailsReadinessFirst() async throws {
        // A grace long enough that the server is still draining when a
        // loaded CI machine gets round to asking /readyz, short enough that
        // it exits within the 10 s `stop` gives it.
        let server = try await ServerProcess.launch(arguments: ["--admin-listen", "127.0.0.1:0", "--turn-grace-seconds", "6"])
        let client = try await server.client()
        let thread = try #require(try await client.startThread().thread?.id)
        _ = try await client.startTurn(thread, "#hold")
        let health = try await server.client(initialize: false)
        // Accepted (not just queued in the listen backlog, which the closing listener drops).
        _ = try await health.result(.healthCheck(.init()))
        kill(server.pid, SIGTERM)
        let deadline = ContinuousClock.now + .seconds(5)
        var readyz = (status: 0, body: "")
        while ContinuousClock.now < deadline {
            readyz = try await httpGet(port: server.adminPort, path: "/readyz")
            if readyz.status == 503 { break }
            try await Task.sleep(for: .milliseconds(20))
        }
        #expect(readyz.status == 503 && readyz.body.contains("draining"), "\(readyz)")
        guard case let .healthCheck(answer) = try await health.result(.healthCheck(.init())) else { Issue.record("bad result"); return }
        #expect(answer.status == .notServing)
        #expect(await server.stop() == 0)
        try await server.start()
        let after = try await server.client()
        let stored = try await after.read(thread, turns: true, modelRequests: false)
        #expect(stored.thread?.turns.last?.status == .interrupted)
    }

    @Test("a turn whose end cannot be committed (the disk full) ends FAILED once the store has room again: never IN_PROGRESS for good",
          .needsRoot("mounting a small tmpfs"))
    func turnEndsAfterTheDiskHasRoom() async throws {
        let mountPoint = try smallDisk()
        defer { removeSmallDisk(mountPoint) }
        let server = try await InProcessServer.launch(arguments: ["--data-dir", mountPoint + "/store"])
        let client = try await server.client()
        let thread = try #require(try await client.startThread().thread?.id)
        // The disk fills as the turn starts: its next commit fails (the model
        // request, or the answer), and so does committing its failure.
        let turn = try await client.startTurn(thread, "#sleep 2000\n" + String(repeating: "a long answer ", count: 20_000))
        _ = shell("dd if=/dev/zero of='\(mountPoint)/filler' bs=64k 2>/dev/null")
        _ = try await waitUntil("the store refusing commits", timeout: .seconds(30)) { () -> Bool? in
            guard case let .healthCheck(health) = try await client.result(.healthCheck(.init())) else { throw UnexpectedResult(expected: "healthCheck") }
            return health.status == .notServing ? true : nil
        }
        #expect(try await client.read(thread).thread?.turns.first { $0.id == turn }?.status == .inProgress, "the end was not committed")
        try FileManager.default.removeItem(atPath: mountPoint + "/filler")
        let ended = try await client.waitForTurn(thread, turn, timeout: .seconds(20))
        #expect(ended.status == .failed, "\(ended.status as Any)")
        let stored = try await (try await server.client()).read(thread)
        #expect(stored.thread?.status?.type == .idle, "the thread takes a new turn: \(stored.thread?.status as Any)")
        #expect(try await client.runTurn(thread, "after the disk had room").status == .completed)
    }

    @Test("health and readiness follow the store: NOT_SERVING while the disk is full, SERVING once it has room",
          .needsRoot("mounting a small tmpfs"))
    func healthFollowsStore() async throws {
        let mountPoint = try smallDisk()
        defer { removeSmallDisk(mountPoint) }
        let server = try await ServerProcess.launch(arguments: ["--admin-listen", "127.0.0.1:0", "--data-dir", mountPoint + "/store"])
        let client = try await server.client()
        let thread = try #require(try await client.startThread().thread?.id)
        guard case let .healthCheck(before) = try await client.result(.healthCheck(.init())) else { Issue.record("bad result"); return }
        #expect(before.status == .serving)

        // Fill the disk.
        _ = shell("dd if=/dev/zero of='\(mountPoint)/filler' bs=64k 2>/dev/null")
        // A commit now fails with UNAVAILABLE naming the store...
        var failed = false
        for index in 0..<50 where !failed {
            do {
                _ = try await client.result(.threadStart(Wire.ThreadStartParams(baseInstructions: String(repeating: "n", count: 20_000) + "\(index)")))
            } catch let ClientError.status(code, message) {
                #expect(code == 14 && message.contains("store"), "\(message)")
                failed = true
            }
        }
        #expect(failed)
        // ...and health and readiness say so.
        guard case let .healthCheck(full) = try await client.result(.healthCheck(.init())) else { Issue.record("bad result"); return }
        #expect(full.status == .notServing)
        #expect(try await runCLI(["health", "--server", "127.0.0.1:\(server.port)"]).0 == 4,
                "the CLI's health exits 4 while NOT_SERVING, as grpc_health_probe does")
        let readyz = try await httpGet(port: server.adminPort, path: "/readyz")
        #expect(readyz.status == 503 && readyz.body.contains("store"), "\(readyz)")
        // Reads still work.
        _ = try await client.read(thread, turns: false, modelRequests: false)

        // Room again: the probe notices within a few seconds.
        try FileManager.default.removeItem(atPath: mountPoint + "/filler")
        let deadline = ContinuousClock.now + .seconds(15)
        var serving = false
        while ContinuousClock.now < deadline, !serving {
            if case let .healthCheck(now) = try await client.result(.healthCheck(.init())), now.status == .serving { serving = true }
            else { try await Task.sleep(for: .milliseconds(100)) }
        }
        #expect(serving)
        #expect(try await runCLI(["health", "--server", "127.0.0.1:\(server.port)"]).0 == 0)
        #expect(try await httpGet(port: server.adminPort, path: "/readyz").status == 200)
        _ = try await client.startThread()
        await server.stop()
    }

    /// Every line is a comment or `name{labels} value`, and every sample's
    /// family was announced with # TYPE.
    func expectPrometheusText(_ text: String, sourceLocation: SourceLocation = #_sourceLocation) throws {
        let sample = try Regex(#"^[a-zA-Z_:][a-zA-Z0-9_:]*(\{[a-zA-Z_][a-zA-Z0-9_]*="[^"]*"(,[a-zA-Z_][a-zA-Z0-9_]*="[^"]*")*\})? -?[0-9.eE+-]+|NaN|[+-]Inf$"#)
        var types: Set<String> = []
        var samples = 0
        for line in text.split(separator: "\n") {
            if line.hasPrefix("# TYPE ") {
                types.insert(String(line.split(separator: " ")[2]))
                continue
            }
            if line.hasPrefix("#") { continue }
            #expect(line.wholeMatch(of: sample) != nil, "not a Prometheus sample: \(line)", sourceLocation: sourceLocation)
            let name = String(line.prefix { $0 != "{" && $0 != " " })
            let family = ["_bucket", "_sum", "_count"].reduce(name) { $0.hasSuffix($1) ? String($0.dropLast($1.count)) : $0 }
            #expect(types.contains(family) || types.contains(name), "no # TYPE for \(name)", sourceLocation: sourceLocation)
            samples += 1
        }
        #expect(samples > 0, sourceLocation: sourceLocation)
    }
}

@discardableResult
func shell(_ command: String) -> Int32 {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: "/bin/sh")
    process.arguments = ["-c", command]
    do { try process.run() } catch { return -1 }
    process.waitForExit()
    return process.terminationStatus
}

/// A 4 MiB tmpfs to fill (a disk-full test, `.needsRoot`): its mount point.
private func smallDisk(sourceLocation: SourceLocation = #_sourceLocation) throws -> String {
    try requireRoot("mounting a small tmpfs", sourceLocation: sourceLocation)
    let mountPoint = NSTemporaryDirectory() + "threadwire-full-" + UUID().uuidString
    try FileManager.default.createDirectory(atPath: mountPoint, withIntermediateDirectories: true)
    try #require(shell("mount -t tmpfs -o size=4m tmpfs '\(mountPoint)'") == 0, "mount a 4 MiB tmpfs at \(mountPoint)",
                 sourceLocation: sourceLocation)
    return mountPoint
}

private func removeSmallDisk(_ mountPoint: String) {
    // Lazily: an in-process server's store may still hold its files open
    // while it shuts down, and a busy mount would otherwise stay behind.
    _ = shell("umount -l '\(mountPoint)'")
    try? FileManager.default.removeItem(atPath: mountPoint)
}
