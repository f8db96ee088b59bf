import Foundation
import Synchronization

/// What a model call produces.
public enum ModelOutput: Sendable, Equatable {
    case message(String)
    case toolCall(name: String, arguments: String, callID: String)
}

/// A model call's answer: its outputs in order, and what it used.
public struct ModelResponse: Sendable, Equatable {
    public var outputs: [ModelOutput]
    public var usage: TokenUsage?
    /// Attempts the provider refused before this answer (for traces).
    public var retries = 0
    public init(outputs: [ModelOutput], usage: TokenUsage? = nil, retries: Int = 0) {
        self.outputs = outputs
        self.usage = usage
        self.retries = retries
    }
}

/// Where a backend sends the text of the answer's message as it arrives
/// (clients see it as item/agent_message/delta). The outputs it returns stay
/// authoritative.
public struct ModelStream: Sendable {
    private let onText: @Sendable (String) -> Void
    public init(onText: @escaping @Sendable (String) -> Void) { self.onText = onText }
    public func text(_ delta: String) { if !delta.isEmpty { onText(delta) } }
    /// For callers that do not stream.
    public static let discard = ModelStream { _ in }
}

/// The seam a model provider plugs into. `respond` may suspend for as long
/// as the model takes; cancellation means the turn was interrupted and must
/// end the call at once.
public protocol ModelBackend: Sendable {
    func respond(to request: ModelRequest, stream: ModelStream) async throws -> ModelResponse
}

/// A model call that failed in a way the turn records (`Turn.failure_reason`).
public struct ModelCallError: Error, CustomStringConvertible, Equatable {
    public var reason: TurnFailureReason
    public var message: String
    public init(_ reason: TurnFailureReason, _ message: String) {
        self.reason = reason
        self.message = message
    }
    public var description: String { message }
}
