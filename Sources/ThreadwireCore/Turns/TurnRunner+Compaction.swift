import Foundation

/// What keeps a long thread inside its model's context window: the opening
/// context a turn starts with, and compaction. History stays append-only
/// (see `ModelContext`): a compaction appends a summary, nothing is rewritten.
extension TurnRunner {
    // MARK: - Opening context

    /// The developer items a turn's context opens with under the seeds'
    /// rules: the v2 usage hint when the model's context has no earlier turn,
    /// and a mode fragment when the effective mode differs from the one the
    /// context carries. A compaction passes `.noPreviousTurn`: the summary
    /// replaced both.
    func openingContext(
        _ record: ThreadRecord, runtime: MultiAgentRuntime?, effective: MultiAgentMode?, baseline: ModeRules.Baseline, config: ThreadConfig
    ) -> [ContextItem] {
        var items: [ContextItem] = []
        if baseline == .noPreviousTurn, runtime == .v2, config.usageHintEnabled, record.source != .review {
            let hint = record.source == .threadSpawn ? settings.subagentUsageHint : settings.rootUsageHint
            items.append(ContextItem(role: .developer, kind: .usageHint, text: hint))
        }
        if let mode = ModeRules.fragmentToEmit(baseline: baseline, current: effective) {
            items.append(ContextItem(role: .developer, kind: .multiAgentMode, text: ModeRules.fragmentText(mode)))
        }
        return items
    }

    // MARK: - Compaction

    /// Whether the next model request would pass the configured share of the
    /// model's window: the newest provider-counted request (if nothing was
    /// compacted or rolled back since) plus an estimate of what came after it,
    /// else an estimate of everything the model would be shown.
    func needsCompaction(_ state: StoredThread, config: ThreadConfig) -> Bool {
        guard settings.compaction.auto, let window = settings.catalog.contextWindow(forModel: state.record.model) else { return false }
        return estimatedNextRequestTokens(state) > Int(Double(window) * settings.compaction.threshold)
    }

    func estimatedNextRequestTokens(_ state: StoredThread) -> Int {
        let boundary = state.history.lastIndex { $0.kind == .compactionSummary || $0.kind == .rollbackMarker } ?? -1
        let counted = state.turns.reversed().lazy.filter { !$0.rolledBack }.flatMap { $0.modelRequests.reversed() }
            .first { $0.compactionPrompt == nil && $0.usage != nil }
        let base = ModelContext.estimatedTokens([ContextItem(role: .system, kind: .baseInstructions, text: settings.baseInstructions(for: state.record))])
        if let counted, let usage = counted.usage, counted.contextCount > boundary, counted.contextCount <= state.history.count {
            return usage.inputTokens + usage.outputTokens + ModelContext.estimatedTokens(state.history[counted.contextCount...])
        }
        return base + ModelContext.estimatedTokens(ModelContext.visible(state.history[...]))
    }

    /// Compacts the running turn's context: one model call with the
    /// summarisation prompt over what the model is shown now, then, in one
    /// commit, the summary, the opening context again, the turn's own items
    /// so far (so the turn goes on where it was), and a compaction item in the
    /// transcript. A failed call changes no context and fails the turn. False
    /// when the turn is no longer running.
    func compactContext(_ owner: ThreadOwner, turnID: TurnID) async -> Bool {
        let prepared: ModelRequest? = await owner.locked {
            guard let state = owner.state, let index = state.activeTurnIndex, state.turns[index].id == turnID else { return nil }
            let ref = ModelRequestRecord(model: state.record.model, contextCount: state.history.count, tools: [],
                                         compactionPrompt: settings.compaction.prompt)
            var next = state
            next.turns[index].modelRequests.append(ref)
            do { try await install(owner, next, [.putTurn(next.turns[index])]) } catch {
                await failTurn(owner, turnID: turnID, error: "\(error)", reason: .internalError)
                return nil
            }
            return ref.request(history: next.history, baseInstructions: settings.baseInstructions(for: next.record))
        }
        guard let request = prepared else { return false }

        let response: ModelResponse
        do {
            response = try await backend.respond(to: request, stream: ModelStream { _ in })
        } catch is CancellationError {
            return false
        } catch let error as ModelCallError {
            await owner.locked {
                await failTurn(owner, turnID: turnID, error: "context compaction failed: \(error.message)", reason: error.reason)
            }
            return false
        } catch {
            if Task.isCancelled { return false }
            await owner.locked { await failTurn(owner, turnID: turnID, error: "context compaction failed: \(error)", reason: .providerError) }
            return false
        }
        let summary = response.outputs.compactMap { if case let .message(text) = $0 { text } else { nil } }
            .joined(separator: "\n").trimmingCharacters(in: .whitespacesAndNewlines)
        guard !summary.isEmpty else {
            await owner.locked {
                await failTurn(owner, turnID: turnID, error: "context compaction failed: the model answered without a summary", reason: .badResponse)
            }
            return false
        }
        if let usage = response.usage { await reportUsage(owner, turnID: turnID, usage) }

        return await owner.locked {
            guard let state = owner.state, let at = state.activeTurnIndex, state.turns[at].id == turnID else { return false }
            var next = state
            let turn = next.turns[at]
            if let usage = response.usage, !next.turns[at].modelRequests.isEmpty {
                next.turns[at].modelRequests[next.turns[at].modelRequests.count - 1].usage = usage
            }
            var added = [ContextItem(role: .user, kind: .compactionSummary, text: settings.compaction.summaryPrefix + summary)]
            added += openingContext(next.record, runtime: turn.context.runtime, effective: turn.context.effectiveMode,
                                    baseline: .noPreviousTurn, config: owner.config)
            // The turn's own items so far, as the model saw them (less the
            // opening context given again above), so the turn goes on.
            let visible = ModelContext.visibleIndices(next.history[...])
            let turnStart = turn.historyStart ?? next.history.count
            added += visible.filter { $0 >= turnStart }.map { next.history[$0] }
                .filter { ![.usageHint, .multiAgentMode, .compactionSummary].contains($0.kind) }
            let item = ItemRecord(type: .contextCompaction, text: summary)
            next.turns[at].items.append(item)
            let first = next.history.count
            next.history += added
            let deliveries: [Delivery]
            do {
                deliveries = try await install(owner, next, [.appendHistory(owner.id, firstSequence: first, items: added), .putTurn(next.turns[at])],
                                               events: owner.itemEvents(turnID: turnID, item))
            } catch {
                await failTurn(owner, turnID: turnID, error: "\(error)", reason: .internalError)
                return false
            }
            owner.publisher.ticket(deliveries).publish()
            return true
        }
    }
}
