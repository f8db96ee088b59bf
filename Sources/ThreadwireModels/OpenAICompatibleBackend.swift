public import AsyncHTTPClient
public import Foundation
public import Logging
import NIOCore
import NIOHTTP1
import Synchronization
public import ThreadwireCore

/// A model provider from the config file (`model_providers`).
public struct ModelProviderConfig: Sendable, Equatable {
    public var name: String
    /// e.g. https://api.openai.com/v1 or http://localhost:11434/v1; requests
    /// go to `{base_url}/chat/completions` (or `/responses`).
    public var baseURL: String
    public var wireAPI: WireAPI
    /// The environment variable holding the API key (sent as a bearer token).
    public var apiKeyEnv: String?
    /// Until the response head arrives, per attempt.
    public var requestTimeout: Duration
    /// The longest gap between two pieces of the streamed answer.
    public var streamIdleTimeout: Duration
    /// Retries after a 429, a 5xx or a failed connection, before anything streamed.
    public var maxRetries: Int
    /// The first retry's delay; each further one doubles it (with jitter, at most `maxRetryDelay`).
    public var retryBaseDelay: Duration
    public var maxRetryDelay: Duration

    public init(name: String, baseURL: String, wireAPI: WireAPI = .chat, apiKeyEnv: String? = nil, requestTimeout: Duration = .seconds(120),
                streamIdleTimeout: Duration = .seconds(60), maxRetries: Int = 3,
                retryBaseDelay: Duration = .milliseconds(500), maxRetryDelay: Duration = .seconds(30)) {
        self.name = name
        self.baseURL = baseURL
        self.wireAPI = wireAPI
        self.apiKeyEnv = apiKeyEnv
        self.requestTimeout = requestTimeout
        self.streamIdleTimeout = streamIdleTimeout
        self.maxRetries = maxRetries
        self.retryBaseDelay = retryBaseDelay
        self.maxRetryDelay = maxRetryDelay
    }
}

/// A model behind an OpenAI-compatible Chat Completions API, streamed
/// (server-sent events). Retries 429, 5xx and failed connections with
/// exponential backoff and jitter (honouring Retry-After) as long as nothing
/// has streamed yet; a turn/interrupt cancels the HTTP request at once.
/// Failures carry the reason the turn records (`ModelCallError`).
public struct OpenAICompatibleBackend: ModelBackend {
    public let provider: ModelProviderConfig
    private let apiKey: String?
    private let endpoint: String
    private let client: HTTPClient
    private let logger: Logger

    /// Fails when the provider names an API key variable that is not set.
    public init(provider: ModelProviderConfig, environment: [String: String] = ProcessInfo.processInfo.environment,
                client: HTTPClient = ModelProviderHTTP.shared.client, logger: Logger) throws {
        self.provider = provider
        if let variable = provider.apiKeyEnv {
            guard let key = environment[variable], !key.isEmpty else {
                throw ModelCallError(.providerError, "model provider '\(provider.name)' reads its API key from $\(variable), which is not set")
            }
            apiKey = key
        } else {
            apiKey = nil
        }
        var base = provider.baseURL
        while base.hasSuffix("/") { base.removeLast() }
        endpoint = base + provider.wireAPI.path
        self.client = client
        self.logger = logger
    }

    public func respond(to request: ModelRequest, stream: ModelStream) async throws -> ModelResponse {
        let body = try provider.wireAPI.body(for: request)
        var attempt = 0
        while true {
            try Task.checkCancellation()
            var http = HTTPClientRequest(url: endpoint)
            http.method = .POST
            http.headers.add(name: "Content-Type", value: "application/json")
            http.headers.add(name: "Accept", value: "text/event-stream")
            if let apiKey { http.headers.add(name: "Authorization", value: "Bearer \(apiKey)") }
            http.body = .bytes(ByteBuffer(bytes: body))
            let response: HTTPClientResponse
            do {
                response = try await client.execute(http, deadline: .now() + TimeAmount(provider.requestTimeout), logger: logger)
            } catch {
                if Task.isCancelled { throw CancellationError() }
                if let error = error as? HTTPClientError, error == .deadlineExceeded {
                    throw ModelCallError(.timeout, "model provider '\(provider.name)' did not answer within \(provider.requestTimeout)")
                }
                if attempt < provider.maxRetries {
                    attempt += 1
                    try await pause(before: attempt, retryAfter: nil, because: "\(error)")
                    continue
                }
                throw ModelCallError(.providerError, "cannot reach model provider '\(provider.name)' at \(endpoint) "
                    + "(\(attempt + 1) attempts): \(error)")
            }
            let status = response.status.code
            if (200..<300).contains(status) {
                var answer = try await read(response, stream: stream)
                answer.retries = attempt
                return answer
            }
            let snippet = Self.text(try? await response.body.collect(upTo: 2048))
            if (status == 429 || status >= 500) && attempt < provider.maxRetries {
                attempt += 1
                try await pause(before: attempt, retryAfter: Self.retryAfter(response.headers), because: "HTTP \(status)")
                continue
            }
            let retried = attempt > 0 ? " after \(attempt) retries" : ""
            throw ModelCallError(status == 429 ? .rateLimited : .providerError,
                                 "model provider '\(provider.name)' answered HTTP \(status)\(retried): \(snippet)")
        }
    }

    /// Backoff before retry `attempt` (1, 2, ...): the base doubled per
    /// attempt, times a random factor in [0.5, 1], at most the maximum; a
    /// Retry-After the provider sent wins (also capped).
    func delay(before attempt: Int, retryAfter: Duration?) -> Duration {
        if let retryAfter { return min(retryAfter, provider.maxRetryDelay) }
        let exponential = provider.retryBaseDelay * (1 << min(attempt - 1, 20))
        return min(exponential * Double.random(in: 0.5...1.0), provider.maxRetryDelay)
    }

    private func pause(before attempt: Int, retryAfter: Duration?, because reason: String) async throws {
        let wait = delay(before: attempt, retryAfter: retryAfter)
        logger.info("retrying the model provider", metadata: [
            "tw.provider": "\(provider.name)", "tw.attempt": "\(attempt)", "tw.reason": "\(reason)", "tw.delay": "\(wait)"])
        try await Task.sleep(for: wait)
    }

    /// Retry-After in seconds (an HTTP date is read as "now").
    static func retryAfter(_ headers: HTTPHeaders) -> Duration? {
        guard let value = headers.first(name: "Retry-After")?.trimmingCharacters(in: .whitespaces) else { return nil }
        if let seconds = Double(value), seconds >= 0 { return .milliseconds(Int(seconds * 1000)) }
        return .zero
    }

    private static func text(_ buffer: ByteBuffer?) -> String {
        guard let buffer else { return "(no body)" }
        return String(buffer: buffer).prefix(500).description
    }

    /// Reads the event stream; a gap longer than the idle timeout fails it.
    private func read(_ response: HTTPClientResponse, stream: ModelStream) async throws -> ModelResponse {
        let lastActivity = LastActivity()
        let idle = provider.streamIdleTimeout
        let name = provider.name
        let wireAPI = provider.wireAPI
        return try await withThrowingTaskGroup(of: ModelResponse?.self) { group in
            group.addTask {
                var parser = ServerSentEventParser()
                var answer = wireAPI.accumulator()
                do {
                    for try await buffer in response.body {
                        lastActivity.touch()
                        for event in try parser.feed(buffer.readableBytesView) {
                            stream.text(try answer.add(event))
                        }
                        if answer.complete { break }
                    }
                } catch let error as ModelCallError {
                    throw error
                } catch let error as ServerSentEventParser.LineTooLong {
                    throw ModelCallError(.badResponse, "model provider '\(name)': \(error)")
                } catch {
                    if Task.isCancelled { throw CancellationError() }
                    throw ModelCallError(.providerError, "model provider '\(name)': the stream broke off: \(error)")
                }
                guard answer.finished else {
                    throw ModelCallError(.providerError, "model provider '\(name)': the stream ended before the answer was complete")
                }
                return try answer.response()
            }
            group.addTask {
                while true {
                    let deadline = lastActivity.instant + idle
                    try await Task.sleep(until: deadline, clock: .continuous)
                    if lastActivity.instant + idle <= .now {
                        throw ModelCallError(.timeout, "model provider '\(name)': the stream stalled for more than \(idle)")
                    }
                }
            }
            defer { group.cancelAll() }
            guard let first = try await group.next(), let answer = first else {
                throw ModelCallError(.providerError, "model provider '\(name)': no answer")
            }
            return answer
        }
    }
}

extension TimeAmount {
    init(_ duration: Duration) {
        let (seconds, attoseconds) = duration.components
        self = .nanoseconds(seconds * 1_000_000_000 + attoseconds / 1_000_000_000)
    }
}

/// When the stream last delivered bytes.
private final class LastActivity: Sendable {
    private let at = Mutex(ContinuousClock.now)
    var instant: ContinuousClock.Instant { at.withLock { $0 } }
    func touch() { at.withLock { $0 = .now } }
}

/// The HTTP client every provider shares. Its pool allows many connections
/// per host: each streaming turn holds one for as long as the model talks,
/// and async-http-client's default (8 per host) would queue the ninth
/// concurrent turn behind the first eight.
/// One per process, never shut down (like `HTTPClient.shared`): a startup
/// that fails half-way cannot leave it to a deinit that would trap.
public final class ModelProviderHTTP: Sendable {
    public let client: HTTPClient
    public static let maxConnectionsPerHost = 1024
    public static let shared = ModelProviderHTTP()

    private init() {
        var configuration = HTTPClient.Configuration()
        configuration.connectionPool = .init(idleTimeout: .seconds(60),
                                             concurrentHTTP1ConnectionsPerHostSoftLimit: Self.maxConnectionsPerHost)
        configuration.timeout = .init(connect: .seconds(10))
        client = HTTPClient(eventLoopGroupProvider: .singleton, configuration: configuration)
    }

}
