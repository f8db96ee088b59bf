import Foundation
import ThreadwireCore
import ThreadwireMCP
import ThreadwireModels
import ThreadwireServer
import ThreadwireWire

/// The server's JSON config file. Every key is optional:
///
///     {
///       "default_model": "echo-1",
///       "base_instructions": "...",
///       "default_multi_agent_mode": "proactive",
///       "features": {"multi_agent": true, "multi_agent_v2": false, "multi_agent_mode": false},
///       "agents": {"max_threads": 6, "max_depth": 1, "wait_default_ms": 30000, "wait_max_ms": 300000},
///       "multi_agent_v2": {"max_concurrent_threads_per_session": 4, "usage_hint_enabled": true},
///       "model_providers": [{"name": "openai", "base_url": "https://api.openai.com/v1", "api_key_env": "OPENAI_API_KEY",
///                            "wire_api": "chat" (or "responses"), "request_timeout_ms": 120000, "stream_idle_timeout_ms": 60000,
///                            "max_retries": 3, "retry_base_delay_ms": 500}],
///       "models": [{"slug": "gpt-x", "provider": "openai", "multi_agent_version": "v2", "context_window": 128000,
///                   "reasoning_efforts": ["low", "medium", "high"]}],
///       "limits": {"max_frame_bytes": 4194304, "max_queued_requests": 1024, "max_queued_request_bytes": 8388608,
///                  "outbound_high_water_bytes": 1048576, "max_notification_backlog_bytes": 8388608,
///                  "max_connections": 4096, "idle_timeout_ms": 300000, "tcp_keepalive_ms": 60000, "max_partial_frame_bytes": 67108864,
///                  "handshake_timeout_ms": 10000, "max_threads_started_per_minute": 600, "max_running_turns": 64,
///                  "max_requests_per_second": 1000, "request_burst": 2000, "max_stored_bytes": 10737418240},
///       "tools": {"client_request_timeout_ms": 600000},
///       "compaction": {"auto": true, "threshold": 0.9, "prompt": "...", "summary_prefix": "..."},
///       "events": {"keep_count": 10000, "keep_age_ms": 86400000, "trim_interval_ms": 60000},
///       "tracing": {"enabled": true, "endpoint": "http://collector:4318/v1/traces", "sample_ratio": 1.0,
///                   "service_name": "threadwire"},
///       "mcp_servers": {"time": {"command": "mcp-server-time", "args": [], "env": {}, "cwd": "/srv",
///                                "startup_timeout_ms": 10000, "tool_timeout_ms": 60000,
///                                "enabled_tools": ["get_current_time"], "require_approval": false, "default": true,
///                                "principals": ["alice"], "per_principal": false, "idle_stop_ms": 600000}}
///     }
///
/// A key it does not know (a misspelling, a setting of a newer version) stops
/// startup with the key and the file named: a setting silently ignored is
/// worse than a server that does not start.
enum ConfigFile {
    struct Loaded {
        var settings = ServerSettings()
        var limits = ServerLimits()
        /// Model slug → its provider; models not listed use the embedded scripted backend.
        var modelProviders: [String: ModelProviderConfig] = [:]
        /// One process each, shared by every thread.
        var mcpServers: [MCPServerConfig] = []
        /// OpenTelemetry traces; the OTEL_* environment variables override it.
        var tracing = TracingConfig()
    }

    struct File: Decodable {
        struct Features: Decodable { var multi_agent: Bool?; var multi_agent_v2: Bool?; var multi_agent_mode: Bool? }
        struct Agents: Decodable { var max_threads: Int?; var max_depth: Int?; var wait_default_ms: Int?; var wait_max_ms: Int? }
        struct V2: Decodable { var max_concurrent_threads_per_session: Int?; var usage_hint_enabled: Bool? }
        struct Tools: Decodable { var client_request_timeout_ms: Int? }
        struct Compaction: Decodable { var auto: Bool?; var threshold: Double?; var prompt: String?; var summary_prefix: String? }
        struct Events: Decodable { var keep_count: Int64?; var keep_age_ms: Int64?; var trim_interval_ms: Int64? }
        struct Tracing: Decodable { var enabled: Bool?; var endpoint: String?; var sample_ratio: Double?; var service_name: String? }
        struct MCPServer: Decodable {
            var command: String
            var args: [String]?
            var env: [String: String]?
            var cwd: String?
            var startup_timeout_ms: Int?
            var tool_timeout_ms: Int?
            var enabled_tools: [String]?
            var require_approval: Bool?
            var `default`: Bool?
            var principals: [String]?
            var per_principal: Bool?
            var idle_stop_ms: Int?
        }
        struct Model: Decodable {
            var slug: String; var provider: String?; var multi_agent_version: String?; var context_window: Int?
            var reasoning_efforts: [String]?
        }
        struct Provider: Decodable {
            var name: String
            var base_url: String
            var api_key_env: String?
            var wire_api: String?
            var request_timeout_ms: Int?
            var stream_idle_timeout_ms: Int?
            var max_retries: Int?
            var retry_base_delay_ms: Int?
        }
        var model_providers: [Provider]?
        var default_model: String?
        var base_instructions: String?
        var default_multi_agent_mode: String?
        var features: Features?
        var agents: Agents?
        var multi_agent_v2: V2?
        var models: [Model]?
        var limits: Limits?
        var tools: Tools?
        var mcp_servers: [String: MCPServer]?
        var compaction: Compaction?
        var events: Events?
        var tracing: Tracing?
    }

    /// Every key the file may hold, by the path of the object that holds it
    /// ("" for the top level; "[]" for each element of a list).
    static let knownKeys: [String: Set<String>] = [
        "": ["server", "default_model", "base_instructions", "default_multi_agent_mode", "features", "agents", "multi_agent_v2",
             "model_providers", "models", "limits", "tools", "mcp_servers", "compaction", "events", "tracing"],
        "events": ["keep_count", "keep_age_ms", "trim_interval_ms"],
        "tracing": ["enabled", "endpoint", "sample_ratio", "service_name"],
        "compaction": ["auto", "threshold", "prompt", "summary_prefix"],
        // Any server name; each server's own keys below ("env" is free-form).
        "mcp_servers": ["*"],
        "mcp_servers.*": ["command", "args", "env", "cwd", "startup_timeout_ms", "tool_timeout_ms", "enabled_tools",
                          "require_approval", "default", "principals", "per_principal", "idle_stop_ms"],
        "features": ["multi_agent", "multi_agent_v2", "multi_agent_mode"],
        "agents": ["max_threads", "max_depth", "wait_default_ms", "wait_max_ms"],
        "multi_agent_v2": ["max_concurrent_threads_per_session", "usage_hint_enabled"],
        "model_providers[]": ["name", "base_url", "api_key_env", "wire_api", "request_timeout_ms", "stream_idle_timeout_ms",
                              "max_retries", "retry_base_delay_ms"],
        "models[]": ["slug", "provider", "multi_agent_version", "context_window", "reasoning_efforts"],
        "limits": ["max_frame_bytes", "max_queued_requests", "max_queued_request_bytes", "outbound_high_water_bytes",
                   "max_notification_backlog_bytes", "max_connections", "idle_timeout_ms", "tcp_keepalive_ms", "max_partial_frame_bytes",
                   "handshake_timeout_ms", "max_threads_started_per_minute", "max_running_turns", "max_requests_per_second",
                   "request_burst", "max_stored_bytes"],
        "tools": ["client_request_timeout_ms"],
    ]

    /// The first key of the file that `knownKeys` does not list, by its path.
    static func unknownKey(in data: Data) -> String? {
        guard let top = try? JSONSerialization.jsonObject(with: data) as? [String: Any] else { return nil }
        func walk(_ object: [String: Any], _ path: String) -> String? {
            // "server" holds the flags' keys, read from the command's declarations.
            let known = path == "server" ? SettingSources.serverKeys : knownKeys[path] ?? []
            for key in object.keys.sorted() {
                let dotted = path.isEmpty ? key : "\(path).\(key)"
                if known == ["*"] {
                    // A level of names the operator chooses; what is under each is checked.
                    if let nested = object[key] as? [String: Any], let found = walk(nested, path + ".*") {
                        return found.replacingOccurrences(of: path + ".*", with: dotted)
                    }
                    continue
                }
                guard known.contains(key) else { return dotted }
                if let nested = object[key] as? [String: Any], knownKeys[dotted] != nil || dotted == "server",
                   let found = walk(nested, dotted) { return found }
                if let list = object[key] as? [Any], knownKeys[dotted + "[]"] != nil {
                    for element in list {
                        if let nested = element as? [String: Any], let found = walk(nested, dotted + "[]") { return found }
                    }
                }
            }
            return nil
        }
        return walk(top, "")
    }

    struct Limits: Decodable {
        var max_frame_bytes: Int?
        var max_queued_requests: Int?
        var max_queued_request_bytes: Int?
        var outbound_high_water_bytes: Int?
        var max_notification_backlog_bytes: Int?
        var max_connections: Int?
        var idle_timeout_ms: Int?
        var tcp_keepalive_ms: Int?
        var max_partial_frame_bytes: Int?
        var handshake_timeout_ms: Int?
        var max_threads_started_per_minute: Int?
        var max_running_turns: Int?
        var max_requests_per_second: Int?
        var request_burst: Int?
        var max_stored_bytes: Int64?
    }

    struct ConfigError: Error, CustomStringConvertible { var description: String }

    static func providers(_ file: File, path: String) throws -> [String: ModelProviderConfig] {
        var byName: [String: ModelProviderConfig] = [:]
        for entry in file.model_providers ?? [] {
            func fail(_ problem: String) -> ConfigError {
                ConfigError(description: "config file \(path): model provider '\(entry.name)': \(problem)")
            }
            guard byName[entry.name] == nil else { throw fail("named twice") }
            guard let url = URL(string: entry.base_url), ["http", "https"].contains(url.scheme ?? ""), url.host != nil else {
                throw fail("base_url must be an http:// or https:// URL, got '\(entry.base_url)'")
            }
            guard let wireAPI = WireAPI(rawValue: entry.wire_api ?? "chat") else {
                throw fail("wire_api must be \"chat\" (Chat Completions) or \"responses\" (Responses API), got '\(entry.wire_api!)'")
            }
            for (key, value) in [("request_timeout_ms", entry.request_timeout_ms), ("stream_idle_timeout_ms", entry.stream_idle_timeout_ms),
                                 ("max_retries", entry.max_retries), ("retry_base_delay_ms", entry.retry_base_delay_ms)] {
                if let value, value < 0 || (key.hasSuffix("timeout_ms") && value == 0) {
                    throw fail("\(key) must be \(key.hasSuffix("timeout_ms") ? "positive" : "zero or more"), got \(value)")
                }
            }
            var provider = ModelProviderConfig(name: entry.name, baseURL: entry.base_url, wireAPI: wireAPI, apiKeyEnv: entry.api_key_env)
            if let ms = entry.request_timeout_ms { provider.requestTimeout = .milliseconds(ms) }
            if let ms = entry.stream_idle_timeout_ms { provider.streamIdleTimeout = .milliseconds(ms) }
            if let count = entry.max_retries { provider.maxRetries = count }
            if let ms = entry.retry_base_delay_ms { provider.retryBaseDelay = .milliseconds(ms) }
            byName[entry.name] = provider
        }
        var byModel: [String: ModelProviderConfig] = [:]
        for model in file.models ?? [] {
            guard let name = model.provider else { continue }
            guard let provider = byName[name] else {
                throw ConfigError(description: "config file \(path): model '\(model.slug)' names provider '\(name)', "
                    + "which model_providers does not define")
            }
            byModel[model.slug] = provider
        }
        return byModel
    }

    /// The file's top-level object, once it is known to be JSON with only known keys.
    static func checkedObject(_ path: String) throws -> [String: Any] {
        let data = try checkedData(path)
        return (try? JSONSerialization.jsonObject(with: data) as? [String: Any]) ?? [:]
    }

    static func checkedData(_ path: String) throws -> Data {
        guard let data = FileManager.default.contents(atPath: path) else { throw ConfigError(description: "cannot read config file \(path)") }
        do {
            guard try JSONSerialization.jsonObject(with: data) is [String: Any] else {
                throw ConfigError(description: "config file \(path) must hold one JSON object")
            }
        } catch let error as ConfigError {
            throw error
        } catch {
            throw ConfigError(description: "config file \(path) is not JSON: \(JSONErrorPosition.describe(error, in: data))")
        }
        // Unknown keys first: a misspelled key often also leaves a required one missing.
        if let key = unknownKey(in: data) {
            throw ConfigError(description: "config file \(path): unknown key '\(key)' (a misspelling, or a setting this version does not have); "
                + "remove it or correct it")
        }
        return data
    }

    static func load(_ path: String) throws -> Loaded {
        let data = try checkedData(path)
        let file: File
        do { file = try JSONDecoder().decode(File.self, from: data) } catch {
            throw ConfigError(description: "config file \(path) is not valid: \(error)")
        }
        var settings = ServerSettings()
        if let model = file.default_model { settings.defaultModel = model }
        if let text = file.base_instructions { settings.baseInstructions = text }
        if let mode = file.default_multi_agent_mode {
            guard let parsed = MultiAgentMode(rawValue: mode) else {
                throw ConfigError(description: "default_multi_agent_mode must be explicitRequestOnly or proactive")
            }
            settings.defaultMultiAgentMode = parsed
        }
        var overrides: [(key: String, value: String)] = []
        if let f = file.features {
            if let v = f.multi_agent { overrides.append(("features.multi_agent", "\(v)")) }
            if let v = f.multi_agent_v2 { overrides.append(("features.multi_agent_v2", "\(v)")) }
            if let v = f.multi_agent_mode { overrides.append(("features.multi_agent_mode", "\(v)")) }
        }
        if let a = file.agents {
            if let v = a.max_threads { overrides.append(("agents.max_threads", "\(v)")) }
            if let v = a.max_depth { overrides.append(("agents.max_depth", "\(v)")) }
        }
        if let v2 = file.multi_agent_v2 {
            if let v = v2.max_concurrent_threads_per_session { overrides.append(("multi_agent_v2.max_concurrent_threads_per_session", "\(v)")) }
            if let v = v2.usage_hint_enabled { overrides.append(("multi_agent_v2.usage_hint_enabled", "\(v)")) }
        }
        if let v = file.tools?.client_request_timeout_ms { overrides.append(("tools.client_request_timeout_ms", "\(v)")) }
        do { settings.threadDefaults = try settings.threadDefaults.applying(overrides) } catch {
            throw ConfigError(description: "config file \(path): \(error)")
        }
        if let ms = file.agents?.wait_max_ms {
            guard ms >= 0 else { throw ConfigError(description: "agents.wait_max_ms must not be negative") }
            settings.agentWaitMaxMs = ms
        }
        if let ms = file.agents?.wait_default_ms {
            guard ms >= 0 else { throw ConfigError(description: "agents.wait_default_ms must not be negative") }
            settings.agentWaitDefaultMs = ms
        }
        // The default never exceeds the maximum.
        settings.agentWaitDefaultMs = min(settings.agentWaitDefaultMs, settings.agentWaitMaxMs)
        for model in file.models ?? [] where (model.context_window ?? 1) <= 0 {
            throw ConfigError(description: "config file \(path): models[] '\(model.slug)': context_window must be positive")
        }
        if let c = file.compaction {
            if let v = c.auto { settings.compaction.auto = v }
            if let v = c.threshold {
                guard v > 0, v <= 1 else {
                    throw ConfigError(description: "config file \(path): compaction.threshold must be a share of the context window, above 0 and at most 1 (got \(v))")
                }
                settings.compaction.threshold = v
            }
            if let v = c.prompt {
                guard !v.isEmpty else { throw ConfigError(description: "config file \(path): compaction.prompt must not be empty") }
                settings.compaction.prompt = v
            }
            if let v = c.summary_prefix { settings.compaction.summaryPrefix = v }
        }
        if let e = file.events {
            if let v = e.keep_count {
                guard v >= 1 else { throw ConfigError(description: "config file \(path): events.keep_count must be at least 1 (got \(v))") }
                settings.eventRetention.count = v
            }
            if let v = e.keep_age_ms {
                guard v >= 1 else { throw ConfigError(description: "config file \(path): events.keep_age_ms must be at least 1 (got \(v))") }
                settings.eventRetention.ageMillis = v
            }
            if let v = e.trim_interval_ms {
                guard v >= 10 else { throw ConfigError(description: "config file \(path): events.trim_interval_ms must be at least 10 (got \(v))") }
                settings.eventRetention.trimEvery = .milliseconds(v)
            }
        }
        var tracing = TracingConfig()
        if let t = file.tracing {
            if let v = t.enabled { tracing.enabled = v }
            if let v = t.endpoint {
                guard let url = URL(string: v), ["http", "https"].contains(url.scheme ?? ""), url.host != nil else {
                    throw ConfigError(description: "config file \(path): tracing.endpoint must be an http(s) URL of an OTLP/HTTP receiver (got '\(v)')")
                }
                tracing.endpoint = v
            }
            if let v = t.sample_ratio {
                guard v >= 0, v <= 1 else {
                    throw ConfigError(description: "config file \(path): tracing.sample_ratio must be from 0 to 1 (got \(v))")
                }
                tracing.sampleRatio = v
            }
            if let v = t.service_name { tracing.serviceName = v }
        }
        settings.catalog = ModelCatalog(entries: (file.models ?? []).map {
            .init(slug: $0.slug, multiAgentVersion: $0.multi_agent_version, contextWindow: $0.context_window, provider: $0.provider,
                  reasoningEfforts: $0.reasoning_efforts)
        })
        var limits = ServerLimits()
        if let l = file.limits {
            if let v = l.max_frame_bytes { limits.maxFrameBytes = v }
            if let v = l.max_queued_requests { limits.maxQueuedRequests = v }
            if let v = l.max_queued_request_bytes { limits.maxQueuedRequestBytes = v }
            if let v = l.outbound_high_water_bytes { limits.outboundHighWaterBytes = v }
            if let v = l.max_notification_backlog_bytes { limits.maxNotificationBacklogBytes = v }
            if let v = l.max_connections { limits.maxConnections = v }
            if let v = l.idle_timeout_ms { limits.idleTimeoutMs = v }
            if let v = l.tcp_keepalive_ms { limits.tcpKeepaliveMs = v }
            if let v = l.max_partial_frame_bytes { limits.maxPartialFrameBytes = v }
            if let v = l.handshake_timeout_ms { limits.handshakeTimeoutMs = v }
            for (name, value) in [("max_threads_started_per_minute", l.max_threads_started_per_minute), ("max_running_turns", l.max_running_turns),
                                  ("max_requests_per_second", l.max_requests_per_second), ("request_burst", l.request_burst),
                                  ("max_stored_bytes", l.max_stored_bytes.map { Int(clamping: $0) })] {
                if let value, value < 0 { throw ConfigError(description: "config file \(path): limits.\(name) must not be negative (0: no limit)") }
            }
            if let v = l.max_threads_started_per_minute { settings.principalLimits.maxThreadsStartedPerMinute = v }
            if let v = l.max_running_turns { settings.principalLimits.maxRunningTurns = v }
            if let v = l.max_requests_per_second { settings.principalLimits.maxRequestsPerSecond = v }
            if let v = l.request_burst { settings.principalLimits.requestBurst = v }
            if let v = l.max_stored_bytes { settings.principalLimits.maxStoredBytes = v }
            do { try limits.validate() } catch { throw ConfigError(description: "config file \(path): limits.\(error)") }
        }
        return Loaded(settings: settings, limits: limits, modelProviders: try providers(file, path: path),
                      mcpServers: try mcpServers(file, path: path), tracing: tracing)
    }

    static func mcpServers(_ file: File, path: String) throws -> [MCPServerConfig] {
        try (file.mcp_servers ?? [:]).sorted { $0.key < $1.key }.map { name, server in
            let at = "config file \(path): mcp_servers.\(name)"
            guard MCPServerConfig.validName(name) else {
                throw ConfigError(description: "\(at): a server name is 1..32 letters, digits, '-' or '_' (no '__'): it becomes part of tool names mcp__\(name)__TOOL")
            }
            guard !server.command.trimmingCharacters(in: .whitespaces).isEmpty else {
                throw ConfigError(description: "\(at).command must not be empty")
            }
            var config = MCPServerConfig(name: name, command: server.command)
            config.args = server.args ?? []
            config.env = server.env ?? [:]
            config.cwd = server.cwd
            if let ms = server.startup_timeout_ms {
                guard ms > 0 else { throw ConfigError(description: "\(at).startup_timeout_ms must be positive") }
                config.startupTimeoutMs = ms
            }
            if let ms = server.tool_timeout_ms {
                guard ms > 0 else { throw ConfigError(description: "\(at).tool_timeout_ms must be positive") }
                config.toolTimeoutMs = ms
            }
            config.enabledTools = server.enabled_tools
            config.requireApproval = server.require_approval ?? false
            config.isDefault = server.default ?? true
            config.principals = server.principals.map(Set.init)
            config.perPrincipal = server.per_principal ?? false
            if let ms = server.idle_stop_ms {
                guard ms > 0 else { throw ConfigError(description: "\(at).idle_stop_ms must be positive") }
                config.idleStopMs = ms
            }
            return config
        }
    }
}
