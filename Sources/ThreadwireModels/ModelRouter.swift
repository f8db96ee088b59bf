public import ThreadwireCore
import Foundation
import Synchronization
import Tracing

/// Picks the backend of a request's model: the models a config file maps to
/// a provider go there, every other model to the fallback (the embedded
/// scripted backend). With tracing on, each call is a span.
public struct ModelRouter: ModelBackend {
    public let backends: [String: any ModelBackend]
    public let fallback: any ModelBackend
    /// The provider name of each routed model, for traces.
    public let providers: [String: String]

    public init(backends: [String: any ModelBackend], fallback: any ModelBackend, providers: [String: String] = [:]) {
        self.backends = backends
        self.fallback = fallback
        self.providers = providers
    }

    public func respond(to request: ModelRequest, stream: ModelStream) async throws -> ModelResponse {
        let backend = backends[request.model] ?? fallback
        guard ThreadTracing.enabled else { return try await backend.respond(to: request, stream: stream) }
        let provider = backends[request.model] == nil ? "scripted-echo" : providers[request.model] ?? "openai-compatible"
        return try await ThreadTracing.span("model \(request.model)", kind: .client, attributes: [
            "gen_ai.system": .string(provider), "gen_ai.request.model": .string(request.model),
            "threadwire.model.compaction": .bool(request.isCompaction),
            "threadwire.model.context_items": .int64(Int64(request.context.count)),
        ]) { span in
            let started = ContinuousClock.now
            let firstText = Mutex<Duration?>(nil)
            let timed = ModelStream { text in
                firstText.withLock { if $0 == nil { $0 = .now - started } }
                stream.text(text)
            }
            let response = try await backend.respond(to: request, stream: timed)
            // Without streaming, the first token arrives with the whole answer.
            let first = firstText.withLock { $0 } ?? (.now - started)
            span?.updateAttributes { attributes in
                attributes["threadwire.model.time_to_first_token_ms"] = Double(first.components.seconds) * 1000
                    + Double(first.components.attoseconds) / 1e15
                attributes["threadwire.model.retries"] = response.retries
                if let usage = response.usage {
                    attributes["gen_ai.usage.input_tokens"] = usage.inputTokens
                    attributes["gen_ai.usage.output_tokens"] = usage.outputTokens
                }
            }
            return response
        }
    }
}
