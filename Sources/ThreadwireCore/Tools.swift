/// The collaboration tools offered to the model, from the pinned runtime only.
public enum ToolCatalog {
    public static let v1Namespace = "multi_agent_v1"
    public static let v2Namespace = "collaboration"

    static let v1: [(String, String)] = [
        ("spawn_agent", "Start a sub-agent: {message, model?} -> {agent_id, nickname}"),
        ("send_input", "Send input to a sub-agent and start its turn: {target, message} -> {submission_id}"),
        ("wait_agent", "Wait for sub-agents' final statuses: {targets?} -> {status}"),
        ("resume_agent", "Reopen a closed sub-agent: {id}"),
        ("close_agent", "Close a sub-agent: {target}"),
    ]
    static let v2: [(String, String)] = [
        ("spawn_agent", "Start a sub-agent on a task: {task_name, message, model?} -> {task_name, nickname}"),
        ("send_message", "Queue a message for an agent without starting a turn: {target, message}"),
        ("followup_task", "Give a non-root agent a follow-up task (starts a turn): {target, message}"),
        ("wait_agent", "Wait for mailbox activity: {targets?} -> summary"),
        ("list_agents", "List agents: {path_prefix?}"),
        ("close_agent", "Close an agent: {target}"),
    ]

    /// - Parameters:
    ///   - depth: the thread's own depth (root 0).
    public static func offered(runtime: MultiAgentRuntime?, depth: Int, maxDepth: Int, source: ThreadSourceKind) -> [ToolSpec] {
        if source == .review { return [] }
        switch runtime {
        case nil, .disabled?:
            return []
        case .v1?:
            // V1 hides spawning once the next spawn would exceed the depth limit.
            let canSpawn = depth + 1 <= maxDepth
            return v1.filter { canSpawn || $0.0 != "spawn_agent" }
                .map { ToolSpec(name: $0.0, namespace: v1Namespace, description: $0.1) }
        case .v2?:
            return v2.map { ToolSpec(name: $0.0, namespace: v2Namespace, description: $0.1) }
        }
    }
}
