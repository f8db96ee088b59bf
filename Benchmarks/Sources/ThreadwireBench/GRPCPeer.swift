import ArgumentParser
import Foundation
import GRPCCore
import GRPCNIOTransportHTTP2
import ThreadwireContract
import ThreadwireCore
import ThreadwireModels
import ThreadwireSQLite
import ThreadwireWire

/// grpc-swift-2 serializers over the same Wire messages, so the comparison
/// isolates the transport (HTTP/2 + gRPC vs threadwire's raw frames).
struct WireSerializer<M: WireMessage>: MessageSerializer {
    func serialize<Bytes: GRPCContiguousBytes>(_ message: M) throws -> Bytes { Bytes(message.serializedBytes()) }
}

struct WireDeserializer<M: WireMessage>: MessageDeserializer {
    func deserialize<Bytes: GRPCContiguousBytes>(_ bytes: Bytes) throws -> M {
        try bytes.withUnsafeBytes { try M(serializedBytes: Array($0)) }
    }
}

enum PeerMethods {
    static let health = MethodDescriptor(fullyQualifiedService: "threadwire.bench.Peer", method: "HealthCheck")
    static let read = MethodDescriptor(fullyQualifiedService: "threadwire.bench.Peer", method: "ThreadRead")
    static let start = MethodDescriptor(fullyQualifiedService: "threadwire.bench.Peer", method: "ThreadStart")
}

/// The peer a user would otherwise pick: a grpc-swift-2 unary service doing
/// the same work (health check; thread/read through the same engine and store).
struct GRPCServerCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "grpc-server")
    @Option var port = 0
    @Option var dataDir: String

    struct NullSink: EventSink { func deliver(_ deliveries: [Delivery]) {} }

    func run() async throws {
        let engine = ThreadEngine(store: try SQLiteThreadStore(directory: dataDir), backend: ScriptedEchoBackend(),
                                  settings: ServerSettings(), sink: NullSink())
        var router = RPCRouter<HTTP2ServerTransport.Posix>()
        router.registerHandler(forMethod: PeerMethods.health, deserializer: WireDeserializer<Wire.HealthCheckParams>(),
                               serializer: WireSerializer<Wire.HealthCheckResult>()) { request, _ in
            for try await _ in request.messages {}
            return StreamingServerResponse(single: ServerResponse(message: Wire.HealthCheckResult(status: .serving)))
        }
        router.registerHandler(forMethod: PeerMethods.read, deserializer: WireDeserializer<Wire.ThreadReadParams>(),
                               serializer: WireSerializer<Wire.ThreadReadResult>()) { request, _ in
            var params = Wire.ThreadReadParams()
            for try await message in request.messages { params = message }
            let view = try await engine.readThread(params.threadId ?? "", includeTurns: params.includeTurns ?? false, includeModelRequests: false)
            let result = Wire.ThreadReadResult(thread: view.wire(baseInstructions: ""), settings: view.settings.wire)
            return StreamingServerResponse(single: ServerResponse(message: result))
        }
        router.registerHandler(forMethod: PeerMethods.start, deserializer: WireDeserializer<Wire.ThreadStartParams>(),
                               serializer: WireSerializer<Wire.ThreadLifecycleResult>()) { request, _ in
            for try await _ in request.messages {}
            let outcome = try await engine.startThread(ThreadEngine.StartRequest(), connection: 0)
            return StreamingServerResponse(single: ServerResponse(message: outcome.value.lifecycleResult(baseInstructions: "")))
        }
        let transport = HTTP2ServerTransport.Posix(address: .ipv4(host: "127.0.0.1", port: port), transportSecurity: .plaintext)
        let server = GRPCServer(transport: transport, router: router)
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { try await server.serve() }
            if let address = try await transport.listeningAddress.ipv4 {
                FileHandle.standardOutput.write(Data("listening on 127.0.0.1:\(address.port)\n".utf8))
            }
            try await group.next()
        }
    }
}
