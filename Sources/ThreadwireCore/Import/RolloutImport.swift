// Over 400 lines: one pass over a rollout's lines; each line kind's case
// depends on what the earlier ones set, so they stay together.
public import Foundation

/// Reads a codex rollout file (JSONL of {timestamp, type, payload}; shared
/// reference §4) into a thread: its turns with their items (messages, tool
/// calls and outputs, reasoning summaries, compactions), the usage of each
/// model call, and the history the model is shown, with compactions and
/// rollbacks shaping it as codex rebuilds it (§4.4). A line that cannot be
/// read is skipped and reported, never fatal; record kinds it does not
/// import are counted. Fed line by line (a large file arrives in pieces).
public struct RolloutParser: Sendable {
    public struct Skipped: Sendable, Equatable {
        public var line: Int
        public var reason: String
    }

    private let defaultModel: String
    private var meta: [String: JSONAny] = [:]
    private var threadID: ThreadID?
    private var firstTimestamp: Millis?
    private var lastTimestamp: Millis = 0
    private var history: [ContextItem] = []
    private var turns: [TurnRecord] = []
    /// The turn lines go to, until it completes or aborts.
    private var open: Int?
    /// Turns no record began (items before any turn record): a new turn
    /// completes them, where it interrupts a turn a record began.
    private var implicit: Set<Int> = []
    /// Tool-call items waiting for their output, by call id.
    private var calls: [String: (turn: Int, item: Int)] = [:]
    public private(set) var skipped: [Skipped] = []
    public private(set) var unknown: [String: Int] = [:]
    public private(set) var counts: [String: Int] = [:]
    public private(set) var lines = 0

    /// Collaboration tools (§5): their calls become collaboration items.
    static let collaborationTools: Set<String> = [
        "spawn_agent", "wait_agent", "send_input", "send_message", "close_agent", "resume_agent", "list_agents", "followup_task",
    ]

    public init(defaultModel: String) { self.defaultModel = defaultModel }

    /// One line of the file (without its line end); `last` for the file's last.
    public mutating func feed(_ bytes: some Collection<UInt8>, number: Int, last: Bool) {
        lines = max(lines, number)
        guard !bytes.allSatisfy({ $0 == 0x20 || $0 == 0x09 || $0 == 0x0D }) else { return }  // blank lines carry nothing
        guard JSONNesting.depth(bytes) <= JSONNesting.limit else {
            skipped.append(Skipped(line: number, reason: "nested deeper than \(JSONNesting.limit) levels"))
            return
        }
        guard let object = (try? JSONSerialization.jsonObject(with: Data(bytes))) as? [String: Any] else {
            let why = last ? "torn: the file ends inside this line (codex was stopped while writing it)" : "not a JSON object"
            skipped.append(Skipped(line: number, reason: why))
            return
        }
        guard let type = object["type"] as? String else {
            skipped.append(Skipped(line: number, reason: "no \"type\": not a rollout line ({timestamp, type, payload})"))
            return
        }
        let payload = object["payload"] as? [String: Any] ?? [:]
        let time = (object["timestamp"] as? String).flatMap(Self.parseTimestamp) ?? lastTimestamp
        firstTimestamp = firstTimestamp ?? time
        lastTimestamp = time
        switch type {
        case "session_meta": sessionMeta(payload)
        case "turn_context": turnContext(payload, at: time)
        case "response_item": responseItem(payload, at: time, line: number)
        case "event_msg": event(payload, at: time)
        case "compacted": compacted(payload, at: time)
        case "inter_agent_communication":
            let text = (payload["content"] as? String) ?? (payload["message"] as? String) ?? Self.json(payload)
            history.append(ContextItem(role: .user, kind: .mailbox, text: text))
            count("mailbox")
        default:
            unknown[type, default: 0] += 1
        }
    }

    // MARK: Records

    private mutating func sessionMeta(_ payload: [String: Any]) {
        guard let id = payload["id"] as? String else { return }
        if threadID == nil { threadID = id }
        // Metadata updates append more session_meta lines: the newest of this
        // thread's wins, field by field. A null is a writer that did not record
        // the field (a resume): it erases nothing (codex #25351).
        guard id == threadID else { return }
        for (key, value) in payload where !(value is NSNull) { meta[key] = JSONAny(value) }
    }

    /// A turn begins with its context (or its turn_started event); a
    /// turn_context of the running turn (after a mid-turn compaction) updates it.
    private mutating func turnContext(_ payload: [String: Any], at time: Millis) {
        let id = payload["turn_id"] as? String
        if let open, id == nil || turns[open].id == id {
            turns[open].context = context(payload, over: turns[open].context)
            return
        }
        beginTurn(id: id, context: context(payload, over: nil), at: time)
    }

    private func context(_ payload: [String: Any], over previous: TurnContext?) -> TurnContext {
        TurnContext(
            model: payload["model"] as? String ?? previous?.model ?? defaultModel,
            runtime: (payload["multi_agent_version"] as? String).flatMap(MultiAgentRuntime.init(rawValue:)) ?? previous?.runtime,
            effectiveMode: (payload["multi_agent_mode"] as? String).flatMap(MultiAgentMode.init(rawValue:)) ?? previous?.effectiveMode,
            cwd: payload["cwd"] as? String ?? previous?.cwd ?? "/")
    }

    private mutating func beginTurn(id: String?, context: TurnContext?, at time: Millis) {
        if let open {
            if implicit.contains(open) {
                finish(open, status: .completed, error: nil, at: time)
            } else {
                finish(open, status: .interrupted, error: "interrupted: a new turn began before this one completed", at: time)
            }
        }
        var turn = TurnRecord(id: id ?? newID(), threadID: threadID ?? "", sequence: turns.count, startedAt: time, items: [],
                              context: context ?? turns.last?.context ?? TurnContext(model: defaultModel, runtime: nil, effectiveMode: nil, cwd: "/"))
        turn.historyStart = history.count
        turns.append(turn)
        open = turns.count - 1
    }

    /// The turn items go to: the open one, or a new one (a rollout without turn records).
    private mutating func currentTurn(at time: Millis) -> Int {
        if let open { return open }
        beginTurn(id: nil, context: nil, at: time)
        implicit.insert(turns.count - 1)
        return open!
    }

    private mutating func finish(_ index: Int, status: TurnStatus, error: String?, at time: Millis) {
        turns[index].status = status
        turns[index].error = error
        turns[index].completedAt = time
        if open == index { open = nil }
    }

    private mutating func responseItem(_ payload: [String: Any], at time: Millis, line: Int) {
        let type = payload["type"] as? String ?? ""
        switch type {
        case "message":
            message(payload, at: time)
        case "reasoning":
            let summary = (payload["summary"] as? [[String: Any]] ?? []).compactMap { $0["text"] as? String }.joined(separator: "\n\n")
            var item = ItemRecord(type: .reasoning, text: summary.isEmpty ? nil : summary)
            item.status = .completed
            turns[currentTurn(at: time)].items.append(item)
            count("reasoning")
        case "function_call", "custom_tool_call", "local_shell_call":
            toolCall(type, payload, at: time)
        case "function_call_output", "custom_tool_call_output":
            toolOutput(payload)
        default:
            unknown["response_item:" + (type.isEmpty ? "?" : type), default: 0] += 1
        }
    }

    private mutating func message(_ payload: [String: Any], at time: Millis) {
        guard let role = payload["role"] as? String else { return }
        let text = Self.text(payload["content"])
        switch role {
        case "user":
            let turn = currentTurn(at: time)
            history.append(ContextItem(role: .user, kind: .userInput, text: text))
            turns[turn].items.append(ItemRecord(type: .userMessage, text: text))
            count("user_message")
        case "assistant":
            let turn = currentTurn(at: time)
            history.append(ContextItem(role: .assistant, kind: .assistantMessage, text: text))
            turns[turn].items.append(ItemRecord(type: .agentMessage, text: text))
            count("agent_message")
        case "developer", "system":
            let kind: ContextKind = text.contains(ModeRules.openTag) ? .multiAgentMode : .developerMessage
            history.append(ContextItem(role: .developer, kind: kind, text: text))
            count("developer_message")
        default:
            unknown["message:" + role, default: 0] += 1
        }
    }

    private mutating func toolCall(_ type: String, _ payload: [String: Any], at time: Millis) {
        let callID = (payload["call_id"] as? String) ?? (payload["id"] as? String) ?? newID()
        let name: String
        let arguments: String
        switch type {
        case "local_shell_call":
            name = "local_shell"
            arguments = Self.json(payload["action"] ?? [:])
        case "custom_tool_call":
            name = payload["name"] as? String ?? "?"
            arguments = payload["input"] as? String ?? Self.json(payload["input"] ?? "")
        default:
            name = payload["name"] as? String ?? "?"
            arguments = payload["arguments"] as? String ?? Self.json(payload["arguments"] ?? [:])
        }
        let collaboration = Self.collaborationTools.contains(name)
        var item = ItemRecord(type: collaboration ? .collabToolCall : .toolCall)
        item.toolName = name
        item.toolArguments = arguments
        item.status = .inProgress
        if collaboration { item.receiverThreadID = Self.receiver(arguments) }
        let turn = currentTurn(at: time)
        turns[turn].items.append(item)
        calls[callID] = (turn, turns[turn].items.count - 1)
        history.append(ContextItem(role: .assistant, kind: .toolCall, text: arguments, toolName: name, callID: callID))
        count(collaboration ? "collab_tool_call" : "tool_call")
    }

    private mutating func toolOutput(_ payload: [String: Any]) {
        let callID = payload["call_id"] as? String ?? ""
        var failed = false
        let output: String
        switch payload["output"] {
        case let text as String: output = text
        case let object as [String: Any]:
            output = (object["content"] as? String) ?? Self.json(object)
            failed = (object["success"] as? Bool) == false
        case let other?: output = Self.json(other)
        case nil: output = ""
        }
        history.append(ContextItem(role: .tool, kind: .toolOutput, text: output, callID: callID))
        guard let (turn, index) = calls.removeValue(forKey: callID) else { return }
        turns[turn].items[index].toolOutput = output
        turns[turn].items[index].status = failed ? .failed : .completed
        if turns[turn].items[index].type == .collabToolCall, turns[turn].items[index].receiverThreadID == nil {
            turns[turn].items[index].receiverThreadID = Self.receiver(output)
        }
    }

    private mutating func event(_ payload: [String: Any], at time: Millis) {
        let type = payload["type"] as? String ?? ""
        switch type {
        case "task_started", "turn_started":
            let id = payload["turn_id"] as? String
            if let open, id == nil || turns[open].id == id { return }
            beginTurn(id: id, context: turns.last?.context, at: time)
        case "task_complete", "turn_complete":
            if let open { finish(open, status: .completed, error: nil, at: time) }
        case "turn_aborted":
            if let open { finish(open, status: .interrupted, error: "interrupted: \(payload["reason"] as? String ?? "aborted")", at: time) }
        case "token_count":
            guard let info = payload["info"] as? [String: Any], let last = info["last_token_usage"] as? [String: Any] else { return }
            let input = Self.int(last["input_tokens"]), output = Self.int(last["output_tokens"])
            let usage = TokenUsage(inputTokens: input, outputTokens: output, totalTokens: Self.int(last["total_tokens"], default: input + output))
            let turn = currentTurn(at: time)
            turns[turn].modelRequests.append(ModelRequestRecord(model: turns[turn].context.model, contextCount: history.count, tools: [], usage: usage))
            count("model_call")
        case "thread_rolled_back":
            rollBack(Self.int(payload["num_turns"], default: 1))
        default:
            // Events that repeat what other records carry (messages, commands) are not needed.
            return
        }
    }

    /// The newest `count` turns not rolled back leave the model's context
    /// (their items stay in the transcript), as thread/rollback does.
    private mutating func rollBack(_ count: Int) {
        // User turns, as codex counts them (a compaction on its own is none).
        let live = turns.indices.filter { index in
            !turns[index].rolledBack && index != open && turns[index].items.contains { $0.type == .userMessage }
        }
        let targets = live.suffix(max(0, count))
        guard let first = targets.first, let from = turns[first].historyStart else { return }
        history.append(ContextItem(role: .developer, kind: .rollbackMarker, text: "thread_rolled_back: \(targets.count) turn(s)", rollsBackFrom: from))
        for index in targets { turns[index].rolledBack = true }
        self.count("rollback")
    }

    /// With its replacement history, what the model is shown from here on
    /// is that history; without, the summary (an older codex's compaction).
    private mutating func compacted(_ payload: [String: Any], at time: Millis) {
        let message = payload["message"] as? String ?? ""
        if let replacement = payload["replacement_history"] as? [[String: Any]] {
            history.append(ContextItem(role: .developer, kind: .historyReplaced, text: message))
            for item in replacement { history += Self.contextItems(item) }
        } else {
            history.append(ContextItem(role: .user, kind: .compactionSummary, text: message))
        }
        var item = ItemRecord(type: .contextCompaction, text: message)
        item.status = .completed
        turns[currentTurn(at: time)].items.append(item)
        count("compaction")
    }

    private mutating func count(_ kind: String) { counts[kind, default: 0] += 1 }

    // MARK: The result

    /// The thread. Its tree (`sessionID`) is its own for a root; for a child
    /// it is its parent's id until the importer finds the parent's tree.
    public func finish() throws -> StoredThread {
        guard let threadID else { throw DomainError.invalidArgument("the rollout has no session_meta line with an id: nothing says which thread it is") }
        var turns = self.turns
        if let open, implicit.contains(open) {
            turns[open].status = .completed
        } else if let open {
            turns[open].status = .interrupted
            turns[open].error = "interrupted: the rollout ends before this turn completed (codex stopped while it ran)"
            turns[open].completedAt = lastTimestamp
        }
        for index in turns.indices {
            turns[index].threadID = threadID
            if turns[index].completedAt == nil { turns[index].completedAt = lastTimestamp }
            if turns[index].status == .inProgress { turns[index].status = .completed }
            // Tool calls whose output never came did not finish.
            for item in turns[index].items.indices where turns[index].items[item].status == .inProgress {
                turns[index].items[item].status = .failed
            }
        }
        let spawn = meta["source"]?.path("subagent", "thread_spawn")
        let parentID = spawn?.string("parent_thread_id") ?? meta["parent_thread_id"]?.stringValue
        let created = meta["timestamp"]?.stringValue.flatMap(Self.parseTimestamp) ?? firstTimestamp ?? 0
        var record = ThreadRecord(
            id: threadID, sessionID: parentID ?? threadID, source: parentID == nil ? .imported : .threadSpawn,
            depth: spawn?.int("depth") ?? (parentID == nil ? 0 : 1), createdAt: created,
            model: turns.last?.context.model ?? defaultModel, cwd: meta["cwd"]?.stringValue ?? "/")
        record.parentID = parentID
        record.updatedAt = max(lastTimestamp, created)
        record.forkedFromID = meta["forked_from_id"]?.stringValue
        record.baseInstructions = meta["base_instructions"]?.string("text") ?? meta["base_instructions"]?.stringValue
        record.preview = String((turns.first { !$0.rolledBack }?.items.first { $0.type == .userMessage }?.text ?? "").prefix(120))
        record.taskName = spawn?.string("agent_path") ?? meta["agent_path"]?.stringValue
        record.nickname = spawn?.string("agent_nickname") ?? meta["agent_nickname"]?.stringValue
        record.agentRole = spawn?.string("agent_role") ?? meta["agent_role"]?.stringValue ?? meta["agent_type"]?.stringValue
        record.runtime = meta["multi_agent_version"]?.stringValue.flatMap(MultiAgentRuntime.init(rawValue:))
            ?? turns.last(where: { $0.context.runtime != nil })?.context.runtime
        // Nothing recorded: a legacy thread, pinned on its first resume (a
        // child inherits its parent's runtime then).
        record.legacy = record.runtime == nil
        if parentID != nil {
            // The child's place in its parent's registry, from how it ended.
            switch turns.last?.status {
            case nil: record.agentStatus = .pendingInit
            case .completed?:
                record.agentStatus = .completed
                record.agentFinalMessage = turns.last?.items.last { $0.type == .agentMessage }?.text
            case .failed?:
                record.agentStatus = .errored
                record.agentFinalMessage = turns.last?.error
            case .interrupted?, .inProgress?: record.agentStatus = .interrupted
            }
        }
        return StoredThread(record: record, history: history, turns: turns)
    }

    // MARK: Reading values

    /// RFC 3339 in UTC as codex writes it ("2026-05-01T10:00:00.123Z"),
    /// read by hand: a date formatter per line was most of an import's time.
    /// Anything else (an offset, no fraction) goes to Foundation's parser.
    static func parseTimestamp(_ text: String) -> Millis? {
        let utf8 = Array(text.utf8)
        func digits(_ from: Int, _ count: Int) -> Int? {
            guard from + count <= utf8.count else { return nil }
            var value = 0
            for byte in utf8[from..<(from + count)] {
                guard (0x30...0x39).contains(byte) else { return nil }
                value = value * 10 + Int(byte - 0x30)
            }
            return value
        }
        if utf8.count >= 20, utf8.last == UInt8(ascii: "Z"), utf8[4] == UInt8(ascii: "-"), utf8[10] == UInt8(ascii: "T"),
           let year = digits(0, 4), let month = digits(5, 2), let day = digits(8, 2),
           let hour = digits(11, 2), let minute = digits(14, 2), let second = digits(17, 2), (1...12).contains(month) {
            var millis = 0
            if utf8.count > 21, utf8[19] == UInt8(ascii: ".") {
                let fraction = utf8[20..<(utf8.count - 1)]
                guard fraction.allSatisfy({ (0x30...0x39).contains($0) }) else { return foundationTimestamp(text) }
                for (index, byte) in fraction.prefix(3).enumerated() { millis += Int(byte - 0x30) * [100, 10, 1][index] }
            } else if utf8.count != 20 {
                return foundationTimestamp(text)
            }
            // Days from 1970-01-01 (Howard Hinnant's days_from_civil).
            let y = month <= 2 ? year - 1 : year
            let era = (y >= 0 ? y : y - 399) / 400
            let yearOfEra = y - era * 400
            let dayOfYear = (153 * (month + (month > 2 ? -3 : 9)) + 2) / 5 + day - 1
            let dayOfEra = yearOfEra * 365 + yearOfEra / 4 - yearOfEra / 100 + dayOfYear
            let days = era * 146_097 + dayOfEra - 719_468
            return Millis(((days * 24 + hour) * 60 + minute) * 60 + second) * 1000 + Millis(millis)
        }
        return foundationTimestamp(text)
    }

    private static func foundationTimestamp(_ text: String) -> Millis? {
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        if let date = formatter.date(from: text) { return Millis((date.timeIntervalSince1970 * 1000).rounded()) }
        formatter.formatOptions = [.withInternetDateTime]
        return formatter.date(from: text).map { Millis((($0.timeIntervalSince1970) * 1000).rounded()) }
    }

    /// A message's content as text: its parts' texts, or the string itself.
    static func text(_ content: Any?) -> String {
        if let text = content as? String { return text }
        return (content as? [[String: Any]] ?? []).compactMap { $0["text"] as? String }.joined(separator: "\n")
    }

    static func json(_ value: Any) -> String {
        guard JSONSerialization.isValidJSONObject([value]),
              let data = try? JSONSerialization.data(withJSONObject: value, options: [.sortedKeys, .fragmentsAllowed]) else { return "\(value)" }
        return String(decoding: data, as: UTF8.self)
    }

    static func int(_ value: Any?, default fallback: Int = 0) -> Int {
        (value as? Int) ?? (value as? NSNumber)?.intValue ?? fallback
    }

    /// The thread a collaboration call names ("id", "agent_id", "thread_id"
    /// in its arguments or output).
    static func receiver(_ json: String) -> ThreadID? {
        guard !JSONNesting.tooDeep(json), let object = (try? JSONSerialization.jsonObject(with: Data(json.utf8))) as? [String: Any] else { return nil }
        return ["agent_id", "thread_id", "id", "receiver_thread_id"].lazy.compactMap { object[$0] as? String }.first
    }

    /// A replacement history's item as history items.
    static func contextItems(_ item: [String: Any]) -> [ContextItem] {
        switch item["type"] as? String {
        case "message":
            let text = Self.text(item["content"])
            switch item["role"] as? String {
            case "user": return [ContextItem(role: .user, kind: .userInput, text: text)]
            case "assistant": return [ContextItem(role: .assistant, kind: .assistantMessage, text: text)]
            default: return [ContextItem(role: .developer, kind: text.contains(ModeRules.openTag) ? .multiAgentMode : .developerMessage, text: text)]
            }
        case "function_call", "custom_tool_call":
            let arguments = item["arguments"] as? String ?? item["input"] as? String ?? ""
            return [ContextItem(role: .assistant, kind: .toolCall, text: arguments, toolName: item["name"] as? String, callID: item["call_id"] as? String)]
        case "function_call_output", "custom_tool_call_output":
            let output = item["output"] as? String ?? ((item["output"] as? [String: Any])?["content"] as? String) ?? ""
            return [ContextItem(role: .tool, kind: .toolOutput, text: output, callID: item["call_id"] as? String)]
        default:
            return []
        }
    }
}

/// A JSON value kept from a parsed line (Sendable, unlike `Any`).
struct JSONAny: @unchecked Sendable {
    let value: Any
    init(_ value: Any) { self.value = value }
    var stringValue: String? { value as? String }
    func string(_ key: String) -> String? { (value as? [String: Any])?[key] as? String }
    func int(_ key: String) -> Int? { ((value as? [String: Any])?[key]).map { RolloutParser.int($0, default: 0) } }
    func path(_ keys: String...) -> JSONAny? {
        var current: Any = value
        for key in keys {
            guard let next = (current as? [String: Any])?[key] else { return nil }
            current = next
        }
        return JSONAny(current)
    }
}
