import Foundation
public import Logging
import MCP
import Metrics
import Synchronization
import SystemPackage
public import ThreadwireCore

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// One MCP server as the operator configured it (`mcp_servers` in the
/// config file, keyed by name as codex's config is).
public struct MCPServerConfig: Sendable, Equatable {
    public var name: String
    public var command: String
    public var args: [String] = []
    public var env: [String: String] = [:]
    public var cwd: String?
    /// From start to a listed toolset (initialize + tools/list).
    public var startupTimeoutMs = 10_000
    /// One tools/call.
    public var toolTimeoutMs = 60_000
    /// nil: every tool the server lists.
    public var enabledTools: [String]?
    /// Its tools need an approval under the on_request policy.
    public var requireApproval = false
    /// A thread that names no servers at thread/start gets this one.
    public var isDefault = true
    /// The principals whose threads may use it (nil: every principal).
    public var principals: Set<String>?
    /// One process per principal that uses it (for servers that keep
    /// per-user state), started on first use and stopped after
    /// `idleStopMs` unused; `{principal}` in args, env values and cwd is
    /// replaced by the principal (`escapedPrincipal`).
    public var perPrincipal = false
    public var idleStopMs = 600_000

    public init(name: String, command: String) {
        self.name = name
        self.command = command
    }

    /// The principal as it goes into a path or an argument: letters, digits,
    /// '-' and '_' as they are, every other byte %XX (so '/', '.', ':' of a
    /// SPIFFE ID cannot climb out of a directory, and no two principals
    /// share a form).
    public static func escapedPrincipal(_ principal: String) -> String {
        var escaped = ""
        for byte in principal.utf8 {
            let scalar = Unicode.Scalar(byte)
            if byte < 0x80, scalar.properties.isAlphabetic || ("0"..."9").contains(scalar) || byte == UInt8(ascii: "-") || byte == UInt8(ascii: "_") {
                escaped.unicodeScalars.append(scalar)
            } else {
                escaped += String(format: "%%%02X", byte)
            }
        }
        return escaped
    }

    /// This server's configuration for `principal`'s own process.
    public func forPrincipal(_ principal: String) -> MCPServerConfig {
        let escaped = Self.escapedPrincipal(principal)
        func fill(_ text: String) -> String { text.replacingOccurrences(of: "{principal}", with: escaped) }
        var config = self
        config.args = args.map(fill)
        config.env = env.mapValues(fill)
        config.cwd = cwd.map(fill)
        return config
    }

    /// Names go into tool names (mcp__NAME__TOOL): letters, digits, '-', single '_'.
    public static func validName(_ name: String) -> Bool {
        !name.isEmpty && name.count <= 32 && !name.contains("__")
            && name.unicodeScalars.allSatisfy { ($0.isASCII && ($0.properties.isAlphabetic || ("0"..."9").contains($0))) || $0 == "_" || $0 == "-" }
    }
}

/// The operator's MCP servers: one process per configured server for the
/// whole instance, shared by every thread (not one per session), or, for a
/// server configured `per_principal`, one per principal that uses it.
/// Started by `run()` (a principal's on first use) and started again with
/// backoff whenever one exits.
public final class MCPToolServers: ToolServerHost {
    private let configs: [MCPServerConfig]
    private let shared: [String: MCPServerProcess]
    private let logger: Logger

    private struct Key: Hashable {
        var server: String
        var principal: Principal
    }
    private struct Own {
        var process: MCPServerProcess
        var supervisor: Task<Void, Never>
        var lastUsed: ContinuousClock.Instant
        /// Listings and calls under way: a process in use is never idle.
        var users = 0
    }
    private struct PerPrincipal {
        var running: [Key: Own] = [:]
        var stopped = false
    }
    private let perPrincipal = Mutex(PerPrincipal())

    public init(configs: [MCPServerConfig], logger: Logger) {
        self.configs = configs
        var shared: [String: MCPServerProcess] = [:]
        for config in configs where !config.perPrincipal { shared[config.name] = MCPServerProcess(config: config, logger: logger) }
        self.shared = shared
        self.logger = logger
    }

    public var isEmpty: Bool { configs.isEmpty }

    /// Supervises every shared server, and stops principals' servers left
    /// unused, until the task is cancelled (then stops them all).
    public func run() async {
        // A server that dies while we write to it must not take us with it.
        signal(SIGPIPE, SIG_IGN)
        await withTaskGroup(of: Void.self) { group in
            for process in shared.values { group.addTask { await process.supervise() } }
            group.addTask { [self] in
                while (try? await Task.sleep(for: .seconds(5))) != nil { await stopIdle(now: .now) }
            }
        }
        let supervisors = perPrincipal.withLock { state in
            state.stopped = true
            defer { state.running = [:] }
            return state.running.values.map(\.supervisor)
        }
        for supervisor in supervisors { supervisor.cancel() }
        for supervisor in supervisors { await supervisor.value }
    }

    private func stopIdle(now: ContinuousClock.Instant) async {
        let idle = perPrincipal.withLock { state -> [Task<Void, Never>] in
            var idle: [Task<Void, Never>] = []
            for (key, own) in state.running where own.users == 0 && now - own.lastUsed > .milliseconds(own.process.config.idleStopMs) {
                idle.append(own.supervisor)
                state.running[key] = nil
            }
            return idle
        }
        for supervisor in idle { supervisor.cancel() }
        for supervisor in idle { await supervisor.value }
    }

    /// The process serving `server` to `principal`: the shared one, or the
    /// principal's own (with `start`, a use: started now if it is not
    /// running). nil: not configured, or not running and not `start`.
    private func process(_ server: String, for principal: Principal, start: Bool = true, counting users: Int = 0) -> MCPServerProcess? {
        if let process = shared[server] { return process }
        guard let config = configs.first(where: { $0.name == server && $0.perPrincipal }) else { return nil }
        return perPrincipal.withLock { state -> MCPServerProcess? in
            let key = Key(server: server, principal: principal)
            if var own = state.running[key] {
                // Looking (mcp_server/list) keeps nothing running.
                if start {
                    own.lastUsed = .now
                    own.users += users
                    state.running[key] = own
                }
                return own.process
            }
            guard start, !state.stopped else { return nil }
            var own = config.forPrincipal(principal)
            own.perPrincipal = false
            var processLogger = logger
            processLogger[metadataKey: "tw.principal"] = "\(principal)"
            let process = MCPServerProcess(config: own, logger: processLogger)
            state.running[key] = Own(process: process, supervisor: Task { await process.supervise() }, lastUsed: .now,
                                     users: max(0, users))
            return process
        }
    }

    /// Runs `body` with the process serving `server` to `principal` (nil:
    /// not configured), counted as in use meanwhile and used at its end.
    private func using<T>(_ server: String, for principal: Principal, _ body: (MCPServerProcess?) async -> T) async -> T {
        let process = process(server, for: principal, counting: 1)
        defer {
            perPrincipal.withLock { state in
                let key = Key(server: server, principal: principal)
                guard var own = state.running[key], own.process === process else { return }
                own.users -= 1
                own.lastUsed = .now
                state.running[key] = own
            }
        }
        return await body(process)
    }

    /// Waits until every shared server listed its tools once or `timeout` passed.
    public func waitUntilReady(timeout: Duration) async {
        let deadline = ContinuousClock.now + timeout
        while ContinuousClock.now < deadline, shared.values.contains(where: { $0.status().state != .ready }) {
            try? await Task.sleep(for: .milliseconds(20))
        }
    }

    public var serverNames: [String] { configs.map(\.name) }
    public var defaultServers: [String] { configs.filter(\.isDefault).map(\.name) }

    public func tools(of servers: [String], principal: Principal) async -> [HostedTool] {
        var tools: [HostedTool] = []
        for server in servers {
            tools += await using(server, for: principal) { process in
                guard let process else { return [] }
                await Self.started(process)
                return process.tools()
            }
        }
        return tools
    }

    public func resolve(_ name: String, principal: Principal) -> HostedTool? {
        for config in configs {
            if let tool = process(config.name, for: principal, start: false)?.tools().first(where: { $0.spec.name == name }) { return tool }
        }
        return nil
    }

    public func call(_ tool: HostedTool, arguments: String, principal: Principal) async -> HostedToolOutput {
        await using(tool.server, for: principal) { process in
            guard let process else {
                return HostedToolOutput(text: errorJSON("MCP server \(tool.server) is not configured"), isError: true)
            }
            await Self.started(process)
            return await process.call(tool, arguments: arguments)
        }
    }

    /// A principal's own process just started (first use, or again after
    /// it was stopped unused): waits for its first listing, up to its
    /// start-up timeout.
    private static func started(_ process: MCPServerProcess) async {
        let deadline = ContinuousClock.now + .milliseconds(process.config.startupTimeoutMs)
        while process.status().state == .starting, process.tools().isEmpty, ContinuousClock.now < deadline {
            guard (try? await Task.sleep(for: .milliseconds(20))) != nil else { break }
        }
    }

    public func statuses(principal: Principal) -> [ToolServerStatus] {
        configs.compactMap { config in
            if let process = process(config.name, for: principal, start: false) { return process.status() }
            guard config.perPrincipal, allows(config.name, principal: principal) else { return nil }
            // Not started for this principal yet: it starts with the first thread that uses it.
            return ToolServerStatus(name: config.name, state: .stopped, pid: nil, restarts: 0, lastError: nil, tools: [],
                                    requireApproval: config.requireApproval)
        }
    }

    public func allows(_ server: String, principal: Principal) -> Bool {
        guard let config = configs.first(where: { $0.name == server }) else { return false }
        return config.principals?.contains(principal) ?? true
    }
}

func errorJSON(_ message: String) -> String {
    let data = (try? JSONSerialization.data(withJSONObject: ["error": message], options: [.sortedKeys])) ?? Data()
    return String(decoding: data, as: UTF8.self)
}
