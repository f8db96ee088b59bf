import GRPCCore
import ThreadwireServer
import ThreadwireWire

/// grpc.health.v1.Health: Check and Watch, for the whole server ("") and
/// for threadwire.v1.Threadwire; NOT_SERVING while the server drains or its
/// store cannot commit, so probes and load balancers stop sending first.
struct HealthService: Sendable {
    static let name = "grpc.health.v1.Health"
    let serving: @Sendable () -> Bool
    /// The listener is shutting down: a Watch ends once it told NOT_SERVING
    /// (the graceful shutdown waits for open calls).
    let stopping: @Sendable () -> Bool
    /// How often Watch looks again (store health has no events to wait on).
    var watchInterval: Duration = .milliseconds(250)

    func status(of service: String) -> GRPCStandardMessages.ServingStatus? {
        guard service.isEmpty || service == WireSchema.serviceName else { return nil }
        return serving() ? .serving : .notServing
    }

    func register<Transport: ServerTransport>(in router: inout RPCRouter<Transport>) {
        router.registerHandler(forMethod: MethodDescriptor(fullyQualifiedService: Self.name, method: "Check"),
                               deserializer: RawMessage(), serializer: RawMessage()) { request, _ in
            let service = try Self.service(try await CallMetadata.single(request.messages, rpc: "Check"))
            guard let status = status(of: service) else { throw RPCError(code: .notFound, message: "no service named '\(service)' here") }
            return StreamingServerResponse(single: ServerResponse(message: GRPCStandardMessages.healthResponse(status)))
        }
        router.registerHandler(forMethod: MethodDescriptor(fullyQualifiedService: Self.name, method: "Watch"),
                               deserializer: RawMessage(), serializer: RawMessage()) { request, _ in
            let service = try Self.service(try await CallMetadata.single(request.messages, rpc: "Watch"))
            return StreamingServerResponse { writer in
                var last: GRPCStandardMessages.ServingStatus?
                while !Task.isCancelled {
                    let ending = stopping()
                    let now = status(of: service) ?? .serviceUnknown
                    if now != last {
                        try await writer.write(GRPCStandardMessages.healthResponse(now))
                        last = now
                    }
                    if ending { break }
                    try await Task.sleep(for: watchInterval)
                }
                return [:]
            }
        }
    }

    private static func service(_ message: [UInt8]) throws -> String {
        do {
            return try GRPCStandardMessages.healthService(message)
        } catch {
            throw RPCError(code: .invalidArgument, message: "not a HealthCheckRequest: \(error)")
        }
    }
}

/// grpc.reflection.v1.ServerReflection (and v1alpha, the same messages):
/// the files of proto/ as the server was compiled from them, so grpcurl,
/// grpcio's reflection client and the like need no .proto file.
enum ReflectionService {
    static let names = ["grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection"]

    static func register<Transport: ServerTransport>(in router: inout RPCRouter<Transport>) {
        for name in names {
            router.registerHandler(forMethod: MethodDescriptor(fullyQualifiedService: name, method: "ServerReflectionInfo"),
                                   deserializer: RawMessage(), serializer: RawMessage()) { request, _ in
                StreamingServerResponse { writer in
                    for try await message in request.messages {
                        let parsed: (host: String, request: GRPCStandardMessages.ReflectionRequest)
                        do {
                            parsed = try GRPCStandardMessages.reflectionRequest(message)
                        } catch {
                            throw RPCError(code: .invalidArgument, message: "not a ServerReflectionRequest: \(error)")
                        }
                        try await writer.write(GRPCStandardMessages.reflectionResponse(
                            host: parsed.host, originalRequest: message, answer(parsed.request)))
                    }
                    return [:]
                }
            }
        }
    }

    static func answer(_ request: GRPCStandardMessages.ReflectionRequest) -> GRPCStandardMessages.ReflectionAnswer {
        switch request {
        case .listServices:
            return .services([WireSchema.serviceName, HealthService.name] + names)
        case let .fileByFilename(name):
            guard let file = WireSchema.descriptorFiles.first(where: { $0.name == name }) else {
                return .error(code: Int32(Status.Code.notFound.rawValue), message: "no file named '\(name)' here")
            }
            return .files(withDependencies(file))
        case let .fileContainingSymbol(symbol):
            guard let file = WireSchema.descriptorFiles.first(where: { $0.symbols.contains(symbol) }) else {
                return .error(code: Int32(Status.Code.notFound.rawValue), message: "no symbol named '\(symbol)' here")
            }
            return .files(withDependencies(file))
        case let .fileContainingExtension(type, number):
            return .error(code: Int32(Status.Code.notFound.rawValue), message: "no extension \(number) of '\(type)': proto/ defines no extensions")
        case let .allExtensionNumbersOfType(type):
            guard WireSchema.descriptorFiles.contains(where: { $0.symbols.contains(type) }) else {
                return .error(code: Int32(Status.Code.notFound.rawValue), message: "no type named '\(type)' here")
            }
            return .extensionNumbers(type: type)
        case .unknown:
            return .error(code: Int32(Status.Code.unimplemented.rawValue), message: "this server does not know that reflection request")
        }
    }

    /// The file first, then every file it needs, each once.
    private static func withDependencies(_ file: WireSchema.DescriptorFile) -> [ArraySlice<UInt8>] {
        var order: [WireSchema.DescriptorFile] = []
        var seen: Set<String> = []
        func visit(_ file: WireSchema.DescriptorFile) {
            guard seen.insert(file.name).inserted else { return }
            order.append(file)
            for dependency in file.dependencies {
                if let found = WireSchema.descriptorFiles.first(where: { $0.name == dependency }) { visit(found) }
            }
        }
        visit(file)
        return order.map { WireSchema.fileDescriptorSet[$0.bytes] }
    }
}
