import Foundation
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
        router.registerHandler(forMethod: MethodDescriptor(fullyQualifiedService: WireSchema.serviceName, method: "ThreadImportStream"),
                               deserializer: RawMessage(), serializer: RawMessage()) { request, context in
            let caller = CallMetadata.caller(request.metadata, context: context, identify: identify)
            let result = try await importStream(request.messages, metadata: request.metadata, caller: caller, calls: calls)
            return StreamingServerResponse(single: ServerResponse(message: result))
        }
    }

    /// ThreadImportStream: one rollout file as a stream of pieces, carried
    /// out as thread/import's pieces (the server numbers them under an
    /// import id of its own), the file imported when the client half-closes.
    /// Only the pieces in flight are held: gRPC reads the next message once
    /// this one is parsed.
    static func importStream(_ messages: RPCAsyncSequence<[UInt8], any Error>, metadata: Metadata,
                             caller: UnaryCalls.Caller, calls: UnaryCalls) async throws -> [UInt8] {
        var piece = Wire.ThreadImportParams(importId: UUID().uuidString)
        var linesSent: UInt64 = 0
        var first = true
        func send(_ piece: Wire.ThreadImportParams) async throws -> [UInt8] {
            switch await calls.call(try CallMetadata.request(.threadImport(piece), metadata: metadata), caller: caller) {
            case let .result(result): return result.messageBytes
            case let .encoded(encoded): return Array(encoded.messageBytes)
            case let .failed(code, message): throw CallMetadata.error(code: code, message: message)
            }
        }
        for try await message in messages {
            let next: Wire.ThreadImportParams
            do {
                next = try Wire.ThreadImportParams(serializedBytes: message)
            } catch {
                throw RPCError(code: .invalidArgument, message: "a ThreadImportStream message is not a valid ThreadImportParams: \(error)")
            }
            guard next.importId == nil, next.firstLine == nil, next.last == nil else {
                throw RPCError(code: .invalidArgument, message: "ThreadImportStream numbers its pieces itself: leave import_id, first_line and last unset")
            }
            if first {
                piece.fileName = next.fileName
                piece.strict = next.strict
                first = false
            } else if next.fileName != nil && next.fileName != piece.fileName || next.strict != nil && next.strict != piece.strict {
                throw RPCError(code: .invalidArgument, message: "file_name and strict belong to the stream's first message; later ones repeat them or leave them unset")
            }
            piece.lines = next.lines
            piece.firstLine = linesSent + 1
            _ = try await send(piece)
            linesSent += UInt64(next.lines.count)
        }
        piece.lines = []
        piece.firstLine = linesSent + 1
        piece.last = true
        return try await send(piece)
    }
}

/// Messages pass through as bytes: protobuf-c (through the Wire wrapper)
/// stays the only codec.
struct RawMessage: MessageSerializer, MessageDeserializer {
    func serialize<Bytes: GRPCContiguousBytes>(_ message: [UInt8]) throws -> Bytes { Bytes(message) }
    func deserialize<Bytes: GRPCContiguousBytes>(_ bytes: Bytes) throws -> [UInt8] { bytes.withUnsafeBytes { Array($0) } }
}
