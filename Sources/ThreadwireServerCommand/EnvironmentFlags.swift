import ArgumentParser
import Foundation

/// Every flag of threadwire-server also as an environment variable:
/// `--data-dir` is `THREADWIRE_DATA_DIR`, `--allow-unauthenticated` is
/// `THREADWIRE_ALLOW_UNAUTHENTICATED=true`, a repeatable option takes a
/// comma-separated list. One precedence: a flag on the command line, then
/// its variable, then the config file, then the default. The list is read
/// from ServerCommand's own declarations, so a new flag has its variable
/// without anyone keeping a table.
public enum EnvironmentFlags {
    public enum Kind: Sendable, Equatable {
        /// An option taking one value.
        case value
        /// A repeatable option: the variable holds a comma-separated list.
        case repeated
        /// A flag: true/1/yes sets it, false/0/no/"" leaves it off.
        case flag
    }

    public struct Entry: Sendable, Equatable {
        public let flag: String
        public let variable: String
        public let kind: Kind
    }

    public static let entries: [Entry] = Mirror(reflecting: ServerCommand()).children.compactMap { child in
        guard let label = child.label, label.hasPrefix("_"), label != "_printEnvironment" else { return nil }
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
        let words = kebab(String(label.dropFirst()))
        return Entry(flag: "--" + words, variable: "THREADWIRE_" + words.uppercased().replacingOccurrences(of: "-", with: "_"), kind: kind)
    }

    /// `given` with the flags that only the environment sets added after it.
    public static func arguments(_ given: [String], environment: [String: String]) throws -> [String] {
        var arguments = given
        for entry in entries {
            guard let value = environment[entry.variable] else { continue }
            if given.contains(where: { $0 == entry.flag || $0.hasPrefix(entry.flag + "=") }) { continue }
            switch entry.kind {
            case .value:
                arguments += [entry.flag, value]
            case .repeated:
                for item in value.split(separator: ",") where !item.trimmingCharacters(in: .whitespaces).isEmpty {
                    arguments += [entry.flag, item.trimmingCharacters(in: .whitespaces)]
                }
            case .flag:
                switch value.lowercased() {
                case "1", "true", "yes", "on": arguments.append(entry.flag)
                case "0", "false", "no", "off", "": break
                default: throw ValidationError("\(entry.variable) must be true or false, got '\(value.prefix(40))'")
                }
            }
        }
        return arguments
    }

    /// The table docs/configuration.md holds (`threadwire-server --print-environment`).
    public static func markdownTable() -> String {
        var lines = ["| flag | variable | value |", "|---|---|---|"]
        for entry in entries {
            let value = switch entry.kind {
            case .value: "as the flag's"
            case .repeated: "comma-separated, each as one flag"
            case .flag: "true or false"
            }
            lines.append("| `\(entry.flag)` | `\(entry.variable)` | \(value) |")
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
