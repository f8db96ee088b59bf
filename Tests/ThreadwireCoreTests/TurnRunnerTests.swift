import Foundation
import Synchronization
import Testing
@testable import ThreadwireCore

/// The turn runner on its own, through a fake of its port (`TurnEngine`):
/// no engine, store, directory or socket. What it installs, in what order,
/// is what the engine would commit.
@Suite("turn runner through its port (no engine)")
struct TurnRunnerTests {
    /// Answers each request with the next scripted response.
    final class ScriptedBackend: ModelBackend {
        let responses: Mutex<[ModelResponse]>
        let requests = Mutex<[ModelRequest]>([])
        init(_ responses: [ModelResponse]) { self.responses = Mutex(responses) }
        func respond(to request: ModelRequest, stream: ModelStream) async throws -> ModelResponse {
            requests.withLock { $0.append(request) }
            return responses.withLock { $0.removeFirst() }
        }
    }

    /// Records every install and applies it to the owner, as the engine does
    /// once its commit succeeds.
    final class FakeEngine: TurnEngine, @unchecked Sendable {
        let settings: ServerSettings
        let backend: any ModelBackend
        let toolServers: (any ToolServerHost)? = nil
        let pendingAnswers = PendingAnswers()
        let treeRequests = TreeRequests()
        let installs = Mutex<[[StoreOperation]]>([])
        let failures = Mutex<[String]>([])

        init(backend: any ModelBackend, settings: ServerSettings = ServerSettings()) {
            self.backend = backend
            self.settings = settings
        }

        func snapshot(_ id: ThreadID) -> StoredThread? { nil }
        func record(of id: ThreadID) async -> ThreadRecord? { nil }
        func install(_ owner: ThreadOwner, _ next: StoredThread, _ operations: [StoreOperation], events: [Delivery]) async throws -> [Delivery] {
            installs.withLock { $0.append(operations) }
            owner.state = next
            return events
        }
        func failTurn(_ owner: ThreadOwner, turnID: TurnID, error: String, reason: TurnFailureReason) async {
            failures.withLock { $0.append(error) }
        }
        func endActiveTurn(_ owner: ThreadOwner, status: TurnStatus, error: String?, reason: TurnFailureReason?) async throws -> Publication {
            owner.publisher.ticket([])
        }
        func finish(_ stored: inout StoredThread, index: Int, status: TurnStatus, error: String?) -> [StoreOperation] {
            stored.turns[index].status = status
            stored.turns[index].completedAt = 1
            return [.putTurn(stored.turns[index])]
        }
        func afterFinish(_ owner: ThreadOwner) {}
        func finishEvents(_ owner: ThreadOwner, _ turn: TurnRecord) -> [Delivery] { [] }
        func requestRecipients(_ owner: ThreadOwner) -> [ConnectionID] { [] }
        func resolutionRecipients(_ owner: ThreadOwner) -> [ConnectionID] { [] }
        func grantForTree(root: ThreadID, tool: String) async {}
        func executeTool(_ owner: ThreadOwner, _ caller: StoredThread, turnIndex: Int, name: String, arguments: String,
                         offered: [ToolSpec]) async -> ThreadEngine.ToolResult {
            ThreadEngine.ToolResult(output: "{\"ran\":\"\(name)\"}")
        }
        func executeBeforeCommit(_ tool: ToolDefinition, _ invocation: ToolInvocation, arguments: String) async throws -> ThreadEngine.ToolResult {
            ThreadEngine.ToolResult(output: "{}")
        }
    }

    struct NoSink: EventSink { func deliver(_ deliveries: [Delivery]) {} }

    /// A loaded thread with one running turn whose user input is in its history.
    func ownerWithRunningTurn(_ text: String) -> (ThreadOwner, TurnID) {
        let owner = ThreadOwner(id: "t1", sink: NoSink())
        let record = ThreadRecord(id: "t1", sessionID: "t1", source: .appServer, createdAt: 1, model: "echo-1", cwd: "/work")
        var turn = TurnRecord(id: "turn1", threadID: "t1", sequence: 0, startedAt: 1, items: [ItemRecord(type: .userMessage, text: text)],
                              context: TurnContext(model: "echo-1", runtime: .disabled, effectiveMode: nil, cwd: "/work"))
        turn.historyStart = 0
        owner.state = StoredThread(record: record, history: [ContextItem(role: .user, kind: .userInput, text: text)], turns: [turn])
        return (owner, turn.id)
    }

    @Test("a turn answered with a message: the request is stored before the model sees it, then the answer and the turn's end in one commit")
    func messageTurn() async throws {
        let usage = TokenUsage(inputTokens: 10, outputTokens: 3, totalTokens: 13)
        let backend = ScriptedBackend([ModelResponse(outputs: [.message("hello back")], usage: usage)])
        let engine = FakeEngine(backend: backend)
        let (owner, turnID) = ownerWithRunningTurn("hello")
        await TurnRunner(engine: engine).runTurn(owner, turnID: turnID)

        let installs = engine.installs.withLock { $0 }
        try #require(installs.count == 2, "\(installs)")
        // 1. The model request, stored first, with the context it was built from.
        guard case let .putTurn(requested) = installs[0].last else { Issue.record("no turn stored first: \(installs[0])"); return }
        #expect(requested.modelRequests.count == 1 && requested.modelRequests[0].contextCount == 1)
        #expect(requested.status == .inProgress)
        // 2. The answer appended to history and the turn completed, in one
        //    commit with the thread's new version, with its usage.
        try #require(installs[1].count == 3, "\(installs[1])")
        guard case let .putThread(thread) = installs[1][0] else { Issue.record("no thread first: \(installs[1])"); return }
        #expect(thread.version == 2, "the thread's record is bumped by the commit that ends the turn")
        guard case let .appendHistory(_, first, items) = installs[1][1] else { Issue.record("no history: \(installs[1])"); return }
        #expect(first == 1 && items.map(\.text) == ["hello back"])
        guard case let .putTurn(finished) = installs[1].last else { Issue.record("no turn last: \(installs[1])"); return }
        #expect(finished.status == .completed)
        #expect(finished.modelRequests.last?.usage == usage)
        #expect(finished.items.map(\.text) == ["hello", "hello back"])
        let requests = backend.requests.withLock { $0 }
        #expect(requests.count == 1 && requests[0].context.last?.text == "hello", "the model saw the user's input")
        #expect(engine.failures.withLock { $0 }.isEmpty)
    }

    @Test("a model failure fails the turn through the port, with the provider's message, and nothing else is installed")
    func modelFailure() async throws {
        struct Failing: ModelBackend {
            func respond(to request: ModelRequest, stream: ModelStream) async throws -> ModelResponse {
                throw ModelCallError(.providerError, "provider said no")
            }
        }
        let engine = FakeEngine(backend: Failing())
        let (owner, turnID) = ownerWithRunningTurn("hello")
        await TurnRunner(engine: engine).runTurn(owner, turnID: turnID)
        #expect(engine.failures.withLock { $0 } == ["provider said no"])
        #expect(engine.installs.withLock { $0 }.count == 1, "only the request was stored")
    }
}
