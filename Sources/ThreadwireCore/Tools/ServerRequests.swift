import Foundation
import Synchronization

/// A call the server makes to a client while a turn waits for it. Stored with
/// its turn (`TurnRecord.pendingRequests`), so it outlives the process: after
/// a restart the same request (same id) is offered again.
public struct ServerRequestRecord: Sendable, Equatable {
    public enum Kind: Sendable, Equatable {
        /// "item/tool/call": run client tool `tool` for tool-call item `itemID`.
        case toolCall(itemID: String, tool: String, arguments: String, callID: String)
        /// "item/tool/request_approval": may tool-call item `itemID` run?
        case approval(itemID: String, tool: String, arguments: String, callID: String, source: ToolSource, server: String?)
        /// "item/tool/request_user_input": the model's question to the user.
        case userInput(itemID: String, question: String, choices: [String], callID: String)

        /// The tool-call item the request belongs to.
        public var itemID: String {
            switch self {
            case let .toolCall(itemID, _, _, _), let .approval(itemID, _, _, _, _, _), let .userInput(itemID, _, _, _): return itemID
            }
        }

        var waitingReason: WaitingReason {
            switch self {
            case .toolCall: return .clientTool
            case .approval: return .approval
            case .userInput: return .userInput
            }
        }
    }

    public var id: String
    public var threadID: ThreadID
    public var turnID: TurnID
    public var kind: Kind
    public var createdAt: Millis
    public var deadlineAt: Millis
    /// The root of the thread's agent tree, whose clients are asked too.
    public var rootID: ThreadID
    /// A V2 child's task path, so the root's clients can tell agents apart.
    public var taskPath: String?

    public init(
        id: String = newID(), threadID: ThreadID, turnID: TurnID, kind: Kind, createdAt: Millis, deadlineAt: Millis,
        rootID: ThreadID? = nil, taskPath: String? = nil
    ) {
        self.id = id
        self.threadID = threadID
        self.turnID = turnID
        self.kind = kind
        self.createdAt = createdAt
        self.deadlineAt = deadlineAt
        self.rootID = rootID ?? threadID
        self.taskPath = taskPath
    }

    /// The capability a connection declares to be sent this request.
    public var capability: ClientCapability {
        switch kind {
        case .toolCall: return .clientTools
        case .approval: return .approvals
        case .userInput: return .userInput
        }
    }
}

/// A client's decision on an approval request.
public enum ApprovalDecision: String, Sendable, Equatable {
    case approve
    /// This call and every later call of the same tool in the agent tree.
    case approveForTree = "approve_for_tree"
    case decline, cancel
}

/// What a client can answer, declared in `initialize`.
public enum ClientCapability: String, Sendable, CaseIterable {
    case clientTools, approvals, userInput
}

/// A client's answer, as the engine reads it.
public enum ServerRequestAnswer: Sendable, Equatable {
    /// The tool ran; `isError` when it failed.
    case toolOutput(String, isError: Bool)
    /// An approval request's decision (`reason` read by the model on decline).
    case approval(ApprovalDecision, reason: String)
    /// The user's answer to a question.
    case userInput(String)
    /// The client could not serve the request (a non-OK status).
    case failed(code: UInt32, message: String)

    /// Whether this answers a request of `capability` (a failure answers any).
    func fits(_ capability: ClientCapability) -> Bool {
        switch self {
        case .failed: return true
        case .toolOutput: return capability == .clientTools
        case .approval: return capability == .approvals
        case .userInput: return capability == .userInput
        }
    }
}

/// How a server request stopped being pending.
public enum ServerRequestOutcome: String, Sendable, Equatable {
    case answered, timedOut, withdrawn
    /// Only for a refused answer: the request still waits.
    case pending
}

/// Why a taken answer was not taken.
public struct AnswerRefusal: Error, Sendable, Equatable, CustomStringConvertible {
    /// The request's state as far as known (nil: not known here).
    public var outcome: ServerRequestOutcome?
    public var description: String
    public init(_ outcome: ServerRequestOutcome?, _ description: String) {
        self.outcome = outcome
        self.description = description
    }
}

/// Answers by request id, between the task that waits for one and the
/// connection that brings it. A request is registered before it is offered,
/// so an answer can never arrive for a request nobody is ready to take; the
/// first answer counts, later ones are refused.
final class PendingAnswers: Sendable {
    private enum Slot {
        case open(CheckedContinuation<ServerRequestAnswer?, Never>?)
        case answered(ServerRequestAnswer)
    }
    private let slots = Mutex<[String: Slot]>([:])
    /// What each open request takes (an answer of another kind is refused).
    private let expected = Mutex<[String: ClientCapability]>([:])

    func register(_ request: ServerRequestRecord) {
        expected.withLock { $0[request.id] = request.capability }
        slots.withLock { if $0[request.id] == nil { $0[request.id] = .open(nil) } }
    }

    /// The capability open request `id` takes (nil: not open here).
    func capability(_ id: String) -> ClientCapability? {
        expected.withLock { $0[id] }
    }

    func isPending(_ id: String) -> Bool {
        slots.withLock { if case .open? = $0[id] { true } else { false } }
    }

    /// The answer of request `id`: false if it is not pending (never
    /// registered, already answered, or withdrawn).
    func resolve(_ id: String, _ answer: ServerRequestAnswer) -> Bool {
        let waiter = slots.withLock { slots -> CheckedContinuation<ServerRequestAnswer?, Never>?? in
            guard case let .open(waiter)? = slots[id] else { return nil }
            slots[id] = .answered(answer)
            return .some(waiter)
        }
        guard let waiter else { return false }
        expected.withLock { _ = $0.removeValue(forKey: id) }
        if let waiter {
            slots.withLock { _ = $0.removeValue(forKey: id) }
            waiter.resume(returning: answer)
        }
        return true
    }

    /// Waits for request `id`'s answer until `deadline` (nil at the
    /// deadline, on cancellation, or when withdrawn). Forgets the request.
    func wait(_ id: String, until deadline: ContinuousClock.Instant) async -> ServerRequestAnswer? {
        let timer = Task { [weak self] in
            guard (try? await Task.sleep(until: deadline, clock: .continuous)) != nil else { return }
            self?.withdraw(id)
        }
        defer { timer.cancel() }
        return await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<ServerRequestAnswer?, Never>) in
                let ready = slots.withLock { slots -> ServerRequestAnswer?? in
                    switch slots[id] {
                    case let .answered(answer)?:
                        slots[id] = nil
                        return .some(answer)
                    case .open?:
                        slots[id] = .open(continuation)
                        return nil
                    case nil:
                        return .some(nil)
                    }
                }
                if let ready { continuation.resume(returning: ready) }
            }
        } onCancel: {
            withdraw(id)
        }
    }

    /// No answer will be taken any more; a waiter gets nil.
    func withdraw(_ id: String) {
        let waiter = slots.withLock { slots -> CheckedContinuation<ServerRequestAnswer?, Never>? in
            guard case let .open(waiter)? = slots[id] else { return nil }
            slots[id] = nil
            return waiter
        }
        expected.withLock { _ = $0.removeValue(forKey: id) }
        waiter?.resume(returning: nil)
    }
}

/// The pending requests of each agent tree, by root: a client that
/// subscribes to a root is offered what the root's children wait for too
/// (their approvals and questions go to the root's clients).
final class TreeRequests: Sendable {
    private let byRoot = Mutex<[ThreadID: [String: ServerRequestRecord]]>([:])

    func add(_ request: ServerRequestRecord) {
        byRoot.withLock { $0[request.rootID, default: [:]][request.id] = request }
    }

    func remove(_ request: ServerRequestRecord) {
        byRoot.withLock { table in
            table[request.rootID]?[request.id] = nil
            if table[request.rootID]?.isEmpty == true { table[request.rootID] = nil }
        }
    }

    /// Oldest first.
    func requests(root: ThreadID) -> [ServerRequestRecord] {
        byRoot.withLock { ($0[root].map { Array($0.values) } ?? []).sorted { ($0.createdAt, $0.id) < ($1.createdAt, $1.id) } }
    }
}
