/// Tool servers the operator configured (MCP), one process each, shared by
/// every thread of the instance. The engine offers their tools to the
/// threads that chose them and runs the model's calls through them.
public protocol ToolServerHost: Sendable {
    /// Every configured server, by name.
    var serverNames: [String] { get }
    /// The servers a thread gets when thread/start names none.
    var defaultServers: [String] { get }
    /// The tools `servers` offer to `principal`'s threads (as last listed; a
    /// server that is down offers what it listed before it went down, so the
    /// model can still be told it failed). A server run once per principal
    /// is started for `principal` here if it is not running, and waited for
    /// up to its start-up timeout.
    func tools(of servers: [String], principal: Principal) async -> [HostedTool]
    /// The tool the model calls by `name` (mcp__SERVER__TOOL).
    func resolve(_ name: String, principal: Principal) -> HostedTool?
    /// One call by a thread of `principal`, with the server's timeout. Never
    /// throws: a dead or failing server is an error output the model reads.
    func call(_ tool: HostedTool, arguments: String, principal: Principal) async -> HostedToolOutput
    /// The state of each server `principal` may use, for mcp_server/list
    /// (its own process of a server run per principal).
    func statuses(principal: Principal) -> [ToolServerStatus]
    /// Whether `principal`'s threads may use `server` (the operator may
    /// list the principals a server is for; by default, every one).
    func allows(_ server: String, principal: Principal) -> Bool
}

/// A tool of a tool server as the model is offered it.
public struct HostedTool: Sendable, Equatable {
    /// name mcp__SERVER__TOOL, the server's description and input schema;
    /// `requiresApproval` when the server is configured so.
    public var spec: ToolSpec
    public var server: String
    /// The server's own name of the tool.
    public var tool: String
    public init(spec: ToolSpec, server: String, tool: String) {
        self.spec = spec
        self.server = server
        self.tool = tool
    }

    public static let prefix = "mcp__"
    public static func modelName(server: String, tool: String) -> String { "\(prefix)\(server)__\(tool)" }

    /// The hosted tool an offered spec names (server names hold no "__").
    public init?(offered spec: ToolSpec) {
        guard spec.name.hasPrefix(Self.prefix) else { return nil }
        let rest = spec.name.dropFirst(Self.prefix.count)
        guard let separator = rest.range(of: "__") else { return nil }
        self.init(spec: spec, server: String(rest[..<separator.lowerBound]), tool: String(rest[separator.upperBound...]))
    }
}

public struct HostedToolOutput: Sendable, Equatable {
    public var text: String
    public var isError: Bool
    public init(text: String, isError: Bool) {
        self.text = text
        self.isError = isError
    }
}

public struct ToolServerStatus: Sendable, Equatable {
    public enum State: String, Sendable { case starting, ready, restarting, stopped }
    public var name: String
    public var state: State
    public var pid: Int32?
    public var restarts: Int
    public var lastError: String?
    public var tools: [ToolSpec]
    public var requireApproval: Bool
    public init(name: String, state: State, pid: Int32?, restarts: Int, lastError: String?, tools: [ToolSpec], requireApproval: Bool) {
        self.name = name
        self.state = state
        self.pid = pid
        self.restarts = restarts
        self.lastError = lastError
        self.tools = tools
        self.requireApproval = requireApproval
    }
}
