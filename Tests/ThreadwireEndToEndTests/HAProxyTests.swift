import Foundation
import Testing
import ThreadwireServerTesting
import ThreadwireClient
import ThreadwireNIO
import ThreadwireWire

/// The documented health-check frames (docs/operations.md), read from the
/// document itself, so the documentation and the tests cannot drift apart.
enum DocumentedHealthCheck {
    static let readme: String = {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        return (try? String(contentsOf: root.appendingPathComponent("docs/operations.md"), encoding: .utf8)) ?? ""
    }()

    /// The hex digits right after `marker`, e.g. `send: {text: "…"}`.
    static func hex(after marker: String) -> String {
        guard let start = readme.range(of: marker) else { return "" }
        return String(readme[start.upperBound...].prefix { $0.isHexDigit })
    }

    static var request: String { hex(after: "send: {text: \"") }
    static var serving: String { hex(after: "receive: [{text: \"") }
    static var notServing: String { hex(after: "the reply is NOT_SERVING (`") }

    static func bytes(_ hex: String) -> [UInt8] {
        var bytes: [UInt8] = []
        var index = hex.startIndex
        while index < hex.endIndex, let next = hex.index(index, offsetBy: 2, limitedBy: hex.endIndex) {
            bytes.append(UInt8(hex[index..<next], radix: 16) ?? 0)
            index = next
        }
        return bytes
    }
}

@Suite("behind a real HAProxy", .serialized)
struct HAProxyTests {
    @Test("the documented health-check bytes get exactly the documented bytes back: SERVING, then NOT_SERVING while draining")
    func documentedHealthBytes() async throws {
        #expect(!DocumentedHealthCheck.request.isEmpty && !DocumentedHealthCheck.serving.isEmpty && !DocumentedHealthCheck.notServing.isEmpty)
        // A long grace and handshake timeout: on a loaded machine this test's
        // own steps can be late, and the server must still be draining (and
        // not closing the raw connection for not initializing) when they come.
        let server = try await ServerProcess.launch(arguments: ["--turn-grace-seconds", "60", "--handshake-timeout-ms", "120000"])
        defer { server.kill9InBackground() }
        let socket = try RawSocket(port: server.port)
        defer { socket.close() }
        try socket.send(DocumentedHealthCheck.bytes(DocumentedHealthCheck.request))
        let serving = DocumentedHealthCheck.bytes(DocumentedHealthCheck.serving)
        #expect(await readExactly(socket, serving.count) == serving)

        // Draining (a held turn keeps the server in its grace period).
        let client = try await server.client()
        let thread = try #require(try await client.startThread().thread?.id)
        _ = try await client.startTurn(thread, "#hold")
        kill(server.pid, SIGTERM)
        // The signal is handled asynchronously: ask again on the same raw
        // connection until the answer changes (each answer is one whole reply).
        let notServing = DocumentedHealthCheck.bytes(DocumentedHealthCheck.notServing)
        let reply = try await waitUntil("health/check answering NOT_SERVING after SIGTERM") { () -> [UInt8]? in
            try socket.send(DocumentedHealthCheck.bytes(DocumentedHealthCheck.request))
            let reply = await readExactly(socket, serving.count)
            #expect(reply.count == serving.count, "one whole reply per check")
            return reply == serving ? nil : reply
        }
        #expect(reply.suffix(notServing.count) == notServing[...], "reply \(reply)")
        #expect(reply.prefix(serving.count - notServing.count) == serving.prefix(serving.count - notServing.count))
    }

    @Test("HAProxy in TCP mode with the documented tcp-check bytes: both servers up, clients work through it, SIGTERM takes one out while its work finishes")
    func behindHAProxy() async throws {
        guard let haproxy = ["/usr/sbin/haproxy", "/usr/bin/haproxy", "/usr/local/sbin/haproxy"].first(where: FileManager.default.isExecutableFile) else {
            Issue.record("haproxy is not installed (make test installs it with apt-get)")
            return
        }
        let a = try await ServerProcess.launch(arguments: ["--turn-grace-seconds", "3"])
        let b = try await ServerProcess.launch(arguments: ["--turn-grace-seconds", "3"])
        let proxy = try HAProxy(binary: haproxy, servers: ["a": a.port, "b": b.port])
        defer { proxy.stop() }

        try await proxy.waitFor(server: "a", status: "UP", within: .seconds(10))
        try await proxy.waitFor(server: "b", status: "UP", within: .seconds(10))

        // Clients through the proxy: round robin spreads them over both.
        var clients: [(client: ThreadwireClient, thread: String, onA: Bool)] = []
        for _ in 0..<4 {
            let client = try await ThreadwireClient.connect(host: "127.0.0.1", port: proxy.port)
            try await client.initialize(name: "via-haproxy")
            let thread = try #require(try await client.startThread().thread?.id)
            let turn = try await client.startTurn(thread, "hello through the proxy")
            let finished = try await client.waitForTurn(thread, turn)
            #expect(finished.status == .completed)
            clients.append((client, thread, try await exists(thread, on: a)))
        }
        #expect(clients.contains { $0.onA } && clients.contains { !$0.onA }, "round robin used both servers")

        // A request stream in flight on server a when it gets SIGTERM.
        let onA = try #require(clients.first { $0.onA })
        let held = try await onA.client.startTurn(onA.thread, "#hold")
        let requests = 300
        let pipelined = Task {
            try await withThrowingTaskGroup(of: UInt32.self) { group in
                for index in 0..<requests {
                    group.addTask {
                        do {
                            _ = try await onA.client.call(.threadSettingsUpdate(Wire.ThreadSettingsUpdateParams(
                                threadId: onA.thread, cwd: "/work/\(index)")))
                            return 0
                        } catch let ClientError.status(code, _) {
                            return code
                        }
                    }
                }
                var codes: [UInt32] = []
                for try await code in group { codes.append(code) }
                return codes
            }
        }
        try await Task.sleep(for: .milliseconds(5))
        kill(a.pid, SIGTERM)
        // HAProxy sees it at its next checks (500 ms, fall 2). How fast is
        // not asserted here (a loaded CI machine is slow): that it happens is.
        try await proxy.waitFor(server: "a", status: "DOWN", within: .seconds(20))
        // Every request got its one answer: done, or refused as draining.
        let codes = try await pipelined.value
        #expect(codes.count == requests)
        #expect(codes.allSatisfy { $0 == 0 || $0 == 14 }, "codes \(Set(codes))")
        #expect(codes.contains(0))

        // New connections go to b.
        for _ in 0..<4 {
            let client = try await ThreadwireClient.connect(host: "127.0.0.1", port: proxy.port)
            try await client.initialize(name: "after-failover")
            let thread = try #require(try await client.startThread().thread?.id)
            #expect(try await exists(thread, on: b))
        }
        #expect(await a.stop() == 0, "a exits 0 after SIGTERM")
        // The held turn was interrupted and recorded by a's own shutdown.
        try await a.start()
        let reader = try await a.client()
        let stored = try await reader.read(onA.thread, turns: true, modelRequests: false)
        #expect(stored.thread?.turns.first { $0.id == held }?.status == .interrupted)
    }

    func exists(_ thread: String, on server: ServerProcess) async throws -> Bool {
        let client = try await server.client()
        defer { Task { await client.close() } }
        do {
            _ = try await client.read(thread, turns: false, modelRequests: false)
            return true
        } catch let ClientError.status(code, _) where code == 5 {
            return false
        }
    }

    func readExactly(_ socket: RawSocket, _ count: Int) async -> [UInt8] {
        await offPool { readExactlyBlocking(socket, count) }
    }

    func readExactlyBlocking(_ socket: RawSocket, _ count: Int) -> [UInt8] {
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: count)
        let deadline = Date().addingTimeInterval(10)
        while bytes.count < count, Date() < deadline {
            var poller = pollfd(fd: socket.fd, events: Int16(POLLIN), revents: 0)
            guard poll(&poller, 1, 50) >= 0 else { break }
            if poller.revents == 0 { continue }
            let received = chunk.withUnsafeMutableBytes { recv(socket.fd, $0.baseAddress, count - bytes.count, 0) }
            if received <= 0 { break }
            bytes += chunk[..<received]
        }
        return bytes
    }
}

/// HAProxy from Debian in TCP mode in front of threadwire servers, checking
/// them with the documented health-check bytes (docs/operations.md); its stats socket on TCP.
final class HAProxy: @unchecked Sendable {
    let port: Int
    let statsPort: Int
    private let process: Process
    private let directory: String

    init(binary: String, servers: [String: Int]) throws {
        port = try freePort()
        statsPort = try freePort()
        directory = NSTemporaryDirectory() + "threadwire-haproxy-" + UUID().uuidString
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let config = HAProxy.config(port: port, statsPort: statsPort, servers: servers)
        try config.write(toFile: directory + "/haproxy.cfg", atomically: true, encoding: .utf8)
        process = Process()
        process.executableURL = URL(fileURLWithPath: binary)
        process.arguments = ["-db", "-f", directory + "/haproxy.cfg"]
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle(forWritingAtPath: "/dev/null")
        try process.run()
    }

    /// The tested configuration; docs/operations.md shows the same backend.
    static func config(port: Int, statsPort: Int, servers: [String: Int]) -> String {
        let lines = servers.sorted { $0.key < $1.key }.map { "  server \($0.key) 127.0.0.1:\($0.value) check" }
        return """
        global
          stats socket ipv4@127.0.0.1:\(statsPort) level admin
        defaults
          mode tcp
          timeout connect 2s
          timeout client 60s
          timeout server 60s
        frontend threadwire
          bind 127.0.0.1:\(port)
          default_backend threadwire
        backend threadwire
          balance roundrobin
          option tcp-check
          tcp-check connect
          tcp-check send-binary \(DocumentedHealthCheck.request)
          tcp-check expect binary \(DocumentedHealthCheck.serving)
          default-server inter 500ms fall 2 rise 1
        \(lines.joined(separator: "\n"))

        """
    }

    /// A server's status (UP, DOWN, ...) from `show stat`.
    func status(of server: String) -> String? {
        guard let socket = try? RawSocket(port: statsPort) else { return nil }
        defer { socket.close() }
        try? socket.send(Array("show stat\n".utf8))
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 64 * 1024)
        while true {
            let count = chunk.withUnsafeMutableBytes { recv(socket.fd, $0.baseAddress, $0.count, 0) }
            if count <= 0 { break }
            bytes += chunk[..<count]
        }
        let rows = String(decoding: bytes, as: UTF8.self).split(separator: "\n")
        guard let header = rows.first?.dropFirst(2).split(separator: ",", omittingEmptySubsequences: false),
              let statusColumn = header.firstIndex(of: "status") else { return nil }
        for row in rows.dropFirst() {
            let fields = row.split(separator: ",", omittingEmptySubsequences: false)
            if fields.count > statusColumn, fields[0] == "threadwire", fields[1] == Substring(server) {
                return String(fields[statusColumn])
            }
        }
        return nil
    }

    func waitFor(server: String, status wanted: String, within timeout: Duration) async throws {
        let deadline = ContinuousClock.now + timeout
        var last: String?
        while ContinuousClock.now < deadline {
            last = await offPool { self.status(of: server) }
            if last?.hasPrefix(wanted) == true { return }
            try await Task.sleep(for: .milliseconds(50))
        }
        throw TestTimeout(description: "HAProxy never reported \(server) \(wanted) (last: \(last ?? "nothing"))")
    }

    func stop() {
        if process.isRunning { process.terminate() }
        process.waitForExit()
        try? FileManager.default.removeItem(atPath: directory)
    }
}

/// A port nothing listens on right now.
func freePort() throws -> Int {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    defer { close(fd) }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    address.sin_port = 0
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    let bound = withUnsafeMutablePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { pointer -> Int32 in
            guard bind(fd, pointer, length) == 0 else { return -1 }
            return getsockname(fd, pointer, &length)
        }
    }
    guard bound == 0 else { throw RawSocketError.system("bind", errno) }
    return Int(UInt16(bigEndian: address.sin_port))
}
