public import ThreadwireCore
import Foundation

/// Picks the backend of a request's model: the models a config file maps to
/// a provider go there, every other model to the fallback (the embedded
/// scripted backend).
public struct ModelRouter: ModelBackend {
    public let backends: [String: any ModelBackend]
    public let fallback: any ModelBackend

    public init(backends: [String: any ModelBackend], fallback: any ModelBackend) {
        self.backends = backends
        self.fallback = fallback
    }

    public func respond(to request: ModelRequest, stream: ModelStream) async throws -> ModelResponse {
        try await (backends[request.model] ?? fallback).respond(to: request, stream: stream)
    }
}
