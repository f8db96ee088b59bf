import Testing
import ThreadwireWire

/// The generated oneofs box their large cases (codegen/gen_swift.py,
/// `INDIRECT_OVER`): a Swift enum is as large as its largest case, and these
/// values are moved whole on every request. Unboxed, an `Envelope` was 522
/// bytes and a `Response` 521, so a health check's tiny answer was memmoved
/// as half a kilobyte several times (issue 54).
@Suite("generated value sizes")
struct ValueSizeTests {
    @Test("the values every request moves (envelope, request, response, notification) stay under 128 bytes")
    func requestPathValuesStaySmall() {
        #expect(MemoryLayout<Wire.Envelope>.size <= 128)
        #expect(MemoryLayout<Wire.Request>.size <= 128)
        #expect(MemoryLayout<Wire.Request.Params>.size <= 128)
        #expect(MemoryLayout<Wire.Response>.size <= 128)
        #expect(MemoryLayout<Wire.Response.Result>.size <= 128)
        #expect(MemoryLayout<Wire.Notification>.size <= 128)
    }

    @Test("a boxed case still decodes and compares by value")
    func boxedCaseRoundTrips() throws {
        var params = Wire.TurnStartParams()
        params.threadId = "thread-1"
        let request = Wire.Request(id: 7, params: .turnStart(params))
        let envelope = Wire.Envelope(kind: .request(request))
        let decoded = try Wire.Envelope(serializedBytes: envelope.serializedBytes())
        #expect(decoded == envelope)
        guard case let .request(decodedRequest)? = decoded.kind, case let .turnStart(decodedParams)? = decodedRequest.params else {
            Issue.record("the envelope lost its request's case: \(decoded)")
            return
        }
        #expect(decodedParams.threadId == "thread-1")
    }
}
