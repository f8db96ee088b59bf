import GRPCCore
import NIOCore
import enum ThreadwireTransport.FrameSession
import enum ThreadwireTransport.InProcessTransportError
import ThreadwireCore
import ThreadwireWire

/// The streams of threadwire.v1.Threadwire. Each is a frame-protocol
/// connection made inside the process (`ThreadwireServer.connectInProcess`),
/// so a stream has every rule of a connection: ordering, limits, the
/// notification backlog, flow control, drain. gRPC's own flow control pushes
/// back on the bridge: it reads the next frame only once the client took the
/// last message, so a client that does not read fills the connection's
/// backlog and is cut off like any slow subscriber.
struct StreamServices: Sendable {
    let connect: @Sendable (Principal?) async throws -> Int32
    let maxFrameBytes: Int
    let identify: CallMetadata.Identify

    typealias Bridge = FrameSession.Channel

    func register<Transport: ServerTransport>(in router: inout RPCRouter<Transport>) {
        router.registerHandler(forMethod: MethodDescriptor(fullyQualifiedService: WireSchema.serviceName, method: "Connect"),
                               deserializer: RawMessage(), serializer: RawMessage()) { request, context in
            let certified = identify.principal(context)
            return StreamingServerResponse { writer in
                try await session(request.messages, writer, certified: certified)
                return [:]
            }
        }
        router.registerHandler(forMethod: MethodDescriptor(fullyQualifiedService: WireSchema.serviceName, method: "Subscribe"),
                               deserializer: RawMessage(), serializer: RawMessage()) { request, context in
            let message = try await CallMetadata.single(request.messages, rpc: "Subscribe")
            let params: Wire.ThreadSubscribeParams
            do {
                params = try Wire.ThreadSubscribeParams(serializedBytes: message)
            } catch {
                throw RPCError(code: .invalidArgument, message: "the Subscribe request is not a valid ThreadSubscribeParams: \(error)")
            }
            let caller = CallMetadata.caller(request.metadata, context: context, identify: identify)
            return StreamingServerResponse { writer in
                try await subscribe(params, token: caller.bearerToken, certified: caller.certificatePrincipal, writer)
                return [:]
            }
        }
    }

    /// Connect: envelopes both ways until the client cancels or the server ends the session.
    private func session(_ messages: RPCAsyncSequence<[UInt8], any Error>, _ writer: RPCWriter<[UInt8]>,
                         certified: Principal?) async throws {
        let bridge = try await open(certified)
        try await bridge.executeThenClose { inbound, outbound in
            try await withThrowingTaskGroup(of: Void.self) { group in
                group.addTask {
                    // A client that half-closes still hears its answers: the
                    // session lasts until the call is cancelled or the server closes it.
                    for try await message in messages { try await outbound.write(message) }
                }
                for try await frame in inbound {
                    try await writer.write(Array(frame.readableBytesView))
                }
                group.cancelAll()
            }
        }
    }

    /// Subscribe: initialize (with the call's bearer token) and
    /// thread/subscribe pipelined, then the notifications.
    private func subscribe(_ params: Wire.ThreadSubscribeParams, token: String?, certified: Principal?,
                           _ writer: RPCWriter<[UInt8]>) async throws {
        let bridge = try await open(certified)
        try await bridge.executeThenClose { inbound, outbound in
            var hello = Wire.InitializeParams()
            hello.clientInfo = Wire.ClientInfo(name: "grpc-subscribe")
            hello.authToken = token
            try await outbound.write(Self.request(1, .initialize(hello)))
            try await outbound.write(Self.request(2, .threadSubscribe(params)))
            for try await frame in inbound {
                let bytes = Array(frame.readableBytesView)[...]
                if let notification = Wire.Envelope.notificationBytes(bytes) {
                    try await writer.write(Array(notification))
                    continue
                }
                guard case let .response(response)? = try Wire.Envelope(serializedBytes: Array(bytes)).kind else { continue }
                if let code = response.code, code != 0 {
                    throw CallMetadata.error(code: code, message: response.message ?? "")
                }
            }
        }
        // The server ended the connection without a word the subscriber can
        // still read (a last frame cannot pass a backlog that is full).
        throw RPCError(code: .unavailable, message: "the server ended this subscription (it is shutting down, or the subscriber fell "
            + "max_notification_backlog_bytes behind); subscribe again with after_thread_sequence to resume")
    }

    private static func request(_ id: UInt64, _ params: Wire.Request.Params) -> [UInt8] {
        var request = Wire.Request()
        request.id = id
        request.params = params
        return Wire.Envelope(kind: .request(request)).serializedBytes()
    }

    private func open(_ certified: Principal?) async throws -> Bridge {
        let socket: Int32
        do {
            socket = try await connect(certified)
        } catch let error as InProcessTransportError {
            guard case .outOfDescriptors = error else {
                throw RPCError(code: .unavailable, message: "the server takes no new sessions now (starting or shutting down)")
            }
            throw RPCError(code: .unavailable, message: "\(error); try again later")
        } catch {
            throw RPCError(code: .unavailable, message: "the server takes no new sessions now (starting or shutting down)")
        }
        do {
            return try await FrameSession.open(socket: socket, maxFrameBytes: maxFrameBytes)
        } catch {
            throw RPCError(code: .unavailable, message: "could not open a session: \(error)")
        }
    }
}
