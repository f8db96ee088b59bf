import GRPCCore
import GRPCNIOTransportHTTP2
import ThreadwireTransport
import ThreadwireCore
import ThreadwireServer
import ThreadwireWire

/// What a gRPC call's metadata says, as the frame protocol's request says it.
enum CallMetadata {
    /// A unary call's one message (the client sent exactly one).
    static func single(_ messages: RPCAsyncSequence<[UInt8], any Error>, rpc: String) async throws -> [UInt8] {
        var first: [UInt8]?
        for try await message in messages {
            guard first == nil else { throw RPCError(code: .invalidArgument, message: "\(rpc) is unary: send one request message") }
            first = message
        }
        guard let first else { throw RPCError(code: .invalidArgument, message: "\(rpc) is unary: send one request message") }
        return first
    }

    /// `grpc-timeout` → timeout_ms, `idempotency-key` → idempotency_key,
    /// `traceparent`/`tracestate` → the request's metadata.
    static func request(_ params: Wire.Request.Params, metadata: Metadata) throws -> Wire.Request {
        var request = Wire.Request()
        request.params = params
        if let timeout = metadata[stringValues: "grpc-timeout"].first(where: { _ in true }) {
            guard let milliseconds = timeoutMilliseconds(timeout) else {
                throw RPCError(code: .invalidArgument, message: "grpc-timeout '\(timeout)' is not 1 to 8 digits and a unit (H, M, S, m, u or n)")
            }
            request.timeoutMs = milliseconds
        }
        if let key = metadata[stringValues: "idempotency-key"].first(where: { _ in true }) {
            request.idempotencyKey = key
        }
        for name in ["traceparent", "tracestate"] {
            if let value = metadata[stringValues: name].first(where: { _ in true }) {
                request.metadata.append(Wire.KeyValue(key: name, value: value))
            }
        }
        return request
    }

    /// gRPC's timeout format: at most 8 digits and a unit. Rounded up to
    /// whole milliseconds (a deadline is never shortened to 0).
    static func timeoutMilliseconds(_ text: String) -> UInt32? {
        guard let unit = text.last, text.count >= 2, text.count <= 9 else { return nil }
        let digits = text.dropLast()
        guard digits.allSatisfy(\.isASCII), digits.allSatisfy(\.isNumber), let value = UInt64(digits) else { return nil }
        let nanosecondsPerUnit: UInt64
        switch unit {
        case "H": nanosecondsPerUnit = 3_600_000_000_000
        case "M": nanosecondsPerUnit = 60_000_000_000
        case "S": nanosecondsPerUnit = 1_000_000_000
        case "m": nanosecondsPerUnit = 1_000_000
        case "u": nanosecondsPerUnit = 1_000
        case "n": nanosecondsPerUnit = 1
        default: return nil
        }
        let (nanoseconds, overflow) = value.multipliedReportingOverflow(by: nanosecondsPerUnit)
        let milliseconds = overflow ? UInt64.max : (nanoseconds + 999_999) / 1_000_000
        return UInt32(clamping: max(1, milliseconds))
    }

    /// How a caller's verified client certificate names its principal (nil:
    /// no client certificates are asked for).
    struct Identify: Sendable {
        let source: ClientCertificate.PrincipalSource?

        func principal(_ context: ServerContext?) -> Principal? {
            guard let source, let posix = context?.transportSpecific as? HTTP2ServerTransport.Posix.Context,
                  let certificate = posix.peerCertificate else { return nil }
            return ClientCertificate.principal(of: certificate, from: source)
        }
    }

    /// The caller: its bearer token, its certificate's principal, where it called from.
    static func caller(_ metadata: Metadata, context: ServerContext?, identify: Identify) -> UnaryCalls.Caller {
        var token: String?
        if let authorization = metadata[stringValues: "authorization"].first(where: { _ in true }) {
            let parts = authorization.split(separator: " ", maxSplits: 1)
            // A header that is not "Bearer TOKEN" is a token that fails.
            token = parts.count == 2 && parts[0].lowercased() == "bearer" ? String(parts[1]) : authorization
        }
        return UnaryCalls.Caller(bearerToken: token, certificatePrincipal: identify.principal(context), peer: context?.remotePeer ?? "?")
    }

    /// The frame protocol's status, 1:1.
    static func error(code: UInt32, message: String) -> RPCError {
        let status = Status.Code(rawValue: Int(code)).flatMap(RPCError.Code.init) ?? .unknown
        return RPCError(code: status, message: message)
    }
}
