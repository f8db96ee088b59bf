import ArgumentParser
import Configuration
import Foundation
import ThreadwireWire

/// Every flag of threadwire-server from three places, with one precedence:
/// the flag on the command line, then its `THREADWIRE_*` variable, then its
/// key in the config file, then the default.
///
///     --data-dir /srv/tw    THREADWIRE_DATA_DIR=/srv/tw    {"server": {"data_dir": "/srv/tw"}}
///     --max-frame-bytes 9   THREADWIRE_MAX_FRAME_BYTES=9   {"limits": {"max_frame_bytes": 9}}
///
/// The list is read from ServerCommand's own declarations (a new flag has
/// its variable and its key without anyone keeping a table), and the
/// variable and the file are read through swift-configuration's providers,
/// whose hierarchy is the precedence. What they resolve becomes the flags
/// not given, so ArgumentParser checks every value whichever place it came from.
public enum SettingSources {
    public enum Kind: Sendable, Equatable {
        /// An option taking one value.
        case value
        /// A repeatable option: the variable holds a comma-separated list, the file a JSON list.
        case repeated
        /// A flag: the variable true/false/yes/no/1/0, the file a JSON boolean.
        case flag
    }

    /// The JSON type a file key holds.
    public enum ValueType: String, Sendable, Equatable {
        case string, integer, number, boolean, strings = "list of strings"
    }

    public struct Entry: Sendable, Equatable, CustomStringConvertible {
        public let flag: String
        public let variable: String
        /// Dotted path in the config file; nil for --config itself.
        public let fileKey: String?
        public let kind: Kind
        public let valueType: ValueType
        public var description: String { flag }
    }

    /// Flags that act instead of serving: no variable, no key.
    static let actions: Set<String> = ["_printEnvironment", "_printConfig"]
    /// Limit flags keep the key they always had in the file's "limits" object.
    static let limitKeys: Set<String> = ConfigFile.knownKeys["limits"] ?? []

    public static let entries: [Entry] = Mirror(reflecting: ServerCommand()).children.compactMap { child in
        guard let label = child.label, label.hasPrefix("_"), !actions.contains(label) else { return nil }
        let type = String(describing: Swift.type(of: child.value))
        let kind: Kind
        if type.hasPrefix("Flag<") {
            kind = .flag
        } else if type.hasPrefix("Option<Array<") {
            kind = .repeated
        } else if type.hasPrefix("Option<") {
            kind = .value
        } else {
            return nil
        }
        let valueType: ValueType = switch kind {
        case .flag: .boolean
        case .repeated: .strings
        case .value: type.contains("Int") ? .integer : type.contains("Double") ? .number : .string
        }
        let words = kebab(String(label.dropFirst()))
        let snake = words.replacingOccurrences(of: "-", with: "_")
        let fileKey: String? = words == "config" ? nil : limitKeys.contains(snake) ? "limits." + snake : "server." + snake
        return Entry(flag: "--" + words, variable: "THREADWIRE_" + snake.uppercased(), fileKey: fileKey, kind: kind, valueType: valueType)
    }

    /// The keys of the file's "server" object.
    static var serverKeys: Set<String> {
        Set(entries.compactMap { $0.fileKey }.filter { $0.hasPrefix("server.") }.map { String($0.dropFirst("server.".count)) })
    }

    public struct SourceError: Error, CustomStringConvertible {
        public let description: String
    }

    /// `given` with the flags that only a variable or the config file sets
    /// appended. The config file is `--config` (or THREADWIRE_CONFIG).
    public static func arguments(_ given: [String], environment: [String: String]) async throws -> [String] {
        let configPath = value(of: "--config", in: given) ?? environment["THREADWIRE_CONFIG"].flatMap { $0.isEmpty ? nil : $0 }
        var fileObject: [String: Any] = [:]
        var providers: [any ConfigProvider] = [
            // Reader keys are the file's; a variable is THREADWIRE_ and the key's last part.
            EnvironmentVariablesProvider(environmentVariables: environment, secretsSpecifier: .dynamic { name, _ in isSecret(name) })
                .mapKeys { AbsoluteConfigKey(["threadwire", $0.components.last ?? ""], context: $0.context) },
        ]
        if let configPath {
            fileObject = try ConfigFile.checkedObject(configPath)
            providers.append(try fileProvider(configPath))
        }
        let reader = ConfigReader(providers: providers)
        var arguments = given
        for entry in entries {
            if given.contains(where: { $0 == entry.flag || $0.hasPrefix(entry.flag + "=") }) { continue }
            let inEnvironment = environment[entry.variable] != nil
            let inFile = entry.fileKey.map { lookup($0, in: fileObject) != nil } ?? false
            guard inEnvironment || inFile else { continue }
            let source = inEnvironment ? entry.variable : "config file \(configPath ?? ""): \(entry.fileKey ?? "")"
            guard let key = entry.fileKey ?? (inEnvironment ? "server.config" : nil) else { continue }
            let added: [String]
            do {
                added = try flagArguments(entry, reader: reader, key: ConfigKey(key))
            } catch {
                let raw = inEnvironment ? environment[entry.variable] ?? "" : entry.fileKey.flatMap { lookup($0, in: fileObject) }.map { "\($0)" } ?? ""
                throw SourceError(description: "\(source) must be \(expected(entry, fromVariable: inEnvironment)), got '\(raw.prefix(60))'")
            }
            // Each value as the command would parse it: a bad one is named by where it came from.
            if entry.kind == .value, let value = added.last {
                do { _ = try ServerCommand.parse([entry.flag, value]) } catch {
                    throw SourceError(description: "\(source): \(oneLine(ServerCommand.message(for: error)))")
                }
            }
            arguments += added
        }
        return arguments
    }

    /// The file's settings of flags as a provider. Not FileProvider<JSONSnapshot>:
    /// it refuses a whole file that holds a list of objects (models[],
    /// model_providers[]), which the rest of the file does. Each JSON value
    /// keeps its JSON type, so a string where a number belongs is refused.
    static func fileProvider(_ path: String) throws -> InMemoryProvider {
        guard let data = FileManager.default.contents(atPath: path) else { throw SourceError(description: "cannot read config file \(path)") }
        let file = try JSONValue.parse(String(decoding: data, as: UTF8.self))
        var values: [AbsoluteConfigKey: ConfigValue] = [:]
        for entry in entries {
            guard let key = entry.fileKey else { continue }
            let parts = key.split(separator: ".").map(String.init)
            guard let value = file[parts[0]]?[parts[1]] else { continue }
            let content: ConfigContent?
            switch (value, entry.valueType) {
            case let (.int(n), .number): content = .double(Double(n))
            case let (.uint(n), .number): content = .double(Double(n))
            case let (.double(n), _): content = .double(n)
            case let (.int(n), _): content = Int(exactly: n).map(ConfigContent.int)
            case let (.uint(n), _): content = Int(exactly: n).map(ConfigContent.int)
            case let (.bool(flag), _): content = .bool(flag)
            case let (.string(text), _): content = .string(text)
            case let (.array(items), _):
                let strings = items.compactMap { if case let .string(text) = $0 { text } else { nil } }
                content = strings.count == items.count ? .stringArray(strings) : nil
            case (.null, _), (.object, _): content = nil
            }
            if let content { values[AbsoluteConfigKey(parts)] = ConfigValue(content, isSecret: isSecret(entry.variable)) }
        }
        return InMemoryProvider(name: "config file \(path)", values: values)
    }

    static func flagArguments(_ entry: Entry, reader: ConfigReader, key: ConfigKey) throws -> [String] {
        let secret = isSecret(entry.variable)
        switch entry.valueType {
        case .boolean:
            return try reader.requiredBool(forKey: key) ? [entry.flag] : []
        case .strings:
            return try reader.requiredStringArray(forKey: key, isSecret: secret)
                .map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
                .flatMap { [entry.flag, $0] }
        case .integer:
            return [entry.flag, String(try reader.requiredInt(forKey: key))]
        case .number:
            return [entry.flag, String(try reader.requiredDouble(forKey: key))]
        case .string:
            return [entry.flag, try reader.requiredString(forKey: key, isSecret: secret)]
        }
    }

    /// Values that must not be printed or logged.
    static func isSecret(_ name: String) -> Bool {
        let upper = name.uppercased()
        return upper.contains("TOKEN") && !upper.hasSuffix("_FILE") || upper.contains("PASSWORD")
    }

    static func expected(_ entry: Entry, fromVariable: Bool) -> String {
        switch entry.valueType {
        case .integer: "an integer"
        case .number: "a number"
        case .string: "a string"
        case .boolean: fromVariable ? "true or false (or yes/no, 1/0)" : "true or false"
        case .strings: fromVariable ? "a comma-separated list" : "a list of strings"
        }
    }

    /// ArgumentParser's list of allowed values on one line, as a log line needs.
    static func oneLine(_ message: String) -> String {
        let lines = message.split(separator: "\n").map { $0.trimmingCharacters(in: .whitespaces) }
        let choices = lines.filter { $0.hasPrefix("- ") }.map { $0.dropFirst(2) }
        let text = lines.filter { !$0.hasPrefix("- ") }.joined(separator: " ")
        return choices.isEmpty ? text : text + " " + choices.joined(separator: ", ")
    }

    /// The value a command line gives an option (`--flag V` or `--flag=V`).
    static func value(of flag: String, in arguments: [String]) -> String? {
        for (index, argument) in arguments.enumerated() {
            if argument == flag, index + 1 < arguments.count { return arguments[index + 1] }
            if argument.hasPrefix(flag + "=") { return String(argument.dropFirst(flag.count + 1)) }
        }
        return nil
    }

    static func lookup(_ dotted: String, in object: [String: Any]) -> Any? {
        var current: Any? = object
        for part in dotted.split(separator: ".") {
            current = (current as? [String: Any])?[String(part)]
        }
        // null is how --print-config shows "not set": the same as absent.
        return current is NSNull ? nil : current
    }

    /// The table docs/configuration.md holds (`threadwire-server --print-environment`).
    public static func markdownTable() -> String {
        var lines = ["| flag | variable | config file key | value |", "|---|---|---|---|"]
        for entry in entries {
            let value = switch entry.kind {
            case .value: entry.valueType == .string ? "as the flag's" : "\(entry.valueType.rawValue), as the flag's"
            case .repeated: "variable: comma-separated; file: a list"
            case .flag: "true or false"
            }
            lines.append("| `\(entry.flag)` | `\(entry.variable)` | \(entry.fileKey.map { "`\($0)`" } ?? "—") | \(value) |")
        }
        return lines.joined(separator: "\n") + "\n"
    }

    /// ArgumentParser's long name of a property: dataDir is data-dir.
    static func kebab(_ name: String) -> String {
        var out = ""
        for character in name {
            if character.isUppercase {
                out += "-" + character.lowercased()
            } else {
                out.append(character)
            }
        }
        return out
    }
}
