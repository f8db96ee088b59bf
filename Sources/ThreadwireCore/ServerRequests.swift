import Foundation
import Synchronization

/// A call the server makes to a client while a turn waits for it. Stored with
/// its turn (`TurnRecord.pendingRequests`), so it outlives the process: after
/// a restart the same request (same id) is offered again.
public struct ServerRequestRecord: Sendable, Equatable {
    public enum Kind: Sendable, Equatable {
        /// "item/tool/call": run client tool `tool` for tool-call item `itemID`.
        case toolCall(itemID: String, tool: String, arguments: String, callID: String)
    }

    public var id: String
    public var threadID: ThreadID
    public var turnID: TurnID
    public var kind: Kind
    public var createdAt: Millis
    public var deadlineAt: Millis

    public init(id: String = newID(), threadID: ThreadID, turnID: TurnID, kind: Kind, createdAt: Millis, deadlineAt: Millis) {
        self.id = id
        self.threadID = threadID
        self.turnID = turnID
        self.kind = kind
        self.createdAt = createdAt
        self.deadlineAt = deadlineAt
    }

    /// The capability a connection declares to be sent this request.
    public var capability: ClientCapability {
        switch kind {
        case .toolCall: return .clientTools
        }
    }
}

/// What a client can answer, declared in `initialize`.
public enum ClientCapability: String, Sendable, CaseIterable {
    case clientTools, approvals, userInput
}

/// A client's answer, as the engine reads it.
public enum ServerRequestAnswer: Sendable, Equatable {
    /// The tool ran; `isError` when it failed.
    case toolOutput(String, isError: Bool)
    /// The client could not serve the request (a non-OK status).
    case failed(code: UInt32, message: String)
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

    func register(_ id: String) {
        slots.withLock { if $0[id] == nil { $0[id] = .open(nil) } }
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
        waiter?.resume(returning: nil)
    }
}
