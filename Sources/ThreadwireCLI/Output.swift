import ArgumentParser
import Foundation
import ThreadwireWire
import Yams

/// `-o`: how a command prints its result, as kubectl's -o does.
enum OutputFormat: String, ExpressibleByArgument, CaseIterable, Sendable {
    case json, yaml, table, wide
    /// Only the ids of the threads, turns or items the result holds, one a
    /// line, for scripts: T=$(threadwire thread start -o id).
    case id
}

struct OutputOptions: ParsableArguments {
    @Option(name: [.customShort("o"), .customLong("output")],
            help: "json (the result as the server sends it), yaml, table (a line per thread, turn or item), wide (more columns) or id (only their ids, for scripts).")
    var format: OutputFormat = .json
}

/// Prints a result on stdout in `format`; a failure on stderr (its code,
/// the code's name and the message) with exit 64 + the code.
func output(_ response: Wire.Response, as format: OutputFormat = .json) throws {
    let code = response.code ?? 0
    guard code == 0 else {
        let message = response.message ?? ""
        let text: String = switch format {
        case .json: JSONValue.object([("code", .uint(UInt64(code))), ("status", .string(StatusExit.name(code))),
                                      ("message", .string(message))]).render(pretty: true)
        case .yaml: Rendered.yaml(.object([("code", .uint(UInt64(code))), ("status", .string(StatusExit.name(code))),
                                           ("message", .string(message))]))
        case .table, .wide, .id: "threadwire: \(StatusExit.name(code)): \(message)"
        }
        FileHandle.standardError.write(Data((text.hasSuffix("\n") ? text : text + "\n").utf8))
        throw ExitCode(StatusExit.code(for: code))
    }
    let value = response.result.map(resultJSON) ?? .object([])
    // Written at once: notifications that follow go straight to fd 1, and the response must come first.
    FileHandle.standardOutput.write(Data(Rendered.text(value, as: format).utf8))
}

/// A JSON value as each output format writes it.
enum Rendered {
    static func text(_ value: JSONValue, as format: OutputFormat) -> String {
        switch format {
        case .json: value.render(pretty: true) + "\n"
        case .yaml: yaml(value)
        case .table: Tables.render(value, wide: false)
        case .wide: Tables.render(value, wide: true)
        case .id: ids(value).map { $0 + "\n" }.joined()
        }
    }

    /// The ids a result is about: its threads', its turn's, its items'.
    static func ids(_ value: JSONValue) -> [String] {
        func id(of item: JSONValue) -> String? {
            if case let .string(text)? = item["id"] { return text }
            if let inner = item["item"] { return id(of: inner) }
            if case let .string(text)? = item["thread_id"] { return text }
            return nil
        }
        if case let .array(items)? = value["data"] {
            return items.compactMap { item in
                if case let .string(text) = item { return text }
                return id(of: item)
            }
        }
        if let thread = value["thread"] { return id(of: thread).map { [$0] } ?? [] }
        if let turn = value["turn"] { return id(of: turn).map { [$0] } ?? [] }
        return id(of: value).map { [$0] } ?? []
    }

    /// Keys in the order the server sent them (Yams' Node keeps it).
    static func yaml(_ value: JSONValue) -> String {
        (try? Yams.serialize(node: node(value), sortKeys: false)) ?? value.render(pretty: true) + "\n"
    }

    static func node(_ value: JSONValue) -> Node {
        switch value {
        case .null: return Node("null", Tag(.null))
        case .bool(let flag): return Node(flag ? "true" : "false", Tag(.bool))
        case .int(let number): return Node(String(number), Tag(.int))
        case .uint(let number): return Node(String(number), Tag(.int))
        case .double(let number): return Node(String(number), Tag(.float))
        case .string(let text): return Node(text, Tag(.str), .doubleQuoted)
        case .array(let items): return Node(items.map(node))
        case .object(let members): return Node(members.map { (Node($0.0), node($0.1)) })
        }
    }
}

/// Tables of the things results hold: threads, turns, and otherwise each
/// field on its own line. Columns are padded to their widest cell; times UTC.
enum Tables {
    struct Column {
        let title: String
        let value: (JSONValue) -> String
    }

    static func render(_ value: JSONValue, wide: Bool) -> String {
        var sections: [String] = []
        if let list = value["data"], case let .array(items) = list {
            sections.append(table(items, wide: wide))
        } else if let thread = value["thread"] {
            sections.append(table([thread], wide: wide))
            if case let .array(turns)? = thread["turns"], !turns.isEmpty { sections.append(table(turns, wide: wide)) }
        } else if let turn = value["turn"] {
            sections.append(table([turn], wide: wide))
        } else {
            sections.append(keyValues(value))
        }
        if let next = value["next_cursor"], case let .string(cursor) = next, !cursor.isEmpty { sections.append("next cursor: \(cursor)\n") }
        return sections.joined(separator: "\n")
    }

    static func table(_ items: [JSONValue], wide: Bool) -> String {
        guard let first = items.first else { return "(none)\n" }
        let columns: [Column]
        if isThread(first) {
            columns = threadColumns(wide: wide)
        } else if isTurn(first) {
            columns = turnColumns(wide: wide)
        } else if case .object = first {
            columns = genericColumns(items, wide: wide)
        } else {
            columns = [Column(title: "VALUE") { scalar($0) }]
        }
        return layout([columns.map(\.title)] + items.map { item in columns.map { $0.value(item) } })
    }

    static func isThread(_ value: JSONValue) -> Bool {
        if case .object? = value["status"] { return true }
        return value["session_id"] != nil
    }

    static func isTurn(_ value: JSONValue) -> Bool {
        if case let .string(status)? = value["status"] { return status.hasPrefix("TURN_STATUS") }
        return false
    }

    static func threadColumns(wide: Bool) -> [Column] {
        var columns = [
            Column(title: "ID") { scalar($0["id"]) },
            Column(title: "NAME") { String(scalar($0["name"] ?? $0["preview"], empty: "").prefix(wide ? 60 : 40)) },
            Column(title: "STATUS") { short($0["status"]?["type"]) },
            Column(title: "RUNTIME") { short($0["multi_agent_runtime"]) },
            Column(title: "MODE") { short($0["multi_agent_mode"], absent: "unset") },
            Column(title: "UPDATED") { time($0["updated_at"]) },
        ]
        if wide {
            columns += [
                Column(title: "MODEL") { scalar($0["model"]) },
                Column(title: "SOURCE") { short($0["source"]?["kind"]) },
                Column(title: "PARENT") { scalar($0["parent_thread_id"] ?? $0["forked_from_id"]) },
                Column(title: "PRINCIPAL") { scalar($0["principal"]) },
                Column(title: "CREATED") { time($0["created_at"]) },
            ]
        }
        return columns
    }

    static func turnColumns(wide: Bool) -> [Column] {
        var columns = [
            Column(title: "TURN") { scalar($0["id"]) },
            Column(title: "STATUS") { short($0["status"]) },
            Column(title: "EFFECTIVE MODE") { short($0["context"]?["effective_multi_agent_mode"], absent: "none") },
            Column(title: "RUNTIME") { short($0["context"]?["multi_agent_runtime"]) },
            Column(title: "ITEMS") { if case let .array(items)? = $0["items"] { String(items.count) } else { "0" } },
            Column(title: "STARTED") { time($0["started_at"]) },
        ]
        if wide {
            columns += [
                Column(title: "MODEL") { scalar($0["context"]?["model"]) },
                Column(title: "COMPLETED") { time($0["completed_at"]) },
                Column(title: "ERROR") { String(scalar($0["error"]).prefix(60)) },
            ]
        }
        return columns
    }

    /// Any other list: its scalar fields and those of its objects one level
    /// down (an item's id, type and text), the first six unless wide.
    static func genericColumns(_ items: [JSONValue], wide: Bool) -> [Column] {
        var paths: [[String]] = []
        for item in items {
            guard case let .object(members) = item else { continue }
            for (name, value) in members {
                switch value {
                case .array: continue
                case .object(let inner):
                    for (innerName, innerValue) in inner where !paths.contains([name, innerName]) {
                        if case .object = innerValue { continue }
                        if case .array = innerValue { continue }
                        paths.append([name, innerName])
                    }
                default:
                    if !paths.contains([name]) { paths.append([name]) }
                }
            }
        }
        let lasts = paths.map { $0.last! }
        return (wide ? paths : Array(paths.prefix(6))).map { path in
            let last = path.last!
            let title = (lasts.filter { $0 == last }.count > 1 ? path.joined(separator: ".") : last).uppercased()
            return Column(title: title) { item in
                let value = path.reduce(Optional(item)) { $0?[$1] }
                return last.hasSuffix("_at") ? time(value) : String(short(value).prefix(wide ? 200 : 60))
            }
        }
    }

    /// A result that is not a list: one line per field (nested as a.b).
    static func keyValues(_ value: JSONValue) -> String {
        var rows: [[String]] = []
        func walk(_ value: JSONValue, _ path: String) {
            switch value {
            case .object(let members):
                if members.isEmpty, !path.isEmpty { rows.append([path, "{}"]) }
                for (name, member) in members { walk(member, path.isEmpty ? name : "\(path).\(name)") }
            case .array(let items):
                if items.isEmpty { rows.append([path, "[]"]) }
                for (index, item) in items.enumerated() { walk(item, "\(path)[\(index)]") }
            default:
                rows.append([path, path.hasSuffix("_at") ? time(value) : short(value)])
            }
        }
        walk(value, "")
        return rows.isEmpty ? "(empty)\n" : layout(rows)
    }

    static func scalar(_ value: JSONValue?, empty: String = "-") -> String {
        switch value {
        case nil, .null?: return empty
        case .bool(let flag)?: return flag ? "true" : "false"
        case .int(let number)?: return String(number)
        case .uint(let number)?: return String(number)
        case .double(let number)?: return String(number)
        case .string(let text)?: return text.isEmpty ? empty : text.replacingOccurrences(of: "\n", with: " ")
        case .array?: return "[…]"
        case .object?: return "{…}"
        }
    }

    /// An enum value without its type's prefix: MULTI_AGENT_MODE_PROACTIVE is proactive.
    static func short(_ value: JSONValue?, absent: String = "-") -> String {
        guard case let .string(text)? = value else { return value == nil ? absent : scalar(value) }
        if text == "MULTI_AGENT_RUNTIME_UNSPECIFIED" { return "unresolved" }
        for prefix in ["MULTI_AGENT_RUNTIME_", "MULTI_AGENT_MODE_", "THREAD_STATUS_TYPE_", "TURN_STATUS_", "THREAD_SOURCE_KIND_",
                       "SERVING_STATUS_", "ITEM_TYPE_", "APPROVAL_POLICY_"]
            where text.hasPrefix(prefix) {
            let rest = text.dropFirst(prefix.count).lowercased()
            if prefix == "MULTI_AGENT_MODE_" { return rest == "explicit_request_only" ? "explicitRequestOnly" : rest }
            return rest.replacingOccurrences(of: "_", with: "-")
        }
        return text
    }

    static func time(_ value: JSONValue?) -> String {
        let millis: Double
        switch value {
        case .int(let number)?: millis = Double(number)
        case .uint(let number)?: millis = Double(number)
        default: return "-"
        }
        return ISO8601DateFormatter().string(from: Date(timeIntervalSince1970: millis / 1000))
    }

    static func layout(_ rows: [[String]]) -> String {
        var widths = [Int](repeating: 0, count: rows.map(\.count).max() ?? 0)
        for row in rows { for (column, cell) in row.enumerated() { widths[column] = max(widths[column], cell.count) } }
        var out = ""
        for row in rows {
            var line = ""
            for (column, cell) in row.enumerated() {
                line += column == row.count - 1 ? cell : cell.padding(toLength: widths[column] + 2, withPad: " ", startingAt: 0)
            }
            out += line + "\n"
        }
        return out
    }
}

/// `-o` of the commands that print a report (import, replay, bench):
/// text for people, json for scripts. `--json` was its older spelling.
struct ReportOutputOptions: ParsableArguments {
    enum Format: String, ExpressibleByArgument, CaseIterable { case text, json }
    @Option(name: [.customShort("o"), .customLong("output")], help: "text (the default) or json.")
    var format: Format = .text
    @Flag(name: .customLong("json"), help: ArgumentHelp("The same as -o json.", visibility: .hidden))
    var legacyJSON = false
    var json: Bool { legacyJSON || format == .json }
}
