import Foundation
import ThreadwireCore

/// What a SIGHUP can put in force and what it cannot. The live keys are
/// reloaded (log level, per-principal limits); every other key of the file
/// shapes listeners, stores, pipelines and models built at startup, so a
/// change to one is reported as waiting for a restart rather than ignored in
/// silence.
enum ConfigReload {
    static let liveKeys: Set<String> = Set(["server.log_level"] + PrincipalLimits.settings.map { "limits." + $0.key })

    /// The keys outside `liveKeys` whose values differ between the file the
    /// server started with and the file now (both `flattened`), sorted.
    static func restartOnlyChanges(from before: [String: String], to after: [String: String]) -> [String] {
        Set(before.keys).union(after.keys)
            .filter { !liveKeys.contains($0) && before[$0] != after[$0] }
            .sorted()
    }

    /// Dotted key -> the value as canonical JSON text; objects are walked,
    /// lists (models, providers, MCP servers) compared whole.
    static func flattened(_ object: [String: Any], prefix: String = "") -> [String: String] {
        var keys: [String: String] = [:]
        for (name, value) in object {
            let key = prefix.isEmpty ? name : prefix + "." + name
            if let nested = value as? [String: Any] {
                keys.merge(flattened(nested, prefix: key)) { $1 }
            } else if !(value is NSNull) {  // null is how --print-config shows "not set"
                let data = try? JSONSerialization.data(withJSONObject: value, options: [.sortedKeys, .fragmentsAllowed])
                keys[key] = data.map { String(decoding: $0, as: UTF8.self) } ?? "\(value)"
            }
        }
        return keys
    }
}
