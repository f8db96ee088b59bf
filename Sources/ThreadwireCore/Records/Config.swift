/// Feature flags that decide a new thread's runtime (and the mode gate).
public struct FeatureFlags: Sendable, Equatable, Codable {
    /// `features.multi_agent` (Collab): stable, default on.
    public var multiAgent: Bool = true
    /// `features.multi_agent_v2`: default off.
    public var multiAgentV2: Bool = false
    /// `features.multi_agent_mode`: the mode gate, default off.
    public var multiAgentMode: Bool = false

    public init(multiAgent: Bool = true, multiAgentV2: Bool = false, multiAgentMode: Bool = false) {
        self.multiAgent = multiAgent
        self.multiAgentV2 = multiAgentV2
        self.multiAgentMode = multiAgentMode
    }
}

/// The settings of one thread that come from config: server config plus the
/// thread's own overrides. Children inherit their parent's.
public struct ThreadConfig: Sendable, Equatable {
    public var flags = FeatureFlags()
    /// `agents.max_threads`: V1's cap on concurrent child agents.
    public var maxThreads = 6
    /// `agents.max_depth`: root is 0; a child deeper than this is refused.
    public var maxDepth = 1
    /// `multi_agent_v2.max_concurrent_threads_per_session`: includes the root.
    public var maxConcurrentThreadsPerSession = 4
    /// `multi_agent_v2.usage_hint_enabled`.
    public var usageHintEnabled = true
    /// `tools.client_request_timeout_ms`: how long a turn waits for a client
    /// to answer a server request (a thread may lower the server's, never raise it).
    public var clientRequestTimeoutMs = 600_000

    public init() {}

    public static let overridableKeys = [
        "features.multi_agent", "features.multi_agent_v2", "features.multi_agent_mode",
        "agents.max_threads", "agents.max_depth",
        "multi_agent_v2.max_concurrent_threads_per_session", "multi_agent_v2.usage_hint_enabled",
        "tools.client_request_timeout_ms",
    ]

    /// How overrides relate to this config's agent limits.
    public enum Ceilings: Sendable {
        /// The server's own config file: any value in range.
        case none
        /// A client's thread/start.config: limits may be lowered, never raised.
        case enforce
        /// Overrides stored with a thread before the server lowered its limits:
        /// loading clamps them instead of making the thread unloadable.
        case clamp
    }

    /// Applies `key=value` overrides; an unknown key or bad value is an invalid argument naming it.
    public func applying(_ overrides: [(key: String, value: String)], ceilings: Ceilings = .none) throws(DomainError) -> ThreadConfig {
        var config = self
        let server = self
        for (key, value) in overrides {
            func capped(_ n: Int, ceiling: Int) throws(DomainError) -> Int {
                switch ceilings {
                case .none: return n
                case .clamp: return min(n, ceiling)
                case .enforce:
                    guard n <= ceiling else {
                        throw .invalidArgument(
                            "config '\(key)' = \(n) exceeds the server's ceiling \(ceiling); a thread may lower it, "
                                + "only the server config key '\(key)' can raise it")
                    }
                    return n
                }
            }
            func bool() throws(DomainError) -> Bool {
                switch value.lowercased() {
                case "true", "1", "on": return true
                case "false", "0", "off": return false
                default: throw .invalidArgument("config '\(key)' must be true or false, got '\(value)'")
                }
            }
            func positive() throws(DomainError) -> Int {
                guard let n = Int(value), n >= 1, n <= 1_000 else {
                    throw .invalidArgument("config '\(key)' must be an integer from 1 to 1000, got '\(value)'")
                }
                return n
            }
            switch key {
            case "features.multi_agent": config.flags.multiAgent = try bool()
            case "features.multi_agent_v2": config.flags.multiAgentV2 = try bool()
            case "features.multi_agent_mode": config.flags.multiAgentMode = try bool()
            case "agents.max_threads": config.maxThreads = try capped(try positive(), ceiling: server.maxThreads)
            case "agents.max_depth": config.maxDepth = try capped(try positive(), ceiling: server.maxDepth)
            case "multi_agent_v2.max_concurrent_threads_per_session":
                let n = try positive()
                guard n >= 2 else { throw .invalidArgument("config '\(key)' must be at least 2 (it counts the root)") }
                config.maxConcurrentThreadsPerSession = try capped(n, ceiling: server.maxConcurrentThreadsPerSession)
            case "multi_agent_v2.usage_hint_enabled": config.usageHintEnabled = try bool()
            case "tools.client_request_timeout_ms":
                guard let n = Int(value), n >= 1, n <= 86_400_000 else {
                    throw .invalidArgument("config '\(key)' must be milliseconds from 1 to 86400000, got '\(value)'")
                }
                config.clientRequestTimeoutMs = try capped(n, ceiling: server.clientRequestTimeoutMs)
            default:
                throw .invalidArgument("config key '\(key)' is not overridable; allowed: \(Self.overridableKeys.joined(separator: ", "))")
            }
        }
        return config
    }

    /// The concurrency cap on open child agents in one agent tree.
    public func childAgentCap(for runtime: MultiAgentRuntime) -> (limit: Int, name: String) {
        switch runtime {
        case .v2:
            return (maxConcurrentThreadsPerSession - 1, "multi_agent_v2.max_concurrent_threads_per_session - 1")
        case .v1, .disabled:
            return (maxThreads, "agents.max_threads")
        }
    }
}

/// The model catalog: models with an optional runtime selector.
public struct ModelCatalog: Sendable, Equatable {
    public struct Entry: Sendable, Equatable {
        public var slug: String
        /// The raw selector string; an unknown value counts as absent so newer
        /// catalogs don't break older servers.
        public var multiAgentVersion: String?
        /// Tokens the model takes in one request (models[].context_window).
        public var contextWindow: Int?
        /// The configured provider's name (nil: the embedded scripted backend).
        public var provider: String?
        /// The reasoning efforts the model takes (models[].reasoning_efforts;
        /// nil: `Reasoning.standardEfforts`).
        public var reasoningEfforts: [String]?
        public init(slug: String, multiAgentVersion: String? = nil, contextWindow: Int? = nil, provider: String? = nil,
                    reasoningEfforts: [String]? = nil) {
            self.slug = slug
            self.multiAgentVersion = multiAgentVersion
            self.contextWindow = contextWindow
            self.provider = provider
            self.reasoningEfforts = reasoningEfforts
        }
    }

    public var entries: [Entry]
    public init(entries: [Entry] = []) { self.entries = entries }

    public func reasoningEfforts(forModel model: String) -> [String] {
        entries.first(where: { $0.slug == model })?.reasoningEfforts ?? Reasoning.standardEfforts
    }

    public func contextWindow(forModel model: String) -> Int? {
        entries.first(where: { $0.slug == model })?.contextWindow
    }

    public func selector(forModel model: String) -> MultiAgentRuntime? {
        guard let raw = entries.first(where: { $0.slug == model })?.multiAgentVersion else { return nil }
        return MultiAgentRuntime(rawValue: raw)
    }
}

/// Everything the server reads from its config file.
public struct ServerSettings: Sendable, Equatable {
    public var defaultModel = "echo-1"
    public var baseInstructions = "You are a coding assistant working in a threadwire thread."
    public var threadDefaults = ThreadConfig()
    public var catalog = ModelCatalog()
    /// The selection thread/start applies when the client gives none.
    public var defaultMultiAgentMode: MultiAgentMode?
    public var rootUsageHint = "You can delegate work to sub-agents with spawn_agent and collect results with wait_agent."
    public var subagentUsageHint = "You are a sub-agent. Finish the task you were given and report back concisely."
    /// wait_agent's timeout when the model gives none, and the most it may ask for.
    public var agentWaitDefaultMs = 30_000
    public var agentWaitMaxMs = 300_000
    /// How long graceful shutdown lets running turns finish before it
    /// interrupts them (recorded like any interruption).
    public var shutdownTurnGraceMs = 5_000
    public var principalLimits = PrincipalLimits()
    public var compaction = CompactionSettings()
    public var eventRetention = EventRetention()

    public init() {}

    /// A thread's own base instructions, else the server's.
    public func baseInstructions(for record: ThreadRecord) -> String {
        record.baseInstructions ?? baseInstructions
    }
}

/// How many of a thread's events are kept for clients that resume after a
/// position, and for how long (config file `events`). The newest is always
/// kept: it holds the thread's number.
public struct EventRetention: Sendable, Equatable {
    /// A thread's newest `count` events are kept...
    public var count: Int64 = 10_000
    /// ...while younger than this.
    public var ageMillis: Int64 = 24 * 3_600_000
    /// How often what is past them is forgotten.
    public var trimEvery: Duration = .seconds(60)
    public init() {}
}

/// When and how a thread's context is compacted (config file `compaction`).
public struct CompactionSettings: Sendable, Equatable {
    /// Compact before a model request that would pass `threshold` of the
    /// model's context window (models with a configured window only).
    public var auto = true
    public var threshold = 0.9
    /// Sent as a last user item after the context; the answer is the summary.
    public var prompt = """
        You are performing a context checkpoint compaction. Write a handoff summary for another model that will \
        continue this work: what the user asked for, what has been done (files, commands, tool results that matter), \
        decisions made and why, and exactly what remains to do next. Be concise and concrete; keep identifiers, paths \
        and numbers verbatim.
        """
    /// Put before the summary in what the model is shown later.
    public var summaryPrefix = "Another model worked on this thread before and left this summary of the earlier conversation:\n"
    public init() {}
}
