import Testing
import ThreadwireWire
import ThreadwireWireFixtures

@Suite("protobuf-c codec")
struct CodecTests {
    @Test("every message round-trips through protobuf-c and JSON", arguments: WireFixtures.checks.map(\.name))
    func roundTrip(name: String) throws {
        let check = try #require(WireFixtures.checks.first { $0.name == name })
        #expect(try check.run())
    }

    @Test("a populated message survives encode/decode field for field")
    func populatedEnvelope() throws {
        let request = WireFixtures.Request(12)  // turn/start params
        let bytes = Wire.Envelope(kind: .request(request)).serializedBytes()
        let decoded = try Wire.Envelope(serializedBytes: bytes)
        guard case let .request(back)? = decoded.kind else { Issue.record("not a request"); return }
        #expect(back == request)
        #expect(back.id == 9_223_372_036_854_775_809)
        #expect(back.metadata.first?.key == "key héllo ✓ 0")
    }

    @Test("decoding from borrowed bytes (a slice in the middle of a larger buffer) equals decoding an array")
    func borrowedBytes() throws {
        let request = WireFixtures.Request(12)
        let bytes = Wire.Envelope(kind: .request(request)).serializedBytes()
        // Surrounded by other bytes, as a frame inside a network buffer is.
        let framed = [UInt8](repeating: 0xEE, count: 7) + bytes + [UInt8](repeating: 0xEE, count: 5)
        let borrowed = try framed.withUnsafeBytes { try Wire.Envelope(serializedBytes: UnsafeRawBufferPointer(rebasing: $0[7..<(7 + bytes.count)])) }
        #expect(borrowed == (try Wire.Envelope(serializedBytes: bytes)))
        #expect(throws: WireError.malformed(type: "threadwire.v1.Envelope", byteCount: 3)) {
            try [UInt8]([0x0A, 0xFF, 0xFF]).withUnsafeBytes { try Wire.Envelope(serializedBytes: $0) }
        }
        let empty = try [UInt8]().withUnsafeBytes { try Wire.Envelope(serializedBytes: $0) }
        #expect(empty.kind == nil)
    }

    @Test("a server's inbound decode gives what the Envelope decode gives: the request unboxed, anything else as the Envelope, the same errors")
    func inboundAgreesWithEnvelope() throws {
        func inbound(_ bytes: [UInt8]) throws -> Wire.Envelope.Inbound {
            try bytes.withUnsafeBytes { try Wire.Envelope.inbound(serializedBytes: $0) }
        }
        let request = WireFixtures.Request(12)
        #expect(try inbound(Wire.Envelope(kind: .request(request)).serializedBytes()) == .request(request))
        let others = [
            Wire.Envelope(kind: .response(Wire.Response(id: 3, code: 5, message: "no"))),
            Wire.Envelope(kind: .serverRequestAnswer(Wire.ServerRequestAnswer(id: "a1"))),
            Wire.Envelope(),
        ]
        for envelope in others {
            #expect(try inbound(envelope.serializedBytes()) == .other(envelope))
        }
        #expect(throws: WireError.malformed(type: "threadwire.v1.Envelope", byteCount: 3)) { try inbound([0x0A, 0xFF, 0xFF]) }
        // The request's thread/start model (01 01) made invalid UTF-8: the
        // error names the path from the Envelope, as the Envelope decode's does.
        var bytes = Wire.Envelope(kind: .request(Wire.Request(id: 1, params: .threadStart(Wire.ThreadStartParams(model: "\u{1}\u{1}"))))).serializedBytes()
        let at = try #require(bytes.indices.first { bytes[$0] == 1 && bytes[$0 + 1] == 1 })
        bytes[at] = 0xC3; bytes[at + 1] = 0x28
        #expect(throws: WireError.invalidUTF8(field: "request.thread_start.model")) { try Wire.Envelope(serializedBytes: bytes) }
        #expect(throws: WireError.invalidUTF8(field: "request.thread_start.model")) { try inbound(bytes) }
    }

    @Test("bytes that are not protobuf give a typed malformed error")
    func malformed() {
        #expect(throws: WireError.malformed(type: "threadwire.v1.Envelope", byteCount: 3)) {
            try Wire.Envelope(serializedBytes: [0x0A, 0xFF, 0xFF])
        }
    }

    @Test("invalid UTF-8 in a string field is rejected, naming the field")
    func invalidUTF8() {
        // ThreadStartParams.model (field 1) = FF FE
        #expect(throws: WireError.invalidUTF8(field: "model")) {
            try Wire.ThreadStartParams(serializedBytes: [0x0A, 0x02, 0xFF, 0xFE])
        }
    }

    @Test("an error deep in nested and repeated messages names the whole path")
    func nestedErrorPath() throws {
        let turn = Wire.Turn(id: "t", items: [Wire.ThreadItem(id: "a"), Wire.ThreadItem(id: "\u{1}\u{1}")])
        var bytes = Wire.Envelope(kind: .response(Wire.Response(id: 1, code: 0, result: .threadRead(
            Wire.ThreadReadResult(thread: Wire.Thread(id: "x", turns: [turn])))))).serializedBytes()
        // The second item's id bytes (01 01) become an invalid UTF-8 sequence.
        let at = try #require(bytes.indices.first { bytes[$0] == 1 && bytes[$0 + 1] == 1 })
        bytes[at] = 0xC3; bytes[at + 1] = 0x28
        #expect(throws: WireError.invalidUTF8(field: "response.thread_read.thread.turns.items.id")) {
            try Wire.Envelope(serializedBytes: bytes)
        }
        // Messages far larger than the arena's first (stack) block decode the same,
        // and a string larger than a whole block gets one of its own.
        let big = Wire.ThreadReadResult(thread: Wire.Thread(id: "x", turns: (0..<40).map { index in
            Wire.Turn(id: "turn-\(index)", items: (0..<20).map { Wire.ThreadItem(id: "item-\($0)", text: String(repeating: "x", count: 300)) }
                + [Wire.ThreadItem(text: String(repeating: "y", count: index == 3 ? 40_000 : 1))])
        }))
        #expect(try Wire.ThreadReadResult(serializedBytes: big.serializedBytes()) == big)
    }

    @Test("a JSON string with U+0000 is refused, naming the path, rather than cut short on the wire (found by the json fuzz harness)")
    func jsonNulRefused() throws {
        let json = try JSONValue.parse(#"{"request":{"id":1,"thread_start":{"model":"a\u0000b"}}}"#)
        #expect(throws: WireError.invalidJSON(path: "request.thread_start.model",
                                              reason: "a string may not contain U+0000 (the binary protocol's strings end at NUL)")) {
            try Wire.Envelope(json: json, path: "")
        }
    }

    @Test("an enum number outside the contract is rejected, naming the field")
    func unknownEnum() {
        // ThreadStartParams.multi_agent_mode (field 4, varint) = 9
        #expect(throws: WireError.invalidEnumValue(field: "multi_agent_mode", value: 9)) {
            try Wire.ThreadStartParams(serializedBytes: [0x20, 0x09])
        }
    }

    @Test("presence survives the wire: omitted, set and cleared are distinct")
    func presence() throws {
        let omitted = try Wire.TurnStartParams(serializedBytes: Wire.TurnStartParams(threadId: "t").serializedBytes())
        #expect(omitted.multiAgentModeUpdate == nil)
        let cleared = Wire.TurnStartParams(threadId: "t", multiAgentModeUpdate: .clearMultiAgentMode(true))
        #expect(try Wire.TurnStartParams(serializedBytes: cleared.serializedBytes()) == cleared)
        let zero = Wire.ThreadSettings(multiAgentRuntime: .unspecified)
        #expect(try Wire.ThreadSettings(serializedBytes: zero.serializedBytes()).multiAgentRuntime == .unspecified)
        #expect(try Wire.ThreadSettings(serializedBytes: Wire.ThreadSettings().serializedBytes()).multiAgentRuntime == nil)
    }

    @Test("JSON accepts proto and camelCase names and enum short names")
    func jsonNames() throws {
        let json = try JSONValue.parse(#"{"threadId": "t1", "input": [{"text": "hi"}], "multi_agent_mode": "proactive"}"#)
        let params = try Wire.TurnStartParams(json: json, path: "")
        #expect(params.threadId == "t1")
        #expect(params.input == [Wire.UserInput(content: .text("hi"))])
        #expect(params.multiAgentModeUpdate == .multiAgentMode(.proactive))
    }

    @Test("JSON errors name the path")
    func jsonErrors() throws {
        #expect(throws: WireError.invalidJSON(path: "bogus", reason: "unknown field")) {
            try Wire.ThreadStartParams(json: try JSONValue.parse(#"{"bogus": 1}"#), path: "")
        }
        #expect(throws: WireError.invalidJSON(path: "multi_agent_mode", reason: "more than one field of oneof 'multi_agent_mode_update' is set")) {
            try Wire.TurnStartParams(json: try JSONValue.parse(#"{"multi_agent_mode": "PROACTIVE", "clear_multi_agent_mode": true}"#), path: "")
        }
        #expect(throws: WireError.self) {
            try Wire.ThreadListParams(json: try JSONValue.parse(#"{"limit": -1}"#), path: "")
        }
    }

    @Test("method names derive from oneof field names")
    func methodNames() {
        #expect(Wire.Request.Params.fieldNames.contains("thread_settings_update"))
        #expect(Wire.Request.Params.healthCheck(.init()).fieldName == "health_check")
    }
}
