import GRPCCore
import Testing
@testable import ThreadwireGRPC
import ThreadwireWire

/// What a gRPC call's metadata becomes in the frame protocol's request.
@Suite("gRPC call metadata")
struct CallMetadataTests {
    @Test("grpc-timeout in each unit becomes whole milliseconds, rounded up, never 0; other text is refused")
    func timeouts() {
        #expect(CallMetadata.timeoutMilliseconds("1H") == 3_600_000)
        #expect(CallMetadata.timeoutMilliseconds("2M") == 120_000)
        #expect(CallMetadata.timeoutMilliseconds("3S") == 3_000)
        #expect(CallMetadata.timeoutMilliseconds("250m") == 250)
        #expect(CallMetadata.timeoutMilliseconds("1500u") == 2)
        #expect(CallMetadata.timeoutMilliseconds("1n") == 1)
        #expect(CallMetadata.timeoutMilliseconds("99999999H") == UInt32.max)
        for bad in ["", "S", "10", "10s", "123456789S", "-1S", "1.5S", "١S"] {
            #expect(CallMetadata.timeoutMilliseconds(bad) == nil, "\(bad)")
        }
    }

    @Test("deadline, idempotency key and trace context are carried; a malformed grpc-timeout is INVALID_ARGUMENT")
    func request() throws {
        let metadata: Metadata = ["grpc-timeout": "5S", "idempotency-key": "k-1",
                                  "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "other": "x"]
        let request = try CallMetadata.request(.threadList(Wire.ThreadListParams()), metadata: metadata)
        #expect(request.timeoutMs == 5_000)
        #expect(request.idempotencyKey == "k-1")
        #expect(request.metadata == [Wire.KeyValue(key: "traceparent", value: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")])
        #expect(request.params?.methodName == "thread/list")
        let error = #expect(throws: RPCError.self) { try CallMetadata.request(.threadList(Wire.ThreadListParams()), metadata: ["grpc-timeout": "soon"]) }
        #expect(error?.code == .invalidArgument)
    }

    @Test("statuses map 1:1")
    func statuses() {
        for code in 1...16 {
            #expect(CallMetadata.error(code: UInt32(code), message: "m").code.rawValue == code)
        }
        #expect(CallMetadata.error(code: 99, message: "m").code == .unknown)
    }
}
