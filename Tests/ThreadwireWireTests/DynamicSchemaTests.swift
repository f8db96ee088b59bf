import Testing
import ThreadwireWire
import ThreadwireWireFixtures

/// The reflected schema (what `threadwire call --reflect` uses) against the
/// compiled codec, on the fully populated fixtures of every oneof case.
@Suite("DynamicSchema: messages from reflection/descriptors")
struct DynamicSchemaTests {
    let schema: DynamicSchema

    init() throws { schema = try DynamicSchema(fileDescriptorSet: WireSchema.fileDescriptorSet) }

    func check<M: WireMessage>(_ message: M) throws {
        let bytes = message.serializedBytes()
        let json = try schema.decode(bytes, as: M.protoName)
        // The same members (the compiled codec writes oneof members last).
        #expect(sorted(json) == sorted(message.jsonValue()), "\(M.protoName): reflected JSON differs from the compiled codec's")
        let again = try schema.encode(json, as: M.protoName)
        #expect(try M(serializedBytes: again) == message, "\(M.protoName): re-encoded from JSON differs")
    }

    func sorted(_ value: JSONValue) -> JSONValue {
        switch value {
        case let .object(members): return .object(members.map { ($0.0, sorted($0.1)) }.sorted { $0.0 < $1.0 })
        case let .array(elements): return .array(elements.map(sorted))
        default: return value
        }
    }

    @Test("every envelope kind and every method, notification and server request case: same JSON as the compiled codec, and back")
    func matchesCompiledCodec() throws {
        for variant in 0..<5 { try check(WireFixtures.Envelope(variant)) }
        for variant in 0..<Wire.Request.Params.fieldNames.count { try check(WireFixtures.Request(variant)) }
        for variant in 0..<Wire.Response.Result.fieldNames.count { try check(WireFixtures.Response(variant)) }
        for variant in 0..<Wire.Notification.Payload.fieldNames.count { try check(WireFixtures.Notification(variant)) }
        for variant in 0..<3 { try check(WireFixtures.ServerRequest(variant)) }
        #expect(schema.messages.count > 90)
    }

    @Test("bad JSON and bad bytes are errors naming what is wrong")
    func errors() throws {
        #expect(throws: WireError.invalidJSON(path: "multi_agent_mode", reason: "'FAST' is not a value of threadwire.v1.MultiAgentMode")) {
            try schema.encode(.object([("multi_agent_mode", .string("FAST"))]), as: "threadwire.v1.ThreadStartParams")
        }
        #expect(throws: WireError.invalidJSON(path: "nope", reason: "threadwire.v1.ThreadStartParams has no field 'nope'")) {
            try schema.encode(.object([("nope", .int(1))]), as: "threadwire.v1.ThreadStartParams")
        }
        #expect(throws: DynamicSchemaError.self) { try schema.decode([0x0A, 0x05, 0x01], as: "threadwire.v1.Envelope") }
        #expect(throws: WireError.invalidUTF8(field: "service")) { try schema.decode([0x0A, 0x02, 0xC3, 0x28], as: "threadwire.v1.HealthCheckParams") }
    }
}
