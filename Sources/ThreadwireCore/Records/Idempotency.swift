import Synchronization

/// Retries that apply once (Request.idempotency_key). A keyed change writes
/// its key into the same transaction as the change (`IdempotencyClaim`), so
/// no crash or partition can leave a change applied without its key. The
/// answer goes into the same transaction when the change alone tells it
/// (`IdempotentCommand.Answer`: settings updates, turn starts, …); other
/// answers are added to the row right after (`IdempotencyRecord.response`).
/// A repeat finds the row and is answered from it instead of being carried
/// out again.
public struct IdempotencyKey: Hashable, Sendable, CustomStringConvertible {
    public var principal: Principal
    public var key: String
    public init(principal: Principal, key: String) {
        self.principal = principal
        self.key = key
    }
    public var description: String { "'\(key)'" }

    /// Printable ASCII, 1 to 128 characters: it is logged, stored and compared as it is.
    public static func validate(_ key: String) throws {
        guard !key.isEmpty, key.utf8.count <= 128, key.utf8.allSatisfy({ (0x21...0x7E).contains($0) }) else {
            throw DomainError.invalidArgument(
                "idempotency_key must be 1 to 128 printable ASCII characters without spaces (a UUID, say), got \(key.utf8.count) bytes")
        }
    }
}

/// What a keyed change stores with itself: whose key, which request (its
/// method and a digest of its params, so a repeat with other params is
/// refused), and what the change touched, from which its answer can be
/// rebuilt if the process died before the answer was recorded.
public struct IdempotencyClaim: Sendable, Equatable {
    public var key: IdempotencyKey
    public var method: String
    /// SHA-256 of the method and the request's params, encoded canonically.
    public var fingerprint: [UInt8]
    /// The thread the change created (thread/start, fork, agent/spawn) or changed.
    public var threadID: ThreadID?
    /// The turns the change wrote (turn/start's new turn, rolled-back turns, …).
    public var turnIDs: [TurnID] = []
    /// Milliseconds since 1970 by the writing instance's clock (retention only).
    public var createdAtMillis: Int64

    public init(key: IdempotencyKey, method: String, fingerprint: [UInt8], threadID: ThreadID? = nil,
                turnIDs: [TurnID] = [], createdAtMillis: Int64) {
        self.key = key
        self.method = method
        self.fingerprint = fingerprint
        self.threadID = threadID
        self.turnIDs = turnIDs
        self.createdAtMillis = createdAtMillis
    }
}

/// A stored key: the claim, and the answer once recorded (a serialized
/// threadwire.v1.Response without id). A claim without an answer is a
/// change that committed while its request had not been answered yet: still
/// running, or its process died in between.
public struct IdempotencyRecord: Sendable, Equatable {
    public var claim: IdempotencyClaim
    public var response: [UInt8]?
    public init(claim: IdempotencyClaim, response: [UInt8]?) {
        self.claim = claim
        self.response = response
    }
}

/// Another request with the same key committed first (another connection
/// or instance, at the same moment): this one changed nothing, and its
/// answer is the other one's.
public struct IdempotencyKeyTaken: Error, CustomStringConvertible {
    public var key: IdempotencyKey
    public init(key: IdempotencyKey) { self.key = key }
    public var description: String {
        "a request with idempotency key \(key) was applied first; this one changed nothing"
    }
}

/// The keyed request a task is carrying out. The engine adds its claim to
/// the first commit of that request that writes the thread it targets or
/// creates a thread, and to no other commit (a load's recovery, a turn
/// runner or a mailbox delivery it sets off does not carry the key).
public final class IdempotentCommand: Sendable {
    @TaskLocal public static var current: IdempotentCommand?

    public let key: IdempotencyKey
    public let method: String
    public let fingerprint: [UInt8]
    /// The thread the request names (nil for thread/start).
    public let target: ThreadID?
    /// The request's answer (a serialized threadwire.v1.Response without
    /// id) told from its change's operations, stored in the change's own
    /// transaction; nil where the answer needs more than the change.
    public typealias Answer = @Sendable (_ operations: [StoreOperation]) -> [UInt8]?
    private let answer: Answer?
    private let state = Mutex(State())

    private struct State {
        var claim: IdempotencyClaim?
        var storedAnswer: [UInt8]?
        var closed = false
    }

    public init(key: IdempotencyKey, method: String, fingerprint: [UInt8], target: ThreadID?, answer: Answer? = nil) {
        self.key = key
        self.method = method
        self.fingerprint = fingerprint
        self.target = target
        self.answer = answer
    }

    /// The claim committed with the request's change; nil if it changed nothing.
    public var claim: IdempotencyClaim? { state.withLock { $0.claim } }

    /// The answer committed with the claim, if the change told it.
    public var storedAnswer: [UInt8]? { state.withLock { $0.storedAnswer } }

    /// After the request's answer: no later commit carries the key.
    public func close() { state.withLock { $0.closed = true } }

    /// The claim (and answer) to add to a commit of `operations`, if this
    /// commit is the request's change and nothing claimed the key yet.
    func claim(for operations: [StoreOperation], nowMillis: Int64) -> (claim: IdempotencyClaim, answer: [UInt8]?)? {
        var created: ThreadID?
        var touchesTarget = false
        var turns: [TurnID] = []
        for operation in operations {
            switch operation {
            case let .putThread(record):
                if record.version <= 1, created == nil { created = record.id }
                if record.id == target { touchesTarget = true }
            case let .putTurn(turn):
                if turn.threadID == target { turns.append(turn.id) }
            default: break
            }
        }
        guard created != nil || touchesTarget else { return nil }
        // A created thread names what the change made (a fork's copied turns do not).
        if created != nil { turns = [] }
        let open = state.withLock { !$0.closed && $0.claim == nil }
        guard open else { return nil }
        let claim = IdempotencyClaim(key: key, method: method, fingerprint: fingerprint, threadID: created ?? target,
                                     turnIDs: turns, createdAtMillis: nowMillis)
        return (claim, answer?(operations))
    }

    /// The commit carrying `claim` (and `answer`) succeeded.
    func claimed(_ claim: IdempotencyClaim, answer: [UInt8]?) {
        state.withLock { state in
            state.claim = claim
            state.storedAnswer = answer
        }
    }

    /// Runs `body` as no keyed request: for work a request sets off that is
    /// not its change (recovery at load, background tasks).
    public static func detached<T>(_ body: () async throws -> T) async rethrows -> T {
        try await $current.withValue(nil) { try await body() }
    }
}
