import Testing
import ThreadwireWire

/// gRPC's health and reflection messages, read and written without their
/// generated code: checked against bytes grpcio's own classes produce, and
/// against bytes that are not those messages.
@Suite("gRPC standard messages")
struct GRPCStandardMessagesTests {
    typealias Messages = GRPCStandardMessages

    @Test("requests as grpcio serializes them are read field by field")
    func readsGrpcioRequests() throws {
        // ServerReflectionRequest(host="h", file_containing_symbol="threadwire.v1.Threadwire")
        let symbol: [UInt8] = [10, 1, 104, 34, 24] + Array("threadwire.v1.Threadwire".utf8)
        let read = try Messages.reflectionRequest(symbol)
        #expect(read.host == "h")
        #expect(read.request == .fileContainingSymbol("threadwire.v1.Threadwire"))
        // file_containing_extension=ExtensionRequest(containing_type="a.B", extension_number=300)
        #expect(try Messages.reflectionRequest([42, 8, 10, 3, 97, 46, 66, 16, 172, 2]).request
                == .fileContainingExtension(type: "a.B", number: 300))
        #expect(try Messages.reflectionRequest([58, 0]).request == .listServices)
        #expect(try Messages.reflectionRequest([]).request == .unknown)
        #expect(try Messages.healthService([10, 3, 120, 46, 89]) == "x.Y")
        #expect(try Messages.healthService([]) == "")
    }

    @Test("responses are byte for byte what grpcio serializes")
    func writesWhatGrpcioWrites() {
        #expect(Messages.reflectionResponse(host: "h", originalRequest: [58, 0], .services(["a.B", "c.D"]))
                == [10, 1, 104, 18, 2, 58, 0, 50, 14, 10, 5, 10, 3, 97, 46, 66, 10, 5, 10, 3, 99, 46, 68])
        #expect(Messages.reflectionResponse(host: "", originalRequest: [58, 0], .error(code: 5, message: "no"))
                == [18, 2, 58, 0, 58, 6, 8, 5, 18, 2, 110, 111])
        #expect(Messages.healthResponse(.notServing) == [8, 2])
    }

    @Test("bytes that are not the message are an error, never a crash: truncation, overlong lengths, bad UTF-8, groups")
    func refusesMalformedBytes() {
        let malformed: [[UInt8]] = [
            [34, 5, 97],                    // a length past the end
            [34, 0xFF, 0xFF, 0xFF, 0xFF, 0x0F],
            [0x80],                         // a truncated key
            [8, 0x80, 0x80],                // a truncated varint
            [34, 2, 0xC3, 0x28],            // not UTF-8
            [11, 0],                        // wire type 3 (a group)
            [0],                            // field number 0
            [13, 1, 2],                     // a fixed32 cut short
            Array(repeating: 0xFF, count: 11) + [1],  // a varint over 64 bits
        ]
        for bytes in malformed {
            #expect(throws: GRPCStandardMessages.MalformedMessage.self, "\(bytes)") { try Messages.reflectionRequest(bytes) }
        }
        #expect(throws: GRPCStandardMessages.MalformedMessage.self) { try Messages.healthService([10, 2, 0xC3, 0x28]) }
        // Nested: the extension request's own fields are checked too.
        #expect(throws: GRPCStandardMessages.MalformedMessage.self) { try Messages.reflectionRequest([42, 3, 10, 5, 97]) }
    }

    @Test("random bytes either read or fail cleanly (a seeded fuzz of 20,000 inputs)")
    func fuzzedBytes() {
        var state: UInt64 = 0x7477_6772_7063
        func next() -> UInt64 {  // xorshift64: the same inputs every run
            state ^= state << 13
            state ^= state >> 7
            state ^= state << 17
            return state
        }
        var read = 0
        for _ in 0..<20_000 {
            let count = Int(next() % 40)
            let bytes = (0..<count).map { _ in UInt8(truncatingIfNeeded: next()) }
            if (try? Messages.reflectionRequest(bytes)) != nil { read += 1 }
            _ = try? Messages.healthService(bytes)
        }
        #expect(read > 0, "some random inputs are valid messages")
    }
}
