public import Foundation
public import Testing
public import ThreadwireClient
public import ThreadwireWire

public struct TestTimeout: Error, CustomStringConvertible {
    public var description: String
    public init(description: String) { self.description = description }
}

/// How long a test waits for something that should happen. It guards
/// liveness, not speed (speed goals live in benchmarks): on a loaded 2-core
/// CI machine running ~30 servers at once, a turn whose reads carry
/// megabytes took over 10 s, so a tight default failed tests that were right.
public enum Patience {
    public static let standard: Duration = .seconds(30)

    /// Polls start quick and slow down to 250 ms, so a long wait does not
    /// add load of its own (each poll of a large thread is a large read).
    public static func backoff(_ attempt: Int) -> Duration {
        .milliseconds(min(250, 10 << min(attempt, 5)))
    }
}

/// Polls `body` until it returns a value; after `timeout`, throws naming `what`.
public func waitUntil<T>(_ what: String, timeout: Duration = Patience.standard, _ body: () async throws -> T?) async throws -> T {
    let deadline = ContinuousClock.now + timeout
    var attempt = 0
    while ContinuousClock.now < deadline {
        if let value = try await body() { return value }
        try await Task.sleep(for: Patience.backoff(attempt))
        attempt += 1
    }
    throw TestTimeout(description: "\(what): not within \(timeout)")
}

/// Thrown where a call answered with another result than the one the test
/// checks next: the test fails there. (A bare `return` in the guard's else
/// would end it as passed with every later check skipped.)
public struct UnexpectedResult: Error, CustomStringConvertible {
    public var expected: String
    public var description: String { "expected a \(expected) result" }
    public init(expected: String) { self.expected = expected }
}

extension Trait where Self == ConditionTrait {
    /// A test that needs root (mounts, network namespaces). CI runs as root,
    /// so under CI the test always runs and a missing privilege fails it
    /// (`requireRoot`); elsewhere it is reported as skipped, with the reason.
    public static func needsRoot(_ what: String) -> Self {
        .enabled(if: getuid() == 0 || ProcessInfo.processInfo.environment["CI"] != nil,
                 "\(what) needs root (this run is uid \(getuid()))")
    }
}

/// Inside a `.needsRoot` test: fails it when it runs without root (under CI).
public func requireRoot(_ what: String, sourceLocation: SourceLocation = #_sourceLocation) throws {
    try #require(getuid() == 0, "\(what) needs root and CI runs as root: this run is uid \(getuid())", sourceLocation: sourceLocation)
}

/// Collects a client's notifications so tests can wait for one and inspect all.
public actor Inbox {
    private var items: [Wire.Notification] = []

    public init(_ client: ThreadwireClient) {
        Task { [weak self] in
            for await notification in client.notifications { await self?.append(notification) }
        }
    }

    private func append(_ notification: Wire.Notification) { items.append(notification) }

    public var all: [Wire.Notification] { items }

    public func payloads() -> [Wire.Notification.Payload] { items.compactMap(\.payload) }

    @discardableResult
    public func waitFor(_ what: String, timeout: Duration = .seconds(60), _ predicate: (Wire.Notification.Payload) -> Bool) async throws -> Wire.Notification {
        let deadline = ContinuousClock.now + timeout
        while ContinuousClock.now < deadline {
            if let match = items.first(where: { $0.payload.map(predicate) ?? false }) { return match }
            try await Task.sleep(for: .milliseconds(10))
        }
        throw TestTimeout(description: "no notification \(what) within \(timeout)")
    }
}

extension ThreadwireClient {
    public func startThread(_ params: Wire.ThreadStartParams = .init()) async throws -> Wire.ThreadLifecycleResult {
        guard case let .threadStart(result) = try await result(.threadStart(params)) else { throw TestTimeout(description: "bad result") }
        return result
    }

    public func resume(_ id: String) async throws -> Wire.ThreadLifecycleResult {
        guard case let .threadResume(result) = try await result(.threadResume(Wire.ThreadResumeParams(threadId: id))) else {
            throw TestTimeout(description: "bad result")
        }
        return result
    }

    public func fork(_ id: String) async throws -> Wire.ThreadLifecycleResult {
        guard case let .threadFork(result) = try await result(.threadFork(Wire.ThreadForkParams(threadId: id))) else {
            throw TestTimeout(description: "bad result")
        }
        return result
    }

    public func read(_ id: String, turns: Bool = true, modelRequests: Bool = true, turnsLimit: UInt32? = nil) async throws -> Wire.ThreadReadResult {
        guard case let .threadRead(result) = try await result(.threadRead(Wire.ThreadReadParams(
            threadId: id, includeTurns: turns, includeModelRequests: modelRequests, turnsLimit: turnsLimit))) else {
            throw TestTimeout(description: "bad result")
        }
        return result
    }

    public func spawn(_ parent: String, message: String? = nil, model: String? = nil, review: Bool = false) async throws -> Wire.ThreadLifecycleResult {
        guard case let .agentSpawn(result) = try await result(.agentSpawn(Wire.AgentSpawnParams(
            parentThreadId: parent, message: message, model: model, review: review))) else { throw TestTimeout(description: "bad result") }
        return result
    }

    public func updateSettings(_ params: Wire.ThreadSettingsUpdateParams) async throws -> Wire.ThreadSettingsUpdateResult {
        guard case let .threadSettingsUpdate(result) = try await result(.threadSettingsUpdate(params)) else {
            throw TestTimeout(description: "bad result")
        }
        return result
    }

    /// Starts a turn and returns its id (the turn runs on after the response).
    public func startTurn(_ threadID: String, _ text: String, model: String? = nil,
                   mode: Wire.TurnStartParams.MultiAgentModeUpdate? = nil, approvalPolicy: Wire.ApprovalPolicy? = nil) async throws -> String {
        let params = Wire.TurnStartParams(threadId: threadID, input: [Wire.UserInput(content: .text(text))], model: model,
                                          approvalPolicy: approvalPolicy, multiAgentModeUpdate: mode)
        guard case let .turnStart(result) = try await result(.turnStart(params)), let id = result.turn?.id else {
            throw TestTimeout(description: "bad result")
        }
        return id
    }

    /// Runs a turn to its end and returns the finished turn as stored.
    @discardableResult
    public func runTurn(_ threadID: String, _ text: String, model: String? = nil,
                 mode: Wire.TurnStartParams.MultiAgentModeUpdate? = nil, timeout: Duration = Patience.standard) async throws -> Wire.Turn {
        let id = try await startTurn(threadID, text, model: model, mode: mode)
        return try await waitForTurn(threadID, id, timeout: timeout)
    }

    public func waitForTurn(_ threadID: String, _ turnID: String, timeout: Duration = Patience.standard) async throws -> Wire.Turn {
        try await waitUntil("turn \(turnID) finished", timeout: timeout) {
            try await read(threadID).thread?.turns.first { $0.id == turnID && $0.status != .inProgress }
        }
    }

    /// Polls until the predicate holds for the thread (e.g. a child's turn ended).
    public func waitForThread(_ id: String, timeout: Duration = Patience.standard, _ predicate: (Wire.Thread) -> Bool) async throws -> Wire.Thread {
        try await waitUntil("thread \(id) reached the expected state", timeout: timeout) {
            try await read(id).thread.flatMap { predicate($0) ? $0 : nil }
        }
    }
}

extension Wire.Turn {
    /// The context items of this turn's last model request.
    public var lastContext: [Wire.ContextItem] { modelRequests.last?.context ?? [] }
    public var lastTools: [String] { modelRequests.last?.tools.compactMap(\.name) ?? [] }
}

extension Array where Element == Wire.ContextItem {
    public func of(_ kind: Wire.ContextKind) -> [Wire.ContextItem] { filter { $0.kind == kind } }
}

public func modeFragments(_ context: [Wire.ContextItem]) -> [String] {
    context.of(.multiAgentMode).compactMap(\.text).map { $0.contains("proactive. Proactive") ? "proactive" : "explicitRequestOnly" }
}

/// Asserts a call fails with the status and that the message mentions `mentioning`.
public func expectStatus(_ code: UInt32, mentioning: String, _ body: () async throws -> Void, sourceLocation: SourceLocation = #_sourceLocation) async {
    do {
        try await body()
        Issue.record("expected status \(code), got OK", sourceLocation: sourceLocation)
    } catch let ClientError.status(actual, message) {
        #expect(actual == code, "message: \(message)", sourceLocation: sourceLocation)
        #expect(message.contains(mentioning), "message '\(message)' should mention '\(mentioning)'", sourceLocation: sourceLocation)
    } catch {
        Issue.record("unexpected error \(error)", sourceLocation: sourceLocation)
    }
}

/// Whether the server listening on `port` has read every byte its clients
/// sent: the receive queue of each of its established connections is empty
/// (iproute2's `ss`, the kernel's own count).
public func serverReadEverything(port: Int) async throws -> Bool {
    let (status, out, err) = try await runBinary("/usr/bin/ss", ["-tnH", "state", "established", "( sport = :\(port) )"])
    try #require(status == 0, "ss failed: \(err)")
    let queues = out.split(separator: "\n").compactMap { Int($0.split(separator: " ", omittingEmptySubsequences: true).first ?? "") }
    return !queues.isEmpty && queues.allSatisfy { $0 == 0 }
}

/// Runs the `threadwire` CLI beside the server binary, off the test
/// concurrency pool; returns its exit status and standard output.
public func runCLI(_ arguments: [String]) async throws -> (Int32, String) {
    let (status, out, _) = try await runBinary(
        ServerProcess.binary.replacingOccurrences(of: "threadwire-server", with: "threadwire"), arguments)
    return (status, out)
}

/// Polls with waitpid rather than Process.waitUntilExit, which spins a run
/// loop and has hung here when many processes run at once.
/// The exit status (-1 if Foundation reaped the child first), nil on timeout.
public func waitForExit(_ process: Process, seconds: Double) -> Int32? {
    let pid = process.processIdentifier
    let deadline = Date().addingTimeInterval(seconds)
    while Date() < deadline {
        var status: Int32 = 0
        let result = waitpid(pid, &status, WNOHANG)
        if result == pid { return (status & 0x7f) == 0 ? (status >> 8) & 0xff : 128 + (status & 0x7f) }
        // Foundation may reap the child first (then waitpid says ECHILD):
        // its status arrives through Process a moment later.
        if !process.isRunning { return process.terminationStatus }
        if result == -1 && errno == ECHILD {
            let reaped = Date().addingTimeInterval(5)
            while process.isRunning && Date() < reaped { usleep(1_000) }
            return process.isRunning ? -1 : process.terminationStatus
        }
        usleep(5_000)
    }
    return nil
}


/// Runs a program to its end off the test concurrency pool; its exit status,
/// standard output and standard error. Through files, not pipes: a process
/// spawned meanwhile by another test (a PostgreSQL daemon, a server) inherits
/// open descriptors, and a pipe it holds would never reach end of file.
/// A program still running after `timeout` is killed and the test fails
/// naming it: a hang must end as a failure, never as a suite that waits.
public func runBinary(_ path: String, _ arguments: [String], timeout: Double = 120) async throws -> (Int32, String, String) {
    try await offThread {
        let base = NSTemporaryDirectory() + "threadwire-run-" + UUID().uuidString
        let outPath = base + ".out", errPath = base + ".err"
        FileManager.default.createFile(atPath: outPath, contents: nil)
        FileManager.default.createFile(atPath: errPath, contents: nil)
        defer {
            try? FileManager.default.removeItem(atPath: outPath)
            try? FileManager.default.removeItem(atPath: errPath)
        }
        let out = try FileHandle(forWritingTo: URL(fileURLWithPath: outPath))
        let err = try FileHandle(forWritingTo: URL(fileURLWithPath: errPath))
        let process: SpawnedProcess
        do {
            process = try SpawnedProcess(executable: path, arguments: arguments,
                                         standardOutput: out.fileDescriptor, standardError: err.fileDescriptor)
        } catch {
            try? out.close()
            try? err.close()
            throw error
        }
        try? out.close()
        try? err.close()
        let status = waitForExit(process, seconds: timeout)
        let outText = (try? String(contentsOfFile: outPath, encoding: .utf8)) ?? ""
        let errText = (try? String(contentsOfFile: errPath, encoding: .utf8)) ?? ""
        guard let status else {
            kill(process.processIdentifier, SIGKILL)
            throw TestTimeout(description: "\(path) \(arguments) still running after \(Int(timeout)) s; killed. stdout: "
                              + "\(outText.suffix(500)) stderr: \(errText.suffix(500))")
        }
        return (status, outText, errText)
    }
}

public final class LockedText: @unchecked Sendable {
    private let lock = NSLock()
    private var data: Data?
    public func set(_ value: Data) { lock.withLock { data = value } }
    public var isSet: Bool { lock.withLock { data != nil } }
    public var text: String { lock.withLock { String(decoding: data ?? Data(), as: UTF8.self) } }
}

/// What every test server starts from, whether it runs as a process or in
/// this one: a fresh data directory that outlives restarts, the config file
/// in it, and the flags every test server gets.
public struct TestServerSetup: Sendable {
    public let dataDir: String
    public let hasConfig: Bool
    /// The config names its own handshake timeout (then the test is about it).
    private let configSetsHandshake: Bool
    public var configPath: String { dataDir + "/config.json" }

    public init(config: String?) throws {
        dataDir = NSTemporaryDirectory() + "threadwire-test-" + UUID().uuidString
        try FileManager.default.createDirectory(atPath: dataDir, withIntermediateDirectories: true)
        hasConfig = config != nil
        configSetsHandshake = config?.contains("handshake_timeout_ms") ?? false
        if let config { try config.write(toFile: dataDir + "/config.json", atomically: true, encoding: .utf8) }
    }

    /// The flags: the store in the data directory, errors only in the log,
    /// the config file, a short turn grace (a stop waits for it; tests about
    /// the grace set their own), a handshake timeout of two minutes, then the
    /// test's own.
    ///
    /// Why the handshake timeout: a test's client connects on a NIO thread,
    /// but sends `initialize` only once its task runs again on the test
    /// concurrency pool (one thread per core). At the start of a full run on
    /// 2 cores that pool can be busy for over 10 s (the default), and the
    /// server then rightly closes a connection that "did not initialize"
    /// (CI run of bb2ab2d: three tests failed so at the same moment). Tests
    /// about the handshake deadline set their own.
    public func arguments(_ extra: [String]) -> [String] {
        var arguments = ["--data-dir", dataDir + "/store", "--log-level", "error"]
        if hasConfig { arguments += ["--config", configPath] }
        if !extra.contains("--turn-grace-seconds") { arguments += ["--turn-grace-seconds", "0.5"] }
        if !extra.contains("--handshake-timeout-ms") && !configSetsHandshake { arguments += ["--handshake-timeout-ms", "120000"] }
        return arguments + extra
    }

    /// Writes a new config (takes effect at the next start).
    public func rewriteConfig(_ config: String) throws {
        try config.write(toFile: configPath, atomically: true, encoding: .utf8)
    }
}

/// A child process whose end is awaited by polling `isRunning`: Foundation's
/// `Process` and the harness's `SpawnedProcess`.
public protocol PolledProcess: AnyObject {
    var isRunning: Bool { get }
}

extension Process: PolledProcess {}
extension SpawnedProcess: PolledProcess {}

extension PolledProcess {
    /// Waits for the process to end by polling: Process.waitUntilExit spins
    /// a run loop and has hung the whole suite when many processes run at once.
    public func waitForExit(timeout: Double = 120) {
        let deadline = Date().addingTimeInterval(timeout)
        while isRunning && Date() < deadline { usleep(2_000) }
    }

    /// The same from a test's task: sleeps between looks instead of holding
    /// one of the few threads of the test's concurrency pool.
    public func exited(timeout: Duration = .seconds(120)) async {
        let deadline = ContinuousClock.now + timeout
        while isRunning && ContinuousClock.now < deadline { try? await Task.sleep(for: .milliseconds(2)) }
    }
}


/// Blocking work (child processes) on a thread of its own: the test
/// concurrency pool has as many threads as cores, and a blocked one starves
/// other tests.
public func offThread<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
    try await withCheckedThrowingContinuation { continuation in
        Thread.detachNewThread { continuation.resume(with: Result { try body() }) }
    }
}
