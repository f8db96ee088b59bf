import Foundation
import Testing
import ThreadwireCore
@testable import ThreadwireServerCommand

/// Every flag of threadwire-server also as a THREADWIRE_* variable and a
/// config file key, with one precedence (flag, variable, file, default):
/// one case per flag, read from the command's own declarations.
@Suite("flags, variables and config file keys")
struct SettingSourcesTests {
    @Test("a reload names the file's changed keys that only a restart puts in force: not live keys, not unchanged ones, lists as one key, null as absent")
    func restartOnlyChanges() {
        let started: [String: Any] = ["server": ["listen": "127.0.0.1:1", "log_level": "info"],
                                      "limits": ["max_connections": 10, "request_burst": 5],
                                      "models": [["name": "a"]], "default_model": NSNull()]
        let changes = { (before: [String: Any], after: [String: Any]) in
            ConfigReload.restartOnlyChanges(from: ConfigReload.flattened(before), to: ConfigReload.flattened(after))
        }
        #expect(changes(started, started).isEmpty)
        let now: [String: Any] = ["server": ["listen": "127.0.0.1:1", "log_level": "debug", "data_dir": "/d"],
                                  "limits": ["max_connections": 11, "request_burst": 6],
                                  "models": [["name": "b"]]]
        #expect(changes(started, now) == ["limits.max_connections", "models", "server.data_dir"])
        #expect(changes(now, [:]) == ["limits.max_connections", "models", "server.data_dir", "server.listen"])
    }

    @Test("the keys a reload puts in force are the command's own: each a config key whose flag is the one its precedence checks")
    func liveKeysAreSettings() {
        #expect(ConfigReload.liveKeys.count == 1 + PrincipalLimits.settings.count)
        for setting in PrincipalLimits.settings {
            let entry = SettingSources.entries.first { $0.fileKey == "limits." + setting.key }
            #expect(entry?.flag == setting.flag, "limits.\(setting.key)")
        }
        #expect(SettingSources.entries.contains { $0.fileKey == "server.log_level" })
    }

    @Test("a reload takes each limit from the file unless a flag or a variable set it, which keeps its value")
    func reloadedLimitsKeepFlags() throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("reload-\(UUID()).json").path
        defer { try? FileManager.default.removeItem(atPath: path) }
        try Data(#"{"limits": {"max_running_turns": 3, "max_requests_per_second": 40, "request_burst": 80, "max_stored_bytes": 1000}}"#.utf8)
            .write(to: URL(fileURLWithPath: path))
        let flags = PrincipalLimits(maxThreadsStartedPerMinute: 7, maxRunningTurns: 9, maxRequestsPerSecond: 5, requestBurst: 6, maxStoredBytes: 50)
        let fromFile = try ServerCommand.reloadedPrincipalLimits(from: path, flags: flags, multiPrincipal: false, arguments: [], environment: [:])
        #expect(fromFile == PrincipalLimits(maxRunningTurns: 3, maxRequestsPerSecond: 40, requestBurst: 80, maxStoredBytes: 1000))
        let fixed = try ServerCommand.reloadedPrincipalLimits(
            from: path, flags: flags, multiPrincipal: false,
            arguments: ["threadwire-server", "--max-running-turns", "9", "--request-burst=6"],
            environment: ["THREADWIRE_MAX_STORED_BYTES": "50", "THREADWIRE_MAX_THREADS_STARTED_PER_MINUTE": "7"])
        #expect(fixed == PrincipalLimits(maxThreadsStartedPerMinute: 7, maxRunningTurns: 9, maxRequestsPerSecond: 40, requestBurst: 6, maxStoredBytes: 50))
    }

    @Test("the list covers the command's flags, each named after its long name")
    func covers() {
        let flags = SettingSources.entries.map(\.flag)
        #expect(flags.count >= 40)
        for expected in ["--listen", "--data-dir", "--config", "--grpc-listen", "--web-allowed-origin", "--allow-unauthenticated", "--log-level"] {
            #expect(flags.contains(expected), "\(expected)")
        }
        #expect(!flags.contains("--print-config") && !flags.contains("--print-environment"), "actions are not settings")
        let dataDir = SettingSources.entries.first { $0.flag == "--data-dir" }
        #expect(dataDir?.variable == "THREADWIRE_DATA_DIR" && dataDir?.fileKey == "server.data_dir")
        #expect(SettingSources.entries.first { $0.flag == "--max-frame-bytes" }?.fileKey == "limits.max_frame_bytes")
        #expect(SettingSources.entries.first { $0.flag == "--config" }?.fileKey == nil)
        #expect(SettingSources.entries.first { $0.flag == "--web-allowed-origin" }?.kind == .repeated)
        #expect(SettingSources.entries.first { $0.flag == "--allow-unauthenticated" }?.kind == .flag)
        #expect(SettingSources.entries.first { $0.flag == "--lease-seconds" }?.valueType == .number)
        #expect(SettingSources.entries.first { $0.flag == "--max-stored-bytes" }?.valueType == .integer)
    }

    /// A value each option takes, as the variable writes it and as JSON.
    static func sample(_ entry: SettingSources.Entry) -> (text: String, json: String) {
        switch entry.valueType {
        case .integer: return ("7", "7")
        case .number: return ("7.5", "7.5")
        case .boolean: return ("true", "true")
        case .strings: return ("http://a.example, http://b.example", #"["http://a.example", "http://b.example"]"#)
        case .string:
            let text = ["--listen", "--peer-listen", "--advertise", "--admin-listen", "--grpc-listen", "--web-listen"].contains(entry.flag) ? "127.0.0.1:9"
                : entry.flag == "--log-level" ? "debug" : entry.flag == "--tls-client-principal" ? "cn" : entry.flag == "--log-format" ? "json" : "v1"
            return (text, "\"\(text)\"")
        }
    }

    static func expected(_ entry: SettingSources.Entry, _ text: String) -> [String] {
        switch entry.kind {
        case .value: [entry.flag, text]
        case .repeated: text.split(separator: ",").flatMap { [entry.flag, $0.trimmingCharacters(in: .whitespaces)] }
        case .flag: [entry.flag]
        }
    }

    @Test("each variable stands for its flag when the flag is not given, and the flag wins when it is",
          arguments: SettingSources.entries)
    func eachVariable(_ entry: SettingSources.Entry) async throws {
        var (text, _) = Self.sample(entry)
        if entry.flag == "--config" { text = try Self.write("{}") }
        #expect(try await SettingSources.arguments([], environment: [entry.variable: text]) == Self.expected(entry, text))
        switch entry.kind {
        case .value:
            // A given --config must name a file that exists: the file is read.
            let given = entry.flag == "--config" ? try Self.write("{}") : "given"
            #expect(try await SettingSources.arguments([entry.flag, given], environment: [entry.variable: text]) == [entry.flag, given])
            #expect(try await SettingSources.arguments(["\(entry.flag)=\(given)"], environment: [entry.variable: text]) == ["\(entry.flag)=\(given)"])
        case .repeated:
            #expect(try await SettingSources.arguments([entry.flag, "c"], environment: [entry.variable: "a"]) == [entry.flag, "c"])
        case .flag:
            #expect(try await SettingSources.arguments([], environment: [entry.variable: "0"]) == [])
            #expect(try await SettingSources.arguments([], environment: [entry.variable: "no"]) == [])
            await #expect(throws: SettingSources.SourceError.self) { try await SettingSources.arguments([], environment: [entry.variable: "maybe"]) }
        }
        // Parsed by the command itself: the variable reaches the option.
        if entry.kind == .value {
            let parsed = try ServerCommand.parse(try await SettingSources.arguments([], environment: [entry.variable: text]))
            let label = "_" + entry.flag.dropFirst(2).split(separator: "-").enumerated()
                .map { $0.offset == 0 ? String($0.element) : $0.element.capitalized }.joined()
            let value = Mirror(reflecting: parsed).children.first { $0.label == label }.flatMap { ServerCommand.parsedValue($0.value) }
            #expect(value.map { "\($0)" } == text, "\(entry.variable)=\(text) parsed into \(entry.flag)")
        }
    }

    @Test("each config file key stands for its flag, below its variable and the flag",
          arguments: SettingSources.entries.filter { $0.fileKey != nil })
    func eachFileKey(_ entry: SettingSources.Entry) async throws {
        let (text, json) = Self.sample(entry)
        let parts = entry.fileKey!.split(separator: ".")
        let file = try Self.write("{\"\(parts[0])\": {\"\(parts[1])\": \(json)}}")
        defer { try? FileManager.default.removeItem(atPath: file) }
        let config = ["--config", file]
        #expect(try await SettingSources.arguments(config, environment: [:]) == config + Self.expected(entry, text),
                "\(entry.fileKey!) in the file stands for \(entry.flag)")
        switch entry.kind {
        case .value:
            let other = entry.valueType == .integer ? "8" : entry.valueType == .number ? "8.5" : text
            #expect(try await SettingSources.arguments(config, environment: [entry.variable: other]) == config + [entry.flag, other],
                    "\(entry.variable) wins over the file")
            #expect(try await SettingSources.arguments(config + [entry.flag, "given"], environment: [:]) == config + [entry.flag, "given"],
                    "the flag wins over the file")
        case .flag:
            #expect(try await SettingSources.arguments(config, environment: [entry.variable: "false"]) == config, "the variable wins")
        case .repeated:
            #expect(try await SettingSources.arguments(config, environment: [entry.variable: "c"]) == config + [entry.flag, "c"])
        }
    }

    @Test("a full config file (lists of models and providers, MCP servers) gives its server keys too")
    func fullFile() async throws {
        let file = try Self.write(#"""
            {"server": {"listen": "127.0.0.1:9", "lease_seconds": 3, "web_allowed_origin": ["http://a.example"]},
             "model_providers": [{"name": "p", "base_url": "http://127.0.0.1:1/v1"}],
             "models": [{"slug": "m", "provider": "p", "reasoning_efforts": ["low"]}],
             "mcp_servers": {"time": {"command": "mcp-server-time", "args": ["--x"]}}}
            """#)
        defer { try? FileManager.default.removeItem(atPath: file) }
        let arguments = try await SettingSources.arguments(["--config", file], environment: [:])
        #expect(arguments == ["--config", file, "--listen", "127.0.0.1:9", "--lease-seconds", "3.0", "--web-allowed-origin", "http://a.example"])
    }

    @Test("a bad value is refused naming where it came from and what it takes")
    func badValues() async throws {
        await #expect { try await SettingSources.arguments([], environment: ["THREADWIRE_MAX_FRAME_BYTES": "lots"]) } throws: {
            "\($0)" == "THREADWIRE_MAX_FRAME_BYTES must be an integer, got 'lots'"
        }
        let file = try Self.write(#"{"server": {"log_level": "bogus", "lease_seconds": "long"}}"#)
        defer { try? FileManager.default.removeItem(atPath: file) }
        await #expect { try await SettingSources.arguments(["--config", file], environment: [:]) } throws: {
            "\($0)".contains("server.lease_seconds must be a number, got 'long'")
        }
        let level = try Self.write(#"{"server": {"log_level": "bogus"}}"#)
        defer { try? FileManager.default.removeItem(atPath: level) }
        await #expect { try await SettingSources.arguments(["--config", level], environment: [:]) } throws: {
            let text = "\($0)"
            return text.contains("config file \(level): server.log_level") && text.contains("'bogus'") && text.contains("trace, debug, info")
        }
        let misspelled = try Self.write(#"{"server": {"lisen": "127.0.0.1:1"}}"#)
        defer { try? FileManager.default.removeItem(atPath: misspelled) }
        await #expect { try await SettingSources.arguments(["--config", misspelled], environment: [:]) } throws: {
            "\($0)".contains("unknown key 'server.lisen'")
        }
        let broken = try Self.write("{\n  \"server\": {\n    \"listen\": ,\n  }\n}")
        defer { try? FileManager.default.removeItem(atPath: broken) }
        await #expect { try await SettingSources.arguments(["--config", broken], environment: [:]) } throws: {
            "\($0)".contains("is not JSON: line 3, column 15")
        }
    }

    @Test("the documentation lists every variable and key (docs/configuration.md)")
    func documented() throws {
        let docs = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("docs/configuration.md")
        let text = try String(contentsOf: docs, encoding: .utf8)
        for entry in SettingSources.entries {
            #expect(text.contains("`\(entry.variable)`"), "\(entry.variable) is not in docs/configuration.md")
        }
        #expect(text.contains(SettingSources.markdownTable()), "the table is as `threadwire-server --print-environment` prints it now")
    }

    static func write(_ text: String) throws -> String {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("tw-config-\(UUID().uuidString).json").path
        try text.write(toFile: path, atomically: true, encoding: .utf8)
        return path
    }
}
