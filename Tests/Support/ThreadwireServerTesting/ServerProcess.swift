public import Foundation
public import Testing
public import ThreadwireClient
public import ThreadwireWire

/// The real `threadwire-server` binary on an ephemeral port with a temporary
/// data directory that survives restarts (and kill -9) of the process.
public final class ServerProcess: @unchecked Sendable {
    private let setup: TestServerSetup
    public var dataDir: String { setup.dataDir }
    public private(set) var process: SpawnedProcess?
    /// The read end of the server's stdout, kept open while it runs (a
    /// write to a pipe nobody holds would end it).
    private var stdoutPipe: Pipe?
    public private(set) var port = 0
    public private(set) var adminPort = 0
    /// The gRPC listener's port (`--grpc-listen`).
    public private(set) var grpcPort = 0
    /// The web listener's port (`--web-listen`).
    public private(set) var webPort = 0
    private let extraArguments: [String]
    private let fileLimit: Int?
    private let softFileLimit: Int?
    /// Extra environment of the server process (takes effect at the next start).
    public var environment: [String: String]
    /// The port to listen on at the next start (nil: any free one).
    public var fixedPort: Int?
    /// The server's standard error, appended to across restarts.
    public var stderrPath: String { dataDir + "/stderr.log" }
    /// The lines of the server's standard error (across restarts) that
    /// contain any of `words`: what a failed expectation quotes to say why.
    public func stderrLines(containing words: String...) -> [String] {
        let log = (try? String(contentsOfFile: stderrPath, encoding: .utf8)) ?? ""
        return log.split(separator: "\n").filter { line in words.contains { line.contains($0) } }.map(String.init)
    }
    /// Bearer token `client()` presents.
    public var token: String?

    public static var binary: String {
        if let path = ProcessInfo.processInfo.environment["THREADWIRE_SERVER_BIN"] { return path }
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        return root.appendingPathComponent(".build/debug/threadwire-server").path
    }

    /// - Parameter config: the server's JSON config file contents.
    /// - Parameter fileLimit: the server's `ulimit -n` (soft and hard).
    /// - Parameter softFileLimit: its `ulimit -S -n` alone.
    public init(config: String? = nil, arguments: [String] = [], fileLimit: Int? = nil, softFileLimit: Int? = nil,
                environment: [String: String] = [:]) throws {
        setup = try TestServerSetup(config: config)
        extraArguments = arguments
        self.fileLimit = fileLimit
        self.softFileLimit = softFileLimit
        self.environment = environment
        try startBlocking()
    }

    /// `init` on a thread of its own: waiting for a slow start (a server that
    /// first migrates a PostgreSQL database) must not hold one of the test
    /// concurrency pool's few threads, which other tests need meanwhile.
    /// Every test starts its servers this way: a blocking wait on the pool
    /// also delays the other tests' client code, and timed steps (handshake
    /// and idle timeouts) then fail for no fault of the server.
    public static func launch(config: String? = nil, arguments: [String] = [], fileLimit: Int? = nil, softFileLimit: Int? = nil,
                       environment: [String: String] = [:]) async throws -> ServerProcess {
        try await offThread {
            try ServerProcess(config: config, arguments: arguments, fileLimit: fileLimit, softFileLimit: softFileLimit, environment: environment)
        }
    }

    /// Starts the server again (after `stop` or `kill9`), on a thread of its own (see `launch`).
    public func start() async throws {
        try await offThread { [self] in try startBlocking() }
    }

    /// `stopBlocking` on a thread of its own (see `launch`).
    @discardableResult
    public func stop() async -> Int32? {
        await withCheckedContinuation { continuation in
            Thread.detachNewThread { [self] in continuation.resume(returning: stopBlocking()) }
        }
    }

    /// Stops and starts the server, off the test concurrency pool.
    public func restart() async throws {
        await stop()
        try await start()
    }

    /// Restarts it with another extra environment (on the same data
    /// directory), on `port` if given (a client that reconnects finds it).
    public func restart(environment: [String: String], port: Int? = nil) async throws {
        await stop()
        self.environment = environment
        fixedPort = port
        try await start()
    }

    /// Writes a new config (takes effect at the next restart).
    public func rewriteConfig(_ config: String) throws { try setup.rewriteConfig(config) }

    public func startBlocking() throws {
        var executable = Self.binary
        var arguments = ["--listen", "127.0.0.1:\(fixedPort ?? 0)"] + setup.arguments(extraArguments)
        if let fileLimit {
            arguments = ["-c", "ulimit -n \(fileLimit) && exec \"$0\" \"$@\"", executable] + arguments
            executable = "/bin/sh"
        } else if let softFileLimit {
            arguments = ["-c", "ulimit -S -n \(softFileLimit) && exec \"$0\" \"$@\"", executable] + arguments
            executable = "/bin/sh"
        }
        let stdout = Pipe()
        // Only the server's own copy (dup2 in its child) stays open across
        // exec: other processes spawned meanwhile must not hold this pipe.
        for fd in [stdout.fileHandleForReading.fileDescriptor, stdout.fileHandleForWriting.fileDescriptor] {
            _ = fcntl(fd, F_SETFD, fcntl(fd, F_GETFD) | FD_CLOEXEC)
        }
        if !FileManager.default.fileExists(atPath: stderrPath) { FileManager.default.createFile(atPath: stderrPath, contents: nil) }
        let log = FileHandle(forWritingAtPath: stderrPath)
        log?.seekToEndOfFile()
        let process = try SpawnedProcess(executable: executable, arguments: arguments,
                                         environment: environment.isEmpty ? nil : ProcessInfo.processInfo.environment.merging(environment) { $1 },
                                         standardOutput: stdout.fileHandleForWriting.fileDescriptor, standardError: log?.fileDescriptor)
        // The child has its copies; ours would keep the pipe from ever ending.
        try? stdout.fileHandleForWriting.close()
        try? log?.close()
        self.process = process
        stdoutPipe = stdout
        // The server prints one line when it is ready to accept, and one
        // more for each of the admin endpoint and the gRPC listener it runs.
        let wantsAdmin = arguments.contains("--admin-listen")
        let wantsGRPC = arguments.contains("--grpc-listen")
        let wantsWeb = arguments.contains("--web-listen")
        var buffered = Data()
        var lines: [String] = []
        let startDeadline = Date().addingTimeInterval(120)
        while lines.count < 1 + (wantsAdmin ? 1 : 0) + (wantsGRPC ? 1 : 0) + (wantsWeb ? 1 : 0) {
            if let newline = buffered.firstIndex(of: UInt8(ascii: "\n")) {
                lines.append(String(decoding: buffered[..<newline], as: UTF8.self))
                buffered = Data(buffered[(newline + 1)...])
                continue
            }
            switch Self.read(stdout.fileHandleForReading.fileDescriptor, whileRunning: process, until: startDeadline) {
            case let .bytes(chunk):
                buffered.append(contentsOf: chunk)
            case .ended:
                process.waitForExit()
                self.process = nil  // reported by the error, not again at deinit
                let log = (try? String(contentsOfFile: stderrPath, encoding: .utf8)) ?? ""
                throw ServerProcessError.exitedEarly(status: process.terminationStatus, stderr: String(log.suffix(2000)))
            case .timedOut:
                kill(process.processIdentifier, SIGKILL)
                process.waitForExit()
                throw ServerProcessError.unexpectedOutput("threadwire-server printed no address within 120 s: \(lines)")
            }
        }
        for text in lines {
            if text.hasPrefix("threadwire listening on "), let port = Int(text.split(separator: ":").last ?? "") {
                self.port = port
            } else if text.hasPrefix("threadwire admin on http://"), let port = Int(text.split(separator: ":").last ?? "") {
                adminPort = port
            } else if text.hasPrefix("threadwire grpc on "), let port = Int(text.split(separator: ":").last ?? "") {
                grpcPort = port
            } else if text.hasPrefix("threadwire web on http://"), let port = Int(text.split(separator: ":").last ?? "") {
                webPort = port
            } else {
                throw ServerProcessError.unexpectedOutput(text)
            }
        }
    }

    public func client(initialize: Bool = true, optOut: [String] = []) async throws -> ThreadwireClient {
        let client = try await ThreadwireClient.connect(host: "127.0.0.1", port: port)
        if initialize { try await client.initialize(name: "tests", optOut: optOut, authToken: token) }
        return client
    }

    public enum ReadOutcome { case bytes([UInt8]), ended, timedOut }

    /// What the server printed next, without waiting for ever: a read on
    /// its stdout pipe ends only when every holder of the pipe's write end
    /// closed it, and a process another test spawned at the same moment can
    /// hold a copy. So the wait polls, and once the server has exited and
    /// nothing more is there, that is the end.
    public static func read(_ fd: Int32, whileRunning process: SpawnedProcess, until deadline: Date) -> ReadOutcome {
        var chunk = [UInt8](repeating: 0, count: 4096)
        while Date() < deadline {
            var poller = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            let ready = poll(&poller, 1, 100)
            if ready > 0 {
                let count = chunk.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, 4096) }
                if count > 0 { return .bytes(Array(chunk[..<count])) }
                if count == 0 { return .ended }
                if errno == EINTR || errno == EAGAIN { continue }
                return .ended
            }
            if ready < 0 && errno != EINTR { return .ended }
            if ready == 0 && !process.isRunning { return .ended }
        }
        return .timedOut
    }

    /// SIGTERM, and SIGKILL if it has not exited within 10 s (a test must never
    /// hang). Returns the exit status when the server exited by itself.
    @discardableResult
    public func stopBlocking() -> Int32? {
        guard let process else { return nil }
        guard process.isRunning else {
            // It exited by itself (a test sent SIGTERM): that exit's status.
            self.process = nil
            return process.terminationReason == .uncaughtSignal ? 128 + process.terminationStatus : process.terminationStatus
        }
        process.terminate()
        var status = waitForExit(process, seconds: 10)
        if status == nil {
            Issue.record("threadwire-server ignored SIGTERM for 10 s")
            kill(process.processIdentifier, SIGKILL)
            status = waitForExit(process, seconds: 10)
        }
        self.process = nil
        return status
    }

    /// SIGTERM, with the waiting (SIGKILL after 10 s) on a thread of its own:
    /// for `defer` at the end of an async test, where waiting would hold one
    /// of the cooperative pool's few threads and stall every other test.
    public func stopInBackground() {
        guard let process else { return }
        self.process = nil
        guard process.isRunning else { return }
        process.terminate()
        Thread.detachNewThread {
            let deadline = Date().addingTimeInterval(10)
            while process.isRunning && Date() < deadline { usleep(10_000) }
            if process.isRunning { kill(process.processIdentifier, SIGKILL) }
        }
    }

    public var pid: Int32 { process?.processIdentifier ?? 0 }

    /// Resident set size of the server process, in bytes.
    public func residentBytes() -> Int {
        guard let status = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8),
              let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmRSS:") }),
              let kib = Int(line.split(separator: " ").dropFirst().first ?? "") else { return 0 }
        return kib * 1024
    }

    /// CPU time (user + system) the server process has used, in seconds.
    public func cpuSeconds() -> Double {
        guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
              let close = stat.lastIndex(of: ")") else { return 0 }
        let fields = stat[stat.index(after: close)...].split(separator: " ")
        // After the command: state is field 3, utime 14, stime 15.
        let ticks = (Double(fields[11]) ?? 0) + (Double(fields[12]) ?? 0)
        return ticks / Double(sysconf(Int32(_SC_CLK_TCK)))
    }

    /// SIGKILL: no chance to flush anything. Returns once the process is
    /// gone (its port and files are free for a restart); the waiting is on a
    /// thread of its own (see `launch`).
    public func kill9() async {
        await offPool { [self] in kill9Blocking() }
    }

    /// SIGKILL without waiting for the process to go (for a `defer`).
    public func kill9InBackground() {
        guard let process, process.isRunning else { return }
        self.process = nil
        kill(process.processIdentifier, SIGKILL)
    }

    private func kill9Blocking() {
        guard let process, process.isRunning else { return }
        kill(process.processIdentifier, SIGKILL)
        _ = waitForExit(process, seconds: 10)
        self.process = nil
    }

    /// A server nobody stopped: SIGTERM now, and the waiting (up to 10 s, then
    /// SIGKILL) on a thread of its own, never on the test's concurrency pool
    /// (a server still draining a client that does not read would hold one of
    /// its few threads for seconds and starve other tests).
    deinit {
        let dataDir = self.dataDir
        guard let process, process.isRunning else {
            if let process {
                // Ended before its test let go of it, and not through stop or
                // kill9: say how, so a client's "connection closed" in the
                // test's failure can be told from a crash.
                let how = process.terminationReason == .uncaughtSignal ? "signal \(process.terminationStatus)" : "status \(process.terminationStatus)"
                let log = (try? String(contentsOfFile: stderrPath, encoding: .utf8)) ?? ""
                print("threadwire-server pid \(process.processIdentifier) (\(dataDir)) had ended by itself (\(how)); its stderr ends: \(log.suffix(1000))")
            }
            try? FileManager.default.removeItem(atPath: dataDir)
            return
        }
        process.terminate()
        Thread.detachNewThread {
            let deadline = Date().addingTimeInterval(10)
            while process.isRunning && Date() < deadline { usleep(10_000) }
            if process.isRunning { kill(process.processIdentifier, SIGKILL) }
            try? FileManager.default.removeItem(atPath: dataDir)
        }
    }
}

public enum ServerProcessError: Error {
    /// The server stopped before it printed that it listens: its exit status and the end of its standard error.
    case exitedEarly(status: Int32, stderr: String)
    case unexpectedOutput(String)
}
