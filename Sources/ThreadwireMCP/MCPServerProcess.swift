import Foundation
import Logging
import MCP
import Metrics
import Synchronization
import ThreadwireCore

/// One configured server: its process, its MCP client, its state.
final class MCPServerProcess: Sendable {
    let config: MCPServerConfig
    private let logger: Logger

    private struct State {
        var state: ToolServerStatus.State = .starting
        var pid: Int32?
        var restarts = 0
        var lastError: String?
        /// Kept while the server restarts: a call of one fails with a clear
        /// error instead of the model being told the tool does not exist.
        var tools: [HostedTool] = []
        var client: Client?
    }
    private let state = Mutex(State())
    private let up: Gauge
    private let restartsCounter: Counter

    init(config: MCPServerConfig, logger: Logger) {
        self.config = config
        var logger = logger
        logger[metadataKey: "tw.mcp_server"] = "\(config.name)"
        self.logger = logger
        up = Gauge(label: "threadwire_mcp_server_up", dimensions: [("server", config.name)])
        restartsCounter = Counter(label: "threadwire_mcp_server_restarts_total", dimensions: [("server", config.name)])
        up.record(0)
    }

    func status() -> ToolServerStatus {
        state.withLock {
            ToolServerStatus(name: config.name, state: $0.state, pid: $0.pid, restarts: $0.restarts, lastError: $0.lastError,
                             tools: $0.tools.map(\.spec), requireApproval: config.requireApproval)
        }
    }

    func tools() -> [HostedTool] { state.withLock { $0.tools } }

    /// Starts the server, and again after every exit, with a backoff that
    /// doubles from 250 ms to 30 s and starts over after a run of a minute.
    func supervise() async {
        var delay = Duration.milliseconds(250)
        while !Task.isCancelled {
            state.withLock { $0.state = .starting }
            let started = ContinuousClock.now
            var failure: String
            do {
                failure = try await runOnce()
            } catch is CancellationError {
                break
            } catch {
                failure = "\(error)"
            }
            if Task.isCancelled { break }
            let client = state.withLock { state -> Client? in
                state.state = .restarting
                state.pid = nil
                state.restarts += 1
                state.lastError = failure
                defer { state.client = nil }
                return state.client
            }
            await client?.disconnect()
            up.record(0)
            restartsCounter.increment()
            logger.warning("MCP server stopped; starting it again", metadata: ["tw.reason": "\(failure)", "tw.backoff": "\(delay)"])
            if ContinuousClock.now - started > .seconds(60) { delay = .milliseconds(250) }
            guard (try? await Task.sleep(for: delay)) != nil else { break }
            delay = min(delay * 2, .seconds(30))
        }
        let client = state.withLock { state -> Client? in
            state.state = .stopped
            state.pid = nil
            defer { state.client = nil }
            return state.client
        }
        await client?.disconnect()
        up.record(0)
    }

    /// One life of the process: spawn, initialize, list tools, then wait for
    /// its exit. Returns why it ended; cancelled, it stops the process.
    private func runOnce() async throws -> String {
        let child = try ChildProcess.spawn(command: config.command, arguments: config.args, environment: config.env, cwd: config.cwd)
        defer { child.closePipes() }
        state.withLock { $0.pid = child.pid }
        let exited = Task { await child.waitForExit() }
        return try await withTaskCancellationHandler {
            let client = Client(name: "threadwire", version: "1.0")
            do {
                let transport = PipeTransport(input: child.fromChild, output: child.toChild, logger: logger)
                let listed = try await withDeadline(.milliseconds(config.startupTimeoutMs), what: "starting (initialize and tools/list)") {
                    _ = try await client.connect(transport: transport)
                    var tools: [Tool] = []
                    var cursor: String?
                    repeat {
                        let page = try await client.listTools(cursor: cursor)
                        tools += page.tools
                        cursor = page.nextCursor
                    } while cursor != nil && tools.count < 1000
                    return tools
                }
                let hosted = listed
                    .filter { config.enabledTools?.contains($0.name) ?? true }
                    .map { tool in
                        HostedTool(
                            spec: ToolSpec(name: HostedTool.modelName(server: config.name, tool: tool.name), namespace: "",
                                           description: tool.description ?? "", parametersSchema: Self.schemaText(tool.inputSchema),
                                           requiresApproval: config.requireApproval),
                            server: config.name, tool: tool.name)
                    }
                state.withLock {
                    $0.client = client
                    $0.tools = hosted
                    $0.state = .ready
                    $0.lastError = nil
                }
                up.record(1)
                logger.info("MCP server ready", metadata: ["tw.pid": "\(child.pid)", "tw.tools": "\(hosted.count)"])
            } catch {
                // A start that failed or hung: stop this process, and start again.
                child.terminate()
                let how = await exited.value
                Task { await client.disconnect() }
                return "\(error) (the process \(how))"
            }
            let how = await exited.value
            return "the process \(how)"
        } onCancel: {
            child.terminate()
        }
    }

    /// One tools/call with the configured timeout; every failure is an output.
    func call(_ tool: HostedTool, arguments: String) async -> HostedToolOutput {
        let (client, current) = state.withLock { ($0.client, $0.state) }
        guard let client, current == .ready else {
            let why = status().lastError.map { " (last error: \($0))" } ?? ""
            return HostedToolOutput(text: errorJSON("MCP server \(config.name) is not running: \(current.rawValue)\(why)"), isError: true)
        }
        if JSONNesting.tooDeep(arguments) {
            return HostedToolOutput(text: errorJSON("the arguments of \(tool.spec.name) nest deeper than \(JSONNesting.limit) levels"), isError: true)
        }
        let values: [String: Value]?
        do {
            values = arguments.isEmpty ? nil : try JSONDecoder().decode([String: Value].self, from: Data(arguments.utf8))
        } catch {
            return HostedToolOutput(text: errorJSON("the arguments of \(tool.spec.name) are not a JSON object"), isError: true)
        }
        do {
            let (content, isError) = try await withDeadline(.milliseconds(config.toolTimeoutMs), what: "\(tool.tool)") {
                try await client.callTool(name: tool.tool, arguments: values)
            }
            Counter(label: "threadwire_mcp_tool_calls_total", dimensions: [("server", config.name), ("outcome", isError == true ? "error" : "ok")])
                .increment()
            return HostedToolOutput(text: content.map(Self.text).joined(separator: "\n"), isError: isError ?? false)
        } catch let timeout as DeadlineExceeded {
            Counter(label: "threadwire_mcp_tool_calls_total", dimensions: [("server", config.name), ("outcome", "timeout")]).increment()
            return HostedToolOutput(text: errorJSON("MCP server \(config.name): \(timeout)"), isError: true)
        } catch {
            Counter(label: "threadwire_mcp_tool_calls_total", dimensions: [("server", config.name), ("outcome", "failed")]).increment()
            return HostedToolOutput(text: errorJSON("MCP server \(config.name) failed the call of \(tool.tool): \(error)"), isError: true)
        }
    }

    static func text(_ content: Tool.Content) -> String {
        switch content {
        case let .text(text, _, _): return text
        case let .image(_, mimeType, _, _): return "[image \(mimeType)]"
        case let .audio(_, mimeType, _, _): return "[audio \(mimeType)]"
        case let .resource(resource, _, _): return "[resource \(resource.uri)]"
        case let .resourceLink(uri, name, _, _, _, _): return "[resource link \(name): \(uri)]"
        }
    }

    static func schemaText(_ schema: Value) -> String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = .sortedKeys
        guard let data = try? encoder.encode(schema), !data.isEmpty, String(decoding: data, as: UTF8.self) != "null" else {
            return #"{"type":"object"}"#
        }
        return String(decoding: data, as: UTF8.self)
    }
}

struct DeadlineExceeded: Error, CustomStringConvertible {
    var what: String
    var after: Duration
    var description: String { "\(what) did not finish within \(after.components.seconds * 1000 + after.components.attoseconds / 1_000_000_000_000_000) ms" }
}

/// `body`, or DeadlineExceeded after `limit` (the one deadline helper,
/// Core's: it returns at the deadline even if `body` ignores its
/// cancellation, as an MCP request whose server died may never be answered).
func withDeadline<T: Sendable>(_ limit: Duration, what: String, _ body: @escaping @Sendable () async throws -> T) async throws -> T {
    try await ThreadwireCore.withDeadline(limit, timeoutError: { DeadlineExceeded(what: what, after: limit) }, body)
}
