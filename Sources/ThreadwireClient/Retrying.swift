import Foundation
import NIOConcurrencyHelpers
public import ThreadwireWire

/// When and how often a call is sent again, as gRPC's retry policy has it:
/// up to `maxAttempts` in all, after UNAVAILABLE (the server was draining,
/// moving a thread, cut off from its store) or a lost connection, with
/// exponential backoff and full jitter. A mutation is sent with one
/// idempotency key on every attempt, so the server applies it once however
/// many attempts reach it.
public struct RetryPolicy: Sendable {
    public var maxAttempts = 5
    public var initialBackoff: Duration = .milliseconds(100)
    public var maxBackoff: Duration = .seconds(5)
    public var multiplier = 2.0
    /// Status codes retried (UNAVAILABLE).
    public var retryableCodes: Set<UInt32> = [14]

    public init() {}

    public static let `default` = RetryPolicy()
    /// One attempt: no retry.
    public static let none: RetryPolicy = { var policy = RetryPolicy(); policy.maxAttempts = 1; return policy }()

    /// The pause before attempt `attempt` (2, 3, …): random up to the backoff.
    func pause(before attempt: Int) -> Duration {
        let exponent = Double(max(0, attempt - 2))
        let ceiling = min(Double(maxBackoff.milliseconds), Double(initialBackoff.milliseconds) * pow(multiplier, exponent))
        return .milliseconds(Int64(Double.random(in: 0...max(1, ceiling))))
    }
}

extension Duration {
    var milliseconds: Int64 {
        let (seconds, attoseconds) = components
        return seconds * 1000 + attoseconds / 1_000_000_000_000_000
    }
}

extension Wire.Request.Params {
    /// Whether the method changes state (reflection/descriptors says the same
    /// per method): retried only with an idempotency key.
    public var mutates: Bool {
        switch self {
        case .threadStart, .threadResume, .threadFork, .threadArchive, .threadUnarchive, .threadUnsubscribe, .threadSettingsUpdate,
             .agentSpawn, .threadToolsUpdate, .threadCompactStart, .threadRollback, .threadNameSet, .turnStart, .turnInterrupt,
             .turnSteer, .turnContinue, .threadImport, .threadRevert, .threadQueueUpdate, .threadQueueDelete, .threadQueueReorder,
             .threadDelete:
            true
        case .initialize, .healthCheck, .reflectionDescriptors, .threadRead, .threadList, .threadTurnsList, .mcpServerList,
             .modelList, .threadSubscribe, .threadItemsList, .threadLoadedList, .threadQueueList, .clusterStatus:
            false
        }
    }
}

/// A client that outlives its connection: each call goes out on the current
/// connection, opened (and initialized) by `connect` when there is none or
/// the last one was lost, and is retried under `policy`. Subscriptions and
/// server requests are a connection's: after a reconnect, resume the
/// threads to be subscribed again (`connections` tells when it happened).
public final class ReconnectingClient: Sendable {
    private let connect: @Sendable () async throws -> ThreadwireClient
    public let policy: RetryPolicy
    private let state = NIOLockedValueBox<(client: ThreadwireClient?, connections: Int)>((nil, 0))

    public init(policy: RetryPolicy = .default, connect: @escaping @Sendable () async throws -> ThreadwireClient) {
        self.policy = policy
        self.connect = connect
    }

    /// How many connections were opened so far.
    public var connections: Int { state.withLockedValue { $0.connections } }

    /// The connection calls go out on now (opened if there is none).
    public func client() async throws -> ThreadwireClient {
        if let open = state.withLockedValue({ $0.client }), open.isActive { return open }
        let fresh = try await connect()
        let replaced = state.withLockedValue { state -> ThreadwireClient? in
            defer { state = (fresh, state.connections + 1) }
            return state.client
        }
        if let replaced { await replaced.close() }
        return fresh
    }

    /// One call, retried under the policy; a mutation carries
    /// `idempotencyKey` (a new UUID if nil) on every attempt. Returns the
    /// last response; throws only if no attempt got one.
    public func call(_ params: Wire.Request.Params, timeoutMs: UInt32? = nil, metadata: [Wire.KeyValue] = [],
                     idempotencyKey: String? = nil) async throws -> Wire.Response {
        let key = idempotencyKey ?? (params.mutates ? UUID().uuidString : nil)
        var attempt = 1
        while true {
            do {
                let response = try await client().call(params, timeoutMs: timeoutMs, metadata: metadata, idempotencyKey: key)
                guard let code = response.code, policy.retryableCodes.contains(code), attempt < policy.maxAttempts else { return response }
            } catch {
                // No connection, or it was lost: the outcome of a mutation is
                // unknown, which its key makes safe to send again.
                guard attempt < policy.maxAttempts, Self.isConnectionFailure(error) else { throw error }
                state.withLockedValue { $0.client = nil }
            }
            attempt += 1
            try await Task.sleep(for: policy.pause(before: attempt))
        }
    }

    /// The result of an OK answer; `ClientError.status` otherwise.
    public func result(_ params: Wire.Request.Params, timeoutMs: UInt32? = nil) async throws -> Wire.Response.Result {
        let response = try await call(params, timeoutMs: timeoutMs)
        guard response.code ?? 0 == 0, let result = response.result else {
            throw ClientError.status(code: response.code ?? 0, message: response.message ?? "")
        }
        return result
    }

    public func close() async {
        let open = state.withLockedValue { state -> ThreadwireClient? in
            defer { state.client = nil }
            return state.client
        }
        await open?.close()
    }

    /// Worth another attempt: the connection could not be opened or was
    /// lost. Not: the server's refusal (a status, e.g. UNAUTHENTICATED at
    /// initialize) or cancellation.
    static func isConnectionFailure(_ error: any Error) -> Bool {
        switch error {
        case ClientError.connectionClosed: true
        case is ClientError, is CancellationError: false
        default: true
        }
    }
}
