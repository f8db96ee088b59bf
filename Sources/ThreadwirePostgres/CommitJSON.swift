import Foundation
import ThreadwireStorage

/// The group commit's argument written straight into bytes. Going through
/// `JSONEncoder` (a boxed container per value, a dictionary per object, then
/// serialization) took about 8 % of the server's CPU at 16 connections on
/// PostgreSQL; this writes the same JSON (the same keys, nil omitted, the
/// few bytes left in it, fingerprints, as base64) in one pass. The commits'
/// records are not in it (`CommitFunction.Commit.records`). `Encodable` stays on the types as the reference
/// the tests compare this with.
struct CommitJSON {
    private(set) var bytes: [UInt8] = []

    static func encode(_ commits: [CommitFunction.Commit]) -> String {
        var json = CommitJSON()
        json.bytes.reserveCapacity(1024 * commits.count)
        json.array(commits) { json, commit in json.commit(commit) }
        return String(decoding: json.bytes, as: UTF8.self)
    }

    private mutating func commit(_ commit: CommitFunction.Commit) {
        var fields = Fields()
        fields.string("tree", commit.tree, into: &self)
        fields.integer("epoch", commit.epoch, into: &self)
        fields.integer("rb", commit.recordBase, into: &self)
        fields.key("ops", into: &self)
        array(commit.ops) { json, operation in json.operation(operation) }
        fields.close(into: &self)
    }

    private mutating func operation(_ operation: CommitFunction.Operation) {
        var fields = Fields()
        fields.string("k", operation.k, into: &self)
        if let row = operation.r {
            fields.key("r", into: &self)
            self.row(row)
        }
        fields.string("id", operation.id, into: &self)
        fields.integer("first", operation.first, into: &self)
        fields.integer("ri", operation.ri, into: &self)
        fields.integer("n", operation.n, into: &self)
        fields.integer("seq", operation.seq, into: &self)
        fields.string("status", operation.status, into: &self)
        fields.integer("through", operation.through, into: &self)
        fields.string("turn", operation.turnID, into: &self)
        fields.string("p", operation.p, into: &self)
        fields.string("key", operation.key, into: &self)
        fields.string("m", operation.m, into: &self)
        fields.bytes("fp", operation.fp, into: &self)
        fields.string("turns", operation.turns, into: &self)
        fields.integer("at", operation.at, into: &self)
        fields.integer("lines", operation.lines, into: &self)
        fields.string("to", operation.to, into: &self)
        fields.close(into: &self)
    }

    private mutating func row(_ r: ThreadRow) {
        var fields = Fields()
        fields.string("id", r.id, into: &self)
        fields.string("session_id", r.session_id, into: &self)
        fields.string("parent_id", r.parent_id, into: &self)
        fields.string("forked_from_id", r.forked_from_id, into: &self)
        fields.string("source", r.source, into: &self)
        fields.integer("depth", r.depth, into: &self)
        fields.string("task_name", r.task_name, into: &self)
        fields.string("nickname", r.nickname, into: &self)
        fields.string("preview", r.preview, into: &self)
        fields.string("name", r.name, into: &self)
        fields.integer("created_at", r.created_at, into: &self)
        fields.integer("updated_at", r.updated_at, into: &self)
        fields.boolean("archived", r.archived, into: &self)
        fields.string("runtime", r.runtime, into: &self)
        fields.boolean("legacy", r.legacy, into: &self)
        fields.string("selected_mode", r.selected_mode, into: &self)
        fields.string("model", r.model, into: &self)
        fields.string("cwd", r.cwd, into: &self)
        fields.string("base_instructions", r.base_instructions, into: &self)
        fields.string("config_overrides", r.config_overrides, into: &self)
        fields.integer("version", r.version, into: &self)
        fields.string("agent_status", r.agent_status, into: &self)
        fields.string("agent_final_message", r.agent_final_message, into: &self)
        fields.boolean("agent_closed", r.agent_closed, into: &self)
        fields.string("owner", r.owner, into: &self)
        fields.string("tool_settings", r.tool_settings, into: &self)
        fields.string("agent_role", r.agent_role, into: &self)
        fields.integer("event_sequence", r.event_sequence, into: &self)
        fields.close(into: &self)
    }

    // MARK: Values

    private mutating func array<Element>(_ elements: [Element], _ write: (inout CommitJSON, Element) -> Void) {
        bytes.append(UInt8(ascii: "["))
        for (index, element) in elements.enumerated() {
            if index > 0 { bytes.append(UInt8(ascii: ",")) }
            write(&self, element)
        }
        bytes.append(UInt8(ascii: "]"))
    }

    private static let hex = Array("0123456789abcdef".utf8)

    /// RFC 8259: quotes, backslashes and control characters escaped; the
    /// rest as UTF-8 (a Swift string is always valid Unicode).
    fileprivate mutating func string(_ value: String) {
        bytes.append(UInt8(ascii: "\""))
        var value = value
        value.withUTF8 { utf8 in
            // Runs that need no escape (nearly all of a row's text) are
            // appended whole: byte by byte, a turn's rows cost it 7 µs.
            var runStart = 0
            for index in utf8.indices {
                let byte = utf8[index]
                guard byte == UInt8(ascii: "\"") || byte == UInt8(ascii: "\\") || byte < 0x20 else { continue }
                bytes.append(contentsOf: UnsafeBufferPointer(rebasing: utf8[runStart..<index]))
                runStart = index + 1
                switch byte {
                case UInt8(ascii: "\""): bytes.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "\"")])
                case UInt8(ascii: "\\"): bytes.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "\\")])
                case UInt8(ascii: "\n"): bytes.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "n")])
                case UInt8(ascii: "\r"): bytes.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "r")])
                case UInt8(ascii: "\t"): bytes.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "t")])
                default:
                    bytes.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "u"), UInt8(ascii: "0"), UInt8(ascii: "0"),
                                              Self.hex[Int(byte >> 4)], Self.hex[Int(byte & 0xf)]])
                }
            }
            bytes.append(contentsOf: UnsafeBufferPointer(rebasing: utf8[runStart...]))
        }
        bytes.append(UInt8(ascii: "\""))
    }

    fileprivate mutating func integer(_ value: some BinaryInteger) {
        bytes.append(contentsOf: String(value).utf8)
    }

    fileprivate mutating func base64(_ value: Data) {
        bytes.append(UInt8(ascii: "\""))
        bytes.append(contentsOf: value.base64EncodedString().utf8)
        bytes.append(UInt8(ascii: "\""))
    }

    /// The keys of one object: `{` before the first, `,` before the others.
    fileprivate struct Fields {
        private var count = 0

        mutating func key(_ name: StaticString, into json: inout CommitJSON) {
            json.bytes.append(count == 0 ? UInt8(ascii: "{") : UInt8(ascii: ","))
            count += 1
            json.bytes.append(UInt8(ascii: "\""))
            name.withUTF8Buffer { json.bytes.append(contentsOf: $0) }
            json.bytes.append(contentsOf: [UInt8(ascii: "\""), UInt8(ascii: ":")])
        }

        mutating func string(_ name: StaticString, _ value: String?, into json: inout CommitJSON) {
            guard let value else { return }
            key(name, into: &json)
            json.string(value)
        }

        mutating func integer(_ name: StaticString, _ value: (some BinaryInteger)?, into json: inout CommitJSON) {
            guard let value else { return }
            key(name, into: &json)
            json.integer(value)
        }

        mutating func boolean(_ name: StaticString, _ value: Bool, into json: inout CommitJSON) {
            key(name, into: &json)
            let literal: StaticString = value ? "true" : "false"
            literal.withUTF8Buffer { json.bytes.append(contentsOf: $0) }
        }

        func close(into json: inout CommitJSON) {
            if count == 0 { json.bytes.append(UInt8(ascii: "{")) }
            json.bytes.append(UInt8(ascii: "}"))
        }

        mutating func bytes(_ name: StaticString, _ value: Data?, into json: inout CommitJSON) {
            guard let value else { return }
            key(name, into: &json)
            json.base64(value)
        }
    }
}
