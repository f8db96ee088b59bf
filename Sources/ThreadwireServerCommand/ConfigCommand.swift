public import ArgumentParser
import Foundation
public import Logging
import ThreadwireCore
import ThreadwireServer
import ThreadwireTransport

extension Logger.Level: @retroactive ExpressibleByArgument {}

/// `threadwire-server config check FILE`: what the server would refuse at
/// start, found before a deploy.
public struct ConfigCommand: AsyncParsableCommand {
    public init() {}
    public static let configuration = CommandConfiguration(
        commandName: "config", abstract: "Work with config files.", subcommands: [Check.self])

    public struct Check: AsyncParsableCommand {
        public init() {}
        public static let configuration = CommandConfiguration(
            abstract: "Check a config file: JSON, known keys, and every value as the server reads it at start (the store is not contacted).",
            discussion: "Exits 0 and prints 'FILE: valid' when it is; otherwise exits 78 (EX_CONFIG) naming the key and what it takes.")

        @Argument(help: "The config file.")
        var file: String

        @Flag(help: "Also resolve the THREADWIRE_* variables of this environment over the file, as a start here would.")
        var withEnvironment = false

        public func run() async throws {
            do {
                let arguments = try await SettingSources.arguments(
                    ["--config", file], environment: withEnvironment ? ProcessInfo.processInfo.environment : [:])
                let command = try ServerCommand.parse(arguments)
                _ = try command.resolvedSettings()
            } catch {
                FileHandle.standardError.write(Data("\(file): \(ServerCommand.message(for: error))\n".utf8))
                throw ExitCode(78)
            }
            print("\(file): valid")
        }
    }
}

extension ServerCommand {
    /// What --print-config shows and `config check` validates: the file
    /// read, the flags laid over it.
    struct Resolved {
        var file: ConfigFile.Loaded
        var limits: ServerLimits
    }

    func resolvedSettings() throws -> Resolved {
        let file = try config.map(ConfigFile.load) ?? ConfigFile.Loaded()
        _ = try Self.hostPort(listen, flag: "--listen")
        for (flag, address) in [("--admin-listen", adminListen), ("--grpc-listen", grpcListen), ("--web-listen", webListen),
                                ("--peer-listen", peerListen), ("--advertise", advertise)] {
            if let address { _ = try Self.hostPort(address, flag: flag) }
        }
        if let tlsClientPrincipal, ClientCertificate.PrincipalSource(rawValue: tlsClientPrincipal) == nil {
            throw ValidationError("--tls-client-principal must be one of cn, uri, spiffe, dns; got '\(tlsClientPrincipal)'")
        }
        return Resolved(file: file, limits: try limits(over: file.limits))
    }

    /// The effective configuration as a config file: every flag's key with
    /// its value (null: not set, the server decides), the limits with their
    /// defaults, the thread defaults, and the file's other sections.
    func effectiveConfigurationJSON() throws -> String {
        let resolved = try resolvedSettings()
        var server: [String: Any] = [:]
        var limits: [String: Any] = [:]
        let defaults = Dictionary(uniqueKeysWithValues: Mirror(reflecting: resolved.limits).children.compactMap { child in
            child.label.map { (SettingSources.kebab($0).replacingOccurrences(of: "-", with: "_"), child.value) }
        })
        let values = Dictionary(uniqueKeysWithValues: Mirror(reflecting: self).children.compactMap { child in
            child.label.map { ($0, Self.parsedValue(child.value)) }
        })
        for entry in SettingSources.entries {
            guard let key = entry.fileKey else { continue }
            let name = String(key.split(separator: ".").last!)
            let label = "_" + entry.flag.dropFirst(2).split(separator: "-").enumerated()
                .map { $0.offset == 0 ? String($0.element) : $0.element.capitalized }.joined()
            var value: Any = values[label].flatMap { $0 } ?? NSNull()
            if key.hasPrefix("limits.") {
                if value is NSNull, let fallback = defaults[name] { value = fallback }
                limits[name] = value
                continue
            }
            if SettingSources.isSecret(entry.variable), !(value is NSNull) { value = "<redacted>" }
            if name == "store", let url = value as? String { value = Self.redactedURL(url) }
            server[name] = value
        }
        let principal = resolved.file.settings.principalLimits
        for (name, value) in [("max_threads_started_per_minute", principal.maxThreadsStartedPerMinute), ("max_running_turns", principal.maxRunningTurns),
                              ("max_requests_per_second", principal.maxRequestsPerSecond), ("request_burst", principal.requestBurst)]
            where limits[name] is NSNull || limits[name] == nil {
            limits[name] = value ?? NSNull()
        }
        if limits["max_stored_bytes"] is NSNull, let stored = principal.maxStoredBytes { limits["max_stored_bytes"] = stored }
        let thread = resolved.file.settings.threadDefaults
        let settings = resolved.file.settings
        var out: [String: Any] = [
            "server": server,
            "limits": limits,
            "features": ["multi_agent": thread.flags.multiAgent, "multi_agent_v2": thread.flags.multiAgentV2,
                         "multi_agent_mode": thread.flags.multiAgentMode],
            "agents": ["max_threads": thread.maxThreads, "max_depth": thread.maxDepth,
                       "wait_default_ms": settings.agentWaitDefaultMs, "wait_max_ms": settings.agentWaitMaxMs],
            "multi_agent_v2": ["max_concurrent_threads_per_session": thread.maxConcurrentThreadsPerSession,
                               "usage_hint_enabled": thread.usageHintEnabled],
            "tools": ["client_request_timeout_ms": thread.clientRequestTimeoutMs],
            "default_model": settings.defaultModel,
            "default_multi_agent_mode": settings.defaultMultiAgentMode?.rawValue ?? NSNull(),
        ]
        // The sections printed as the file gives them (MCP servers' environments redacted).
        if let config, let object = try? ConfigFile.checkedObject(config) {
            for key in ["base_instructions", "model_providers", "models", "compaction", "events", "tracing"] {
                if let value = object[key] { out[key] = value }
            }
            if var servers = object["mcp_servers"] as? [String: Any] {
                for (name, server) in servers {
                    guard var server = server as? [String: Any], let env = server["env"] as? [String: Any] else { continue }
                    server["env"] = env.mapValues { _ in "<redacted>" }
                    servers[name] = server
                }
                out["mcp_servers"] = servers
            }
        }
        let data = try JSONSerialization.data(withJSONObject: out, options: [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes])
        return String(decoding: data, as: UTF8.self)
    }

    /// An ArgumentParser property wrapper's parsed value, as JSON can hold it.
    static func parsedValue(_ wrapper: Any) -> Any? {
        guard let parsed = Mirror(reflecting: wrapper).descendant("_parsedValue"),
              let value = Mirror(reflecting: parsed).children.first(where: { $0.label == "value" })?.value else { return nil }
        return jsonValue(value)
    }

    static func jsonValue(_ value: Any) -> Any? {
        let mirror = Mirror(reflecting: value)
        if mirror.displayStyle == .optional { return mirror.children.first.flatMap { jsonValue($0.value) } }
        switch value {
        case let v as Bool: return v
        case let v as Int: return v
        case let v as Int64: return v
        case let v as Double: return v
        case let v as String: return v
        case let v as [String]: return v
        case let v as any RawRepresentable: return "\(v.rawValue)"
        default: return "\(value)"
        }
    }

    /// A store URL with its password replaced.
    static func redactedURL(_ url: String) -> String {
        guard var parts = URLComponents(string: url), parts.password != nil else { return url }
        parts.password = "redacted"
        return parts.string ?? url
    }
}
