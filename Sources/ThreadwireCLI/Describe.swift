import ArgumentParser
import Foundation
import ThreadwireWire

/// What the server says it serves (reflection/descriptors), as grpcurl's
/// list and describe show a gRPC server's: no .proto file needed.
struct Reflected {
    let result: Wire.ReflectionDescriptorsResult
    let schema: DynamicSchema

    static func fetch(_ options: ServerOptions) async throws -> Reflected {
        let client = try await options.connect(initialize: false)
        defer { Task { await client.close() } }
        guard case let .reflectionDescriptors(reflected) = try await client.result(.reflectionDescriptors(.init())) else {
            throw ValidationError("the server did not answer reflection/descriptors with its schema")
        }
        return Reflected(result: reflected, schema: try DynamicSchema(fileDescriptorSet: reflected.fileDescriptorSet ?? []))
    }

    /// Every method, notification and server request, with its kind.
    var entries: [(kind: String, method: Wire.ReflectedMethod)] {
        result.methods.map { ("method", $0) } + result.notifications.map { ("notification", $0) }
            + result.serverRequests.map { ("server request", $0) }
    }

    /// A message or enum named in full (threadwire.v1.Thread) or by its last part (Thread).
    func typeName(_ name: String) -> String? {
        let bare = name.hasPrefix(".") ? String(name.dropFirst()) : name
        let all = Array(schema.messages.keys) + Array(schema.enums.keys)
        if all.contains(bare) { return bare }
        let matches = all.filter { $0.hasSuffix("." + bare) }.sorted()
        return matches.count == 1 ? matches[0] : matches.first { $0.hasPrefix("threadwire.") }
    }

    /// A message or enum as .proto text.
    func definition(_ name: String) -> String? {
        if let message = schema.messages[name] {
            var lines = ["message \(name) {"]
            for field in message.fields {
                lines.append("  \(field.repeated ? "repeated" : "optional") \(Self.typeText(field)) \(field.name) = \(field.number);")
            }
            return (lines + ["}"]).joined(separator: "\n")
        }
        if let values = schema.enums[name] {
            return (["enum \(name) {"] + values.map { "  \($0.name) = \($0.number);" } + ["}"]).joined(separator: "\n")
        }
        return nil
    }

    /// google.protobuf.FieldDescriptorProto.Type as .proto writes it.
    static func typeText(_ field: DynamicSchema.Field) -> String {
        let scalars = [1: "double", 2: "float", 3: "int64", 4: "uint64", 5: "int32", 6: "fixed64", 7: "fixed32", 8: "bool", 9: "string",
                       12: "bytes", 13: "uint32", 15: "sfixed32", 16: "sfixed64", 17: "sint32", 18: "sint64"]
        if let scalar = scalars[field.type] { return scalar }
        return field.typeName.hasPrefix(".") ? String(field.typeName.dropFirst()) : field.typeName
    }
}

struct ListMethods: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "list",
        abstract: "List the methods the server serves, from its own schema (reflection/descriptors).",
        discussion: "-o wide adds each one's params and result types and whether it changes state; --all adds notifications and server requests.")
    @OptionGroup var options: ServerOptions
    @Option(name: [.customShort("o"), .customLong("output")], help: "table (names, one a line: the default), wide, json or yaml.")
    var format: OutputFormat = .table
    @Flag(help: "Also the notifications the server sends and the requests it makes of clients.") var all = false

    func run() async throws {
        let reflected = try await Reflected.fetch(options)
        let entries = reflected.entries.filter { all || $0.kind == "method" }
        switch format {
        case .table, .id:
            print(entries.compactMap(\.method.name).joined(separator: "\n"))
        case .wide:
            var rows = [["NAME", "KIND", "PARAMS", "RESULT", "CHANGES STATE"]]
            for (kind, method) in entries {
                rows.append([method.name ?? "", kind, method.paramsType ?? "-", method.resultType ?? "-", method.mutates == true ? "yes" : "no"])
            }
            print(Tables.layout(rows), terminator: "")
        case .json, .yaml:
            let value = JSONValue.array(entries.map { kind, method in
                .object([("name", .string(method.name ?? "")), ("kind", .string(kind)),
                         ("params_type", method.paramsType.map(JSONValue.string) ?? .null),
                         ("result_type", method.resultType.map(JSONValue.string) ?? .null),
                         ("mutates", .bool(method.mutates == true))])
            })
            print(Rendered.text(value, as: format), terminator: "")
        }
    }
}

struct Describe: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Describe a method (its params and result messages) or a message or enum, as .proto text, from the server's own schema.",
        discussion: "Examples: threadwire describe thread/start; threadwire describe ThreadSettings; threadwire describe threadwire.v1.MultiAgentMode")
    @OptionGroup var options: ServerOptions
    @Argument(help: "A method (thread/start), a notification (turn/completed), or a message or enum (Thread, threadwire.v1.Thread).")
    var name: String

    func run() async throws {
        let reflected = try await Reflected.fetch(options)
        if let (kind, method) = reflected.entries.first(where: { $0.method.name == name }) {
            var text = "\(name): a \(kind)"
            if kind == "method" { text += method.mutates == true ? " that changes state (retry it only with an idempotency key)" : " safe to repeat" }
            text += "\n  params: \(method.paramsType ?? "-")\n"
            if let result = method.resultType { text += "  result: \(result)\n" }
            for type in [method.paramsType, method.resultType].compactMap({ $0 }) {
                if let definition = reflected.definition(type) { text += "\n" + definition + "\n" }
            }
            print(text, terminator: "")
            return
        }
        guard let type = reflected.typeName(name), let definition = reflected.definition(type) else {
            let methods = reflected.entries.compactMap(\.method.name).filter { $0.hasPrefix(name.split(separator: "/").first.map(String.init) ?? name) }
            FileHandle.standardError.write(Data(("threadwire: NOT_FOUND: the server has no method, message or enum '\(name)'"
                + (methods.isEmpty ? "" : "; did you mean: \(methods.prefix(8).joined(separator: ", "))") + "\n").utf8))
            throw ExitCode(StatusExit.code(for: 5))
        }
        print(definition)
    }
}
