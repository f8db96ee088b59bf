import NIOConcurrencyHelpers
public import NIOCore
import NIOPosix
import NIOSSL
public import ThreadwireNIO
public import ThreadwireWire

public enum ClientError: Error, Equatable, CustomStringConvertible {
    /// The server answered with a non-OK status.
    case status(code: UInt32, message: String)
    case connectionClosed
    case unexpectedResult(String)

    public var description: String {
        switch self {
        case let .status(code, message): return "status \(code): \(message)"
        case .connectionClosed: return "the connection closed before the response arrived"
        case let .unexpectedResult(what): return "unexpected result: \(what)"
        }
    }
}

/// TLS for a client connection: the server is verified against `caFile`
/// (the system's roots when nil); `certificateFile` and `keyFile` present a
/// client certificate (mutual TLS).
public struct ClientTLS: Sendable {
    public var caFile: String?
    public var certificateFile: String?
    public var keyFile: String?
    /// The name checked against the server certificate (default: the host).
    public var serverName: String?

    public init(caFile: String? = nil, certificateFile: String? = nil, keyFile: String? = nil, serverName: String? = nil) {
        self.caFile = caFile
        self.certificateFile = certificateFile
        self.keyFile = keyFile
        self.serverName = serverName
    }

    func makeContext() throws -> NIOSSLContext {
        var configuration = TLSConfiguration.makeClientConfiguration()
        configuration.minimumTLSVersion = .tlsv12
        if let caFile { configuration.trustRoots = .certificates(try NIOSSLCertificate.fromPEMFile(caFile)) }
        if let certificateFile, let keyFile {
            configuration.certificateChain = try NIOSSLCertificate.fromPEMFile(certificateFile).map { .certificate($0) }
            configuration.privateKey = .privateKey(try NIOSSLPrivateKey(file: keyFile, format: .pem))
        }
        return try NIOSSLContext(configuration: configuration)
    }
}

/// A threadwire connection: pipelined calls matched by id, plus the stream of
/// notifications and of responses that carry no id (protocol errors).
public final class ThreadwireClient: Sendable {
    private let channel: any Channel
    private let state: ClientState
    public let notifications: AsyncStream<Wire.Notification>
    /// Responses the server could not tie to a request (undecodable frames, framing errors).
    public let unmatchedResponses: AsyncStream<Wire.Response>
    /// Calls the server makes to this client (declare them in `initialize`);
    /// answer each with `answer(_:)`, or let `serveClientTools` do it.
    public let serverRequests: AsyncStream<Wire.ServerRequest>

    public static func connect(host: String, port: Int, maxFrameBytes: Int = Framing.defaultMaxFrameBytes,
                               tls: ClientTLS? = nil) async throws -> ThreadwireClient {
        let tlsContext = try tls?.makeContext()
        let serverName = tls.map { $0.serverName ?? host }
        return try await open(maxFrameBytes: maxFrameBytes, tls: tlsContext.map { ($0, serverName) }) { bootstrap in
            try await bootstrap.channelOption(.socketOption(.tcp_nodelay), value: 1).connect(host: host, port: port).get()
        }
    }

    /// A client on a socket already connected to a server (the caller's end
    /// of an in-process server's socket pair); the client owns it from now on.
    public static func connect(socket: Int32, maxFrameBytes: Int = Framing.defaultMaxFrameBytes) async throws -> ThreadwireClient {
        try await open(maxFrameBytes: maxFrameBytes, tls: nil) { bootstrap in
            try await bootstrap.withConnectedSocket(socket).get()
        }
    }

    private static func open(maxFrameBytes: Int, tls: (NIOSSLContext, String?)?,
                             connect: (ClientBootstrap) async throws -> any Channel) async throws -> ThreadwireClient {
        let (notifications, notificationSink) = AsyncStream<Wire.Notification>.makeStream()
        let (unmatched, unmatchedSink) = AsyncStream<Wire.Response>.makeStream()
        let (serverRequests, serverRequestSink) = AsyncStream<Wire.ServerRequest>.makeStream()
        let state = ClientState(notifications: notificationSink, unmatched: unmatchedSink, serverRequests: serverRequestSink)
        let bootstrap = ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    if let (tlsContext, serverName) = tls {
                        // SNI is for names only; an address is verified without it.
                        let name = serverName.flatMap { (try? SocketAddress(ipAddress: $0, port: 0)) == nil ? $0 : nil }
                        try channel.pipeline.syncOperations.addHandler(
                            try NIOSSLClientHandler(context: tlsContext, serverHostname: name))
                    }
                    try channel.pipeline.syncOperations.addHandlers([
                        ByteToMessageHandler(FrameDecoder(maxFrameBytes: maxFrameBytes)),
                        MessageToByteHandler(FrameEncoder()),
                        ClientHandler(state: state),
                    ])
                }
            }
        let channel = try await connect(bootstrap)
        return ThreadwireClient(channel: channel, state: state, notifications: notifications, unmatched: unmatched,
                                serverRequests: serverRequests)
    }

    private init(channel: any Channel, state: ClientState, notifications: AsyncStream<Wire.Notification>, unmatched: AsyncStream<Wire.Response>,
                 serverRequests: AsyncStream<Wire.ServerRequest>) {
        self.channel = channel
        self.state = state
        self.notifications = notifications
        self.unmatchedResponses = unmatched
        self.serverRequests = serverRequests
    }

    /// A client nobody holds any more closes its connection, as a file
    /// handle does: otherwise the socket stays open (the event loop holds
    /// the channel) until the server's idle timeout.
    deinit {
        channel.close(promise: nil)
    }

    /// Sends the answer of a server request (the first valid answer counts;
    /// the server confirms with server_request/resolved).
    public func answer(_ answer: Wire.ServerRequestAnswer) async throws {
        try await channel.writeAndFlush(Wire.Envelope(kind: .serverRequestAnswer(answer)).serializedBytes()).get()
    }

    /// What a client answers server requests with; a request of a kind with
    /// no handler gets status UNIMPLEMENTED.
    public struct ServerRequestHandlers: Sendable {
        public var toolCall: (@Sendable (Wire.ServerRequest, Wire.ToolCallParams) async throws -> Wire.ToolCallResult)?
        public var approval: (@Sendable (Wire.ServerRequest, Wire.ApprovalParams) async throws -> Wire.ApprovalResult)?
        public var userInput: (@Sendable (Wire.ServerRequest, Wire.UserInputParams) async throws -> Wire.UserInputResult)?
        public init(
            toolCall: (@Sendable (Wire.ServerRequest, Wire.ToolCallParams) async throws -> Wire.ToolCallResult)? = nil,
            approval: (@Sendable (Wire.ServerRequest, Wire.ApprovalParams) async throws -> Wire.ApprovalResult)? = nil,
            userInput: (@Sendable (Wire.ServerRequest, Wire.UserInputParams) async throws -> Wire.UserInputResult)? = nil
        ) {
            self.toolCall = toolCall
            self.approval = approval
            self.userInput = userInput
        }
    }

    /// Serves server requests with `handlers`, each on a task of its own (a
    /// slow tool or a user thinking does not hold up the others), until the
    /// connection closes. A handler that throws answers with status INTERNAL
    /// and the error as the message. Declare the matching capabilities in
    /// `initialize`. `serverRequests` has one reader: this task.
    @discardableResult
    public func serve(_ handlers: ServerRequestHandlers) -> Task<Void, Never> {
        let requests = serverRequests
        return Task {
            await withTaskGroup(of: Void.self) { group in
                for await request in requests {
                    group.addTask {
                        var answer = Wire.ServerRequestAnswer(id: request.id, code: 0)
                        do {
                            switch request.params {
                            case let .itemToolCall(call)? where handlers.toolCall != nil:
                                answer.result = .itemToolCall(try await handlers.toolCall!(request, call))
                            case let .itemToolRequestApproval(approval)? where handlers.approval != nil:
                                answer.result = .itemToolRequestApproval(try await handlers.approval!(request, approval))
                            case let .itemToolRequestUserInput(input)? where handlers.userInput != nil:
                                answer.result = .itemToolRequestUserInput(try await handlers.userInput!(request, input))
                            default:
                                answer.code = 12
                                answer.message = "this client has no handler for \(request.params?.methodName ?? "this request")"
                            }
                        } catch {
                            answer.code = 13
                            answer.message = "\(error)"
                        }
                        try? await self.answer(answer)
                    }
                }
            }
        }
    }

    /// Serves `item/tool/call` requests only (see `serve`).
    @discardableResult
    public func serveClientTools(_ handler: @escaping @Sendable (Wire.ServerRequest, Wire.ToolCallParams) async throws -> Wire.ToolCallResult) -> Task<Void, Never> {
        serve(ServerRequestHandlers(toolCall: handler))
    }

    /// Sends one request and waits for its response (any status). With
    /// `timeoutMs` the server is told the deadline and the wait ends there
    /// too: no answer by then is a DEADLINE_EXCEEDED (4) response made here
    /// (a late answer is dropped).
    /// `idempotencyKey` (Request.idempotency_key) makes a mutation safe to send again.
    public func call(_ params: Wire.Request.Params?, timeoutMs: UInt32? = nil, metadata: [Wire.KeyValue] = [],
                     idempotencyKey: String? = nil) async throws -> Wire.Response {
        try await call(params, timeoutMs: timeoutMs, metadata: metadata, idempotencyKey: idempotencyKey, written: {})
    }

    /// Sends every request before waiting for any (one connection, in this
    /// order) and returns their responses in the same order.
    public func pipeline(_ requests: [(params: Wire.Request.Params, timeoutMs: UInt32?)]) async throws -> [Wire.Response] {
        var waiting: [Task<Wire.Response, any Error>] = []
        waiting.reserveCapacity(requests.count)
        for request in requests {
            // The next request is written only after this one: tasks start in any order.
            let (written, signal) = AsyncStream<Void>.makeStream()
            waiting.append(Task {
                defer { signal.finish() }
                return try await self.call(request.params, timeoutMs: request.timeoutMs, metadata: [], idempotencyKey: nil,
                                           written: { signal.finish() })
            })
            for await _ in written {}
        }
        var responses: [Wire.Response] = []
        responses.reserveCapacity(waiting.count)
        for task in waiting { responses.append(try await task.value) }
        return responses
    }

    private func call(_ params: Wire.Request.Params?, timeoutMs: UInt32?, metadata: [Wire.KeyValue], idempotencyKey: String?,
                      written: @escaping @Sendable () -> Void) async throws -> Wire.Response {
        let calls = state.calls
        do {
            return try await calls.call(deadline: timeoutMs.map { .milliseconds(Int64($0)) }) { id in
                let request = Wire.Request(id: id, timeoutMs: timeoutMs, metadata: metadata, idempotencyKey: idempotencyKey, params: params)
                channel.writeAndFlush(Wire.Envelope(kind: .request(request)).serializedBytes()).whenFailure { _ in
                    calls.fail(id, CallFailure.connectionClosed)
                }
                written()
            }
        } catch CallFailure.connectionClosed {
            throw ClientError.connectionClosed
        } catch let CallFailure.deadlineExceeded(milliseconds) {
            return Wire.Response(code: 4, message: "no response within \(milliseconds) ms (the client's deadline)")
        }
    }

    /// Sends a Request serialized elsewhere (see `DynamicSchema.requestEnvelope`)
    /// under an id of the client's choosing and returns its response's Envelope
    /// as received: for methods this client's compiled contract lacks, whose
    /// results it could not decode. `envelope(id)` builds the bytes for the id.
    public func callRaw(timeoutMs: UInt32? = nil, envelope: @escaping @Sendable (UInt64) -> [UInt8]) async throws -> [UInt8] {
        let raw = state.rawCalls
        do {
            return try await raw.call(deadline: timeoutMs.map { .milliseconds(Int64($0)) }) { id in
                channel.writeAndFlush(envelope(ClientState.rawIDBit | id)).whenFailure { _ in
                    raw.fail(id, CallFailure.connectionClosed)
                }
            }
        } catch CallFailure.connectionClosed {
            throw ClientError.connectionClosed
        }
    }

    /// Sends one request and returns its result, throwing on a non-OK status.
    public func result(_ params: Wire.Request.Params, timeoutMs: UInt32? = nil) async throws -> Wire.Response.Result {
        let response = try await call(params, timeoutMs: timeoutMs)
        guard response.code ?? 0 == 0 else { throw ClientError.status(code: response.code ?? 0, message: response.message ?? "") }
        guard let result = response.result else { throw ClientError.unexpectedResult("OK without a result") }
        return result
    }

    /// Writes raw bytes (tests and tools that replay captured frames).
    public func sendRaw(_ bytes: [UInt8]) async throws {
        var buffer = channel.allocator.buffer(capacity: bytes.count)
        buffer.writeBytes(bytes)
        // Written from the decoder's position, which is before the frame
        // encoder: these bytes are already framed.
        try await channel.pipeline.context(handlerType: ByteToMessageHandler<FrameDecoder>.self).flatMap { context in
            context.writeAndFlush(NIOAny(buffer))
        }.get()
    }

    /// initialize with a client name.
    @discardableResult
    public func initialize(name: String = "threadwire-swift", optOut: [String] = [], authToken: String? = nil,
                           peer: Wire.PeerHello? = nil, clientTools: Bool = false, approvals: Bool = false,
                           userInput: Bool = false) async throws -> Wire.InitializeResult {
        let result = try await self.result(.initialize(Wire.InitializeParams(
            clientInfo: Wire.ClientInfo(name: name, version: "0.1.0"), protocolVersion: 1,
            capabilities: Wire.Capabilities(optOutNotificationMethods: optOut, clientTools: clientTools ? true : nil,
                                            approvals: approvals ? true : nil, userInput: userInput ? true : nil),
            authToken: authToken, peer: peer)))
        guard case let .initialize(value) = result else { throw ClientError.unexpectedResult("\(result)") }
        return value
    }

    public var isActive: Bool { channel.isActive }

    public func close() async {
        try? await channel.close()
    }

    /// Completes when the server closes the connection.
    public func waitUntilClosed() async {
        try? await channel.closeFuture.get()
    }
}

final class ClientState: Sendable {
    /// This client's requests waiting for their responses.
    let calls = PendingCalls<Wire.Response>()
    /// Raw calls (`callRaw`): ids with the top bit set, answered with the
    /// response's serialized Envelope.
    let rawCalls = PendingCalls<[UInt8]>()
    static let rawIDBit: UInt64 = 1 << 63
    let notifications: AsyncStream<Wire.Notification>.Continuation
    let unmatched: AsyncStream<Wire.Response>.Continuation
    let serverRequests: AsyncStream<Wire.ServerRequest>.Continuation

    init(notifications: AsyncStream<Wire.Notification>.Continuation, unmatched: AsyncStream<Wire.Response>.Continuation,
         serverRequests: AsyncStream<Wire.ServerRequest>.Continuation) {
        self.notifications = notifications
        self.unmatched = unmatched
        self.serverRequests = serverRequests
    }

    func resolve(_ response: Wire.Response) {
        guard let id = response.id, calls.resolve(id, with: response) else {
            unmatched.yield(response)
            return
        }
    }

    func closeAll() {
        calls.closeAll()
        rawCalls.closeAll()
        notifications.finish()
        unmatched.finish()
        serverRequests.finish()
    }
}

final class ClientHandler: ChannelInboundHandler, Sendable {
    typealias InboundIn = ByteBuffer

    let state: ClientState
    init(state: ClientState) { self.state = state }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        var payload = unwrapInboundIn(data)
        let bytes = payload.readBytes(length: payload.readableBytes) ?? []
        guard let envelope = try? Wire.Envelope(serializedBytes: bytes) else { return }
        switch envelope.kind {
        case let .response(response)? where (response.id ?? 0) & ClientState.rawIDBit != 0:
            state.rawCalls.resolve(response.id! & ~ClientState.rawIDBit, with: bytes)
        case let .response(response)?: state.resolve(response)
        case let .notification(notification)?: state.notifications.yield(notification)
        case let .serverRequest(request)?: state.serverRequests.yield(request)
        default: break
        }
    }

    func channelInactive(context: ChannelHandlerContext) {
        state.closeAll()
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        context.close(promise: nil)
    }
}
