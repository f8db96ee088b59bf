public import Foundation

/// Reads a codex rollout file (JSONL of {timestamp, type, payload}) into a
/// stored thread. A rollout that recorded no multi_agent_version is a legacy
/// thread: it keeps `runtime == nil` and `legacy == true`, and is pinned to V1
/// on its first resume.
public enum RolloutImport {
    public struct ImportError: Error, CustomStringConvertible {
        public var description: String
    }

    public static func parse(_ data: Data, defaultModel: String) throws -> StoredThread {
        var meta: [String: Any]?
        var metaRuntime: MultiAgentRuntime?
        var firstTimestamp: Millis?
        var lastTimestamp: Millis?
        var history: [ContextItem] = []
        var turns: [TurnRecord] = []
        var threadID: String?

        func startTurn(_ context: [String: Any]?, at time: Millis) {
            let runtime = (context?["multi_agent_version"] as? String).flatMap(MultiAgentRuntime.init(rawValue:))
            let mode = (context?["multi_agent_mode"] as? String).flatMap(MultiAgentMode.init(rawValue:))
            var turn = TurnRecord(
                id: (context?["turn_id"] as? String) ?? newID(), threadID: threadID ?? "", sequence: turns.count,
                startedAt: time, items: [],
                context: TurnContext(model: context?["model"] as? String ?? defaultModel, runtime: runtime,
                                     effectiveMode: mode, cwd: context?["cwd"] as? String ?? "/"))
            turn.status = .completed
            turn.completedAt = time
            turns.append(turn)
        }

        for (number, line) in String(decoding: data, as: UTF8.self).split(separator: "\n").enumerated() {
            guard let object = (try? JSONSerialization.jsonObject(with: Data(line.utf8))) as? [String: Any],
                  let type = object["type"] as? String else {
                throw ImportError(description: "line \(number + 1) is not a rollout line ({timestamp, type, payload})")
            }
            let payload = object["payload"] as? [String: Any] ?? [:]
            let time = (object["timestamp"] as? String).flatMap(parseTimestamp) ?? lastTimestamp ?? 0
            firstTimestamp = firstTimestamp ?? time
            lastTimestamp = time
            switch type {
            case "session_meta":
                if threadID == nil { threadID = payload["id"] as? String }
                // Readers take the newest matching meta line.
                if payload["id"] as? String == threadID {
                    meta = payload
                    if let version = (payload["multi_agent_version"] as? String).flatMap(MultiAgentRuntime.init(rawValue:)) {
                        metaRuntime = version
                    }
                }
            case "turn_context":
                startTurn(payload, at: time)
            case "response_item":
                guard payload["type"] as? String == "message", let role = payload["role"] as? String else { continue }
                let text = ((payload["content"] as? [[String: Any]]) ?? []).compactMap { $0["text"] as? String }.joined(separator: "\n")
                switch role {
                case "user":
                    if turns.isEmpty { startTurn(nil, at: time) }
                    history.append(ContextItem(role: .user, kind: .userInput, text: text))
                    turns[turns.count - 1].items.append(ItemRecord(type: .userMessage, text: text))
                case "assistant":
                    if turns.isEmpty { startTurn(nil, at: time) }
                    history.append(ContextItem(role: .assistant, kind: .assistantMessage, text: text))
                    turns[turns.count - 1].items.append(ItemRecord(type: .agentMessage, text: text))
                case "developer", "system":
                    let kind: ContextKind = text.contains(ModeRules.openTag) ? .multiAgentMode : .developerMessage
                    history.append(ContextItem(role: .developer, kind: kind, text: text))
                default:
                    continue
                }
            default:
                continue
            }
        }
        guard let threadID, let meta else { throw ImportError(description: "the rollout has no session_meta line with an id") }
        let created = (meta["timestamp"] as? String).flatMap(parseTimestamp) ?? firstTimestamp ?? 0
        var record = ThreadRecord(
            id: threadID, sessionID: threadID, source: .imported, createdAt: created,
            model: turns.last?.context.model ?? defaultModel, cwd: meta["cwd"] as? String ?? "/")
        record.updatedAt = lastTimestamp ?? created
        record.forkedFromID = meta["forked_from_id"] as? String
        record.baseInstructions = (meta["base_instructions"] as? [String: Any])?["text"] as? String ?? meta["base_instructions"] as? String
        record.preview = String((turns.first?.items.first { $0.type == .userMessage }?.text ?? "").prefix(120))
        record.runtime = metaRuntime ?? turns.last(where: { $0.context.runtime != nil })?.context.runtime
        record.legacy = record.runtime == nil
        for index in turns.indices { turns[index].threadID = threadID }
        return StoredThread(record: record, history: history, turns: turns)
    }

    static func parseTimestamp(_ text: String) -> Millis? {
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        if let date = formatter.date(from: text) { return Millis((date.timeIntervalSince1970 * 1000).rounded()) }
        formatter.formatOptions = [.withInternetDateTime]
        return formatter.date(from: text).map { Millis((($0.timeIntervalSince1970) * 1000).rounded()) }
    }
}
