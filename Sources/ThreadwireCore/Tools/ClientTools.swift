import Foundation

/// The rules for a thread's client tools (`thread/start`'s and
/// `thread/tools/update`'s `client_tools`), and the check of the model's
/// arguments against a tool's schema before any client is asked.
public enum ClientToolRules {
    public static let maxTools = 64
    public static let maxNameLength = 64
    public static let maxDescriptionBytes = 4096
    public static let maxSchemaBytes = 16384
    public static let maxSchemaDepth = 32

    /// The tools as stored, or INVALID_ARGUMENT naming the tool and the fault.
    public static func validated(_ tools: [ToolSpec]) throws -> [ToolSpec] {
        if tools.count > maxTools {
            throw DomainError.invalidArgument("client_tools has \(tools.count) tools; at most \(maxTools) are allowed")
        }
        let builtIn = Set((ToolCatalog.v1 + ToolCatalog.v2).map(\.name) + [UserInputTool.name])
        var seen: Set<String> = []
        return try tools.enumerated().map { index, tool in
            let label = "client_tools[\(index)]"
            let name = tool.name
            guard !name.isEmpty, name.count <= maxNameLength,
                  name.unicodeScalars.allSatisfy({ ($0.isASCII && ($0.properties.isAlphabetic || ("0"..."9").contains($0))) || $0 == "_" || $0 == "-" })
            else {
                throw DomainError.invalidArgument("\(label).name '\(name.prefix(80))' must be 1..\(maxNameLength) letters, digits, '_' or '-'")
            }
            if builtIn.contains(name) {
                throw DomainError.invalidArgument("\(label).name '\(name)' is the name of a built-in tool")
            }
            if name.hasPrefix("mcp__") {
                throw DomainError.invalidArgument("\(label).name '\(name)': names starting with mcp__ are kept for MCP tools")
            }
            guard seen.insert(name).inserted else {
                throw DomainError.invalidArgument("\(label).name '\(name)' appears twice in client_tools")
            }
            if !tool.namespace.isEmpty {
                throw DomainError.invalidArgument("\(label) (\(name)): tool_namespace must be empty for a client tool")
            }
            if tool.description.utf8.count > maxDescriptionBytes {
                throw DomainError.invalidArgument("\(label) (\(name)): description is over \(maxDescriptionBytes) bytes")
            }
            if tool.parametersSchema.utf8.count > maxSchemaBytes {
                throw DomainError.invalidArgument("\(label) (\(name)): parameters_json_schema is over \(maxSchemaBytes) bytes")
            }
            let schemaText = tool.parametersSchema.isEmpty ? #"{"type":"object"}"# : tool.parametersSchema
            if JSONNesting.tooDeep(schemaText, limit: maxSchemaDepth) {
                throw DomainError.invalidArgument("\(label) (\(name)): parameters_json_schema nests deeper than \(maxSchemaDepth)")
            }
            guard case let .object(schema)? = try? JSONDecoder().decode(LooseJSON.self, from: Data(schemaText.utf8)) else {
                throw DomainError.invalidArgument("\(label) (\(name)): parameters_json_schema is not a JSON object")
            }
            guard schema["type"] == .string("object") else {
                throw DomainError.invalidArgument("\(label) (\(name)): parameters_json_schema must have \"type\": \"object\"")
            }
            if LooseJSON.object(schema).depth > maxSchemaDepth {
                throw DomainError.invalidArgument("\(label) (\(name)): parameters_json_schema nests deeper than \(maxSchemaDepth)")
            }
            return ToolSpec(name: name, namespace: "", description: tool.description, parametersSchema: schemaText,
                            requiresApproval: tool.requiresApproval)
        }
    }

    /// The model's arguments for `tool`, checked against its schema: nil when
    /// they fit, else what is wrong (the model reads it; no client is asked).
    public static func argumentFault(_ arguments: String, tool: ToolSpec) -> String? {
        if JSONNesting.tooDeep(arguments) { return "arguments of \(tool.name) nest deeper than \(JSONNesting.limit) levels" }
        guard let value = try? JSONDecoder().decode(LooseJSON.self, from: Data((arguments.isEmpty ? "{}" : arguments).utf8)) else {
            return "arguments of \(tool.name) are not valid JSON: \(arguments.prefix(200))"
        }
        guard let schema = try? JSONDecoder().decode(LooseJSON.self, from: Data(tool.parametersSchema.utf8)) else { return nil }
        return SchemaCheck.fault(value, schema, at: "arguments")
    }
}

/// The part of JSON Schema that tool parameters use: type (one or a list),
/// properties, required, additionalProperties (false or a schema), items,
/// enum, const, minimum/maximum, minLength/maxLength, minItems/maxItems.
/// Keywords it does not know are ignored, as a validator must.
enum SchemaCheck {
    static func fault(_ value: LooseJSON, _ schema: LooseJSON, at path: String) -> String? {
        guard case let .object(rules) = schema else { return nil }
        if let type = rules["type"] {
            let allowed: [String]
            switch type {
            case let .string(one): allowed = [one]
            case let .array(many): allowed = many.compactMap { if case let .string(name) = $0 { name } else { nil } }
            default: allowed = []
            }
            if !allowed.isEmpty, !allowed.contains(where: { value.isOfType($0) }) {
                return "\(path) must be \(allowed.joined(separator: " or ")), got \(value.typeName)"
            }
        }
        if case let .array(options)? = rules["enum"], !options.contains(value) {
            return "\(path) must be one of the schema's enum values"
        }
        if let constant = rules["const"], constant != value {
            return "\(path) must equal the schema's const value"
        }
        switch value {
        case let .object(object):
            let properties: [String: LooseJSON]
            if case let .object(declared)? = rules["properties"] { properties = declared } else { properties = [:] }
            if case let .array(required)? = rules["required"] {
                for case let .string(key) in required where object[key] == nil {
                    return "\(path) needs the property '\(key)'"
                }
            }
            for key in object.keys.sorted() {
                if let property = properties[key] {
                    if let fault = fault(object[key]!, property, at: "\(path).\(key)") { return fault }
                } else if rules["additionalProperties"] == .bool(false) {
                    return "\(path) has no property '\(key)'; it has: \(properties.keys.sorted().joined(separator: ", "))"
                } else if let extra = rules["additionalProperties"], case .object = extra {
                    if let fault = fault(object[key]!, extra, at: "\(path).\(key)") { return fault }
                }
            }
        case let .array(items):
            if let limit = rules["minItems"]?.number, Double(items.count) < limit { return "\(path) needs at least \(Int(limit)) items" }
            if let limit = rules["maxItems"]?.number, Double(items.count) > limit { return "\(path) allows at most \(Int(limit)) items" }
            if let itemSchema = rules["items"] {
                for (index, item) in items.enumerated() {
                    if let fault = fault(item, itemSchema, at: "\(path)[\(index)]") { return fault }
                }
            }
        case let .string(text):
            if let limit = rules["minLength"]?.number, Double(text.count) < limit { return "\(path) needs at least \(Int(limit)) characters" }
            if let limit = rules["maxLength"]?.number, Double(text.count) > limit { return "\(path) allows at most \(Int(limit)) characters" }
        case .integer, .number:
            if let number = value.number {
                if let limit = rules["minimum"]?.number, number < limit { return "\(path) must be at least \(limit)" }
                if let limit = rules["maximum"]?.number, number > limit { return "\(path) must be at most \(limit)" }
            }
        case .null, .bool:
            break
        }
        return nil
    }
}

extension LooseJSON {
    var number: Double? {
        switch self {
        case let .integer(value): return Double(value)
        case let .number(value): return value
        default: return nil
        }
    }

    var typeName: String {
        switch self {
        case .null: return "null"
        case .bool: return "a boolean"
        case .integer: return "an integer"
        case .number: return "a number"
        case .string: return "a string"
        case .array: return "an array"
        case .object: return "an object"
        }
    }

    func isOfType(_ type: String) -> Bool {
        switch (type, self) {
        case ("null", .null), ("boolean", .bool), ("string", .string), ("array", .array), ("object", .object): return true
        case ("integer", .integer), ("number", .integer), ("number", .number): return true
        case let ("integer", .number(value)): return value.rounded() == value
        default: return false
        }
    }

    var depth: Int {
        switch self {
        case let .array(items): return 1 + (items.map(\.depth).max() ?? 0)
        case let .object(members): return 1 + (members.values.map(\.depth).max() ?? 0)
        default: return 0
        }
    }
}

extension LooseJSON {
    /// `text`'s members when it is a JSON object.
    static func fields(_ text: String) -> [String: LooseJSON]? {
        guard case let .object(members)? = try? JSONDecoder().decode(LooseJSON.self, from: Data(text.utf8)) else { return nil }
        return members
    }

    var stringValue: String? { if case let .string(value) = self { value } else { nil } }
    var arrayValue: [LooseJSON]? { if case let .array(items) = self { items } else { nil } }
}
