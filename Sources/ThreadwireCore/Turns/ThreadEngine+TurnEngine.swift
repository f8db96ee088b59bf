import Foundation

/// The engine as the port a turn runs through (`TurnEngine`).
extension ThreadEngine: TurnEngine {
    func snapshot(_ id: ThreadID) -> StoredThread? { directory.snapshot(id) }

    func record(of id: ThreadID) async -> ThreadRecord? {
        if let stored = directory.snapshot(id) { return stored.record }
        return try? await store.threadRecord(id)
    }

    func executeBeforeCommit(_ tool: ToolDefinition, _ invocation: ToolInvocation, arguments: String) async throws -> ToolResult {
        try await tool.execute(self, invocation, arguments: arguments)
    }
}
