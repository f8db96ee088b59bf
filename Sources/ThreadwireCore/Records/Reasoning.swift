/// What a reasoning model is asked for: an effort and a summary (Responses
/// API `reasoning: {effort, summary}`, Chat Completions `reasoning_effort`).
/// A thread's is sticky: set at thread/start, turn/start or
/// thread/settings/update, recorded in each model request it went out with.
public struct Reasoning: Sendable, Equatable, Codable {
    public var effort: String?
    public var summary: String?

    public init(effort: String? = nil, summary: String? = nil) {
        self.effort = effort
        self.summary = summary
    }

    public var isEmpty: Bool { effort == nil && summary == nil }

    /// Efforts a model takes when the catalog lists none for it.
    public static let standardEfforts = ["none", "minimal", "low", "medium", "high", "xhigh"]
    public static let summaries = ["auto", "concise", "detailed", "none"]

    /// This with a request's changes: nil keeps a value, "" clears it, any
    /// other value sets it, if `model` accepts it (`catalog`).
    public func updated(effort newEffort: String?, summary newSummary: String?, model: String, catalog: ModelCatalog) throws -> Reasoning {
        var next = self
        if let newEffort {
            if newEffort.isEmpty {
                next.effort = nil
            } else {
                let accepted = catalog.reasoningEfforts(forModel: model)
                guard accepted.contains(newEffort) else {
                    throw DomainError.invalidArgument(
                        "reasoning_effort '\(newEffort.prefix(40))' is not one model \(model) accepts (\(accepted.joined(separator: ", ")); \"\" clears it)")
                }
                next.effort = newEffort
            }
        }
        if let newSummary {
            if newSummary.isEmpty {
                next.summary = nil
            } else {
                guard Self.summaries.contains(newSummary) else {
                    throw DomainError.invalidArgument(
                        "reasoning_summary '\(newSummary.prefix(40))' is not one of \(Self.summaries.joined(separator: ", ")) (\"\" clears it)")
                }
                next.summary = newSummary
            }
        }
        return next
    }
}
