import ThreadwireCore
import ThreadwireWire

/// The most a request may put into a thread (issue 47): every string and
/// list a client can store is bounded below the frame size, so no field can
/// take a thread's history, a store row or a model request hostage. Checked
/// for every method that changes state except thread/import (its lines are
/// rollout text, bounded by the frame and parsed on their own terms).
/// docs/protocol.md's "Limits" lists the same numbers.
enum InputBounds {
    /// Bytes of UTF-8 a string field may hold, by the field's name.
    static let stringBytes: [String: Int] = [
        "name": 1_024, "model": 256, "nickname": 256, "task_name": 1_024, "cwd": 4_096,
        "text": 1_048_576, "message": 1_048_576, "base_instructions": 262_144, "developer_instructions": 262_144,
        "description": 4_096, "parameters_json_schema": 16_384, "image_url": 65_536, "search_term": 200,
        // A client's answer to a server request: what the model reads.
        "output": 1_048_576, "answer": 1_048_576, "reason": 4_096,
    ]
    /// Any other string field; ids (fields ending in `_id`) get `idBytes`.
    static let defaultStringBytes = 65_536
    static let idBytes = 128
    /// Items a list field may hold, by the field's name.
    static let listItems: [String: Int] = ["input": 256, "client_tools": 64]
    static let defaultListItems = 1_000
    /// Nesting of a JSON Schema given as text (a tool's parameters).
    static let schemaDepth = 32

    static func limit(forString field: String) -> Int {
        if let limit = stringBytes[field] { return limit }
        return field.hasSuffix("_id") || field == "id" ? idBytes : defaultStringBytes
    }

    /// INVALID_ARGUMENT naming the first field over its limit, and the limit.
    static func check(_ params: Wire.Request.Params) throws {
        try walk(Wire.Request(params: params).jsonValue(), path: "", field: "")
    }

    /// What is wrong with a client's answer to a server request, or nil.
    static func fault(_ answer: Wire.ServerRequestAnswer) -> String? {
        do {
            try walk(answer.jsonValue(), path: "answer", field: "")
            return nil
        } catch let error as RequestError {
            return error.message
        } catch {
            return "\(error)"
        }
    }

    private static func walk(_ value: JSONValue, path: String, field: String) throws {
        switch value {
        case let .string(text):
            let limit = limit(forString: field)
            let bytes = text.utf8.count
            if bytes > limit {
                throw RequestError(.invalidArgument, "\(path) is \(bytes) bytes; the limit is \(limit) (docs/protocol.md, Limits)")
            }
            if field == "parameters_json_schema", let depth = nesting(text), depth > schemaDepth {
                throw RequestError(.invalidArgument, "\(path) nests \(depth) levels deep; the limit is \(schemaDepth)")
            }
        case let .array(items):
            let limit = listItems[field] ?? defaultListItems
            if items.count > limit {
                throw RequestError(.invalidArgument, "\(path) has \(items.count) items; the limit is \(limit) (docs/protocol.md, Limits)")
            }
            for (index, item) in items.enumerated() { try walk(item, path: "\(path)[\(index)]", field: field) }
        case let .object(members):
            for (key, member) in members { try walk(member, path: path.isEmpty ? key : "\(path).\(key)", field: key) }
        case .null, .bool, .int, .uint, .double:
            return
        }
    }

    /// The deepest nesting of objects and arrays in JSON text (nil: none).
    static func nesting(_ text: String) -> Int? {
        let depth = JSONNesting.depth(text.utf8)
        return depth == 0 ? nil : depth
    }
}
