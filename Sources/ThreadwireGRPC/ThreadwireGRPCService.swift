import GRPCCore
import ThreadwireCore
import ThreadwireServer
import ThreadwireWire

/// service threadwire.v1.Threadwire: each rpc of proto/threadwire/v1/service.proto
/// (the table codegen makes of it) handed to the same call layer as the
/// frame protocol. Nothing here is particular to a method.
enum ThreadwireGRPCService {
    static func register<Transport: ServerTransport>(in router: inout RPCRouter<Transport>, calls: UnaryCalls, identify: CallMetadata.Identify) {
        for method in WireSchema.serviceMethods {
            router.registerHandler(forMethod: MethodDescriptor(fullyQualifiedService: WireSchema.serviceName, method: method.rpc),
                                   deserializer: RawMessage(), serializer: RawMessage()) { request, context in
                let message = try await CallMetadata.single(request.messages, rpc: method.rpc)
                let params: Wire.Request.Params
                do {
                    params = try method.params(message)
                } catch {
                    throw RPCError(code: .invalidArgument, message: "the \(method.rpc) request is not a valid message: \(error)")
                }
                let wireRequest = try CallMetadata.request(params, metadata: request.metadata)
                switch await calls.call(wireRequest, caller: CallMetadata.caller(request.metadata, context: context, identify: identify)) {
                case let .result(result):
                    return StreamingServerResponse(single: ServerResponse(message: result.messageBytes))
                case let .encoded(encoded):
                    return StreamingServerResponse(single: ServerResponse(message: Array(encoded.messageBytes)))
                case let .failed(code, message):
                    throw CallMetadata.error(code: code, message: message)
                }
            }
        }
    }
}

/// Messages pass through as bytes: protobuf-c (through the Wire wrapper)
/// stays the only codec.
struct RawMessage: MessageSerializer, MessageDeserializer {
    func serialize<Bytes: GRPCContiguousBytes>(_ message: [UInt8]) throws -> Bytes { Bytes(message) }
    func deserialize<Bytes: GRPCContiguousBytes>(_ bytes: Bytes) throws -> [UInt8] { bytes.withUnsafeBytes { Array($0) } }
}
