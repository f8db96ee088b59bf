import ThreadwireContract
import ThreadwireCore
import ThreadwireWire

/// What a handler gets: its connection, the engine, the server's facts, and
/// the thread its request names, already found, required and authorized by
/// the dispatcher (nil for methods whose table entry names no thread).
struct Call: Sendable {
    let connection: any CallSession
    /// Held by reference: a `ServerInfo` is large, and a call is made per request.
    let services: ServerServices
    let thread: ThreadID?

    var engine: ThreadEngine { services.engine }

    /// Borrowed, not copied, on each use.
    var server: ServerInfo {
        _read { yield services.info }
    }

    /// The principal this call acts for.
    var principal: Principal { connection.principal }

    /// Whether that principal is an operator: it reads across principals.
    var isOperator: Bool { server.authenticates && server.authenticator.isOperator(principal) }

    /// The thread the table says this method names. Only asked by handlers
    /// whose entry declares one, so nil is a table mistake.
    func target() throws -> ThreadID {
        guard let thread else { throw RequestError(.internal, "the method table names no thread for this method") }
        return thread
    }

    /// A thread's base instructions, without a hop through the engine actor.
    func baseInstructions(_ record: ThreadRecord) -> String {
        server.settings.baseInstructions(for: record)
    }
}

/// An inline handler's OK answer: a result to encode, or one encoded before
/// (a thread/read of an unchanged snapshot is encoded once, see
/// `Wire.EncodedResult`).
enum InlineAnswer {
    case result(Wire.Response.Result)
    case encoded(Wire.EncodedResult)
}

/// The field of a request that names the thread it acts on. Tenant isolation
/// is checked on it before any handler runs.
struct ThreadField: Sendable {
    /// As the .proto spells it, for the message when it is missing.
    let name: String
    let read: @Sendable (Wire.Request.Params) -> String?
}

/// One entry of the method table: everything the dispatcher needs to know
/// about a method before its handler runs, as data. A class: every request
/// carries its entry, and a copy of the struct retained each field.
final class MethodSpec: Sendable {
    typealias Run = @Sendable (Wire.Request.Params, Call) async throws -> Outcome<Wire.Response.Result>
    /// Answers without suspending, on the event loop that read the request,
    /// or returns nil when it cannot (the call then suspends).
    typealias RunInline = @Sendable (Wire.Request.Params, Call) throws -> InlineAnswer?

    let name: String
    /// The position of the method's case in `Wire.Request.Params`.
    let caseIndex: Int
    /// Refused (FAILED_PRECONDITION) before initialize, and UNAVAILABLE while draining.
    let requiresHandshake: Bool
    /// The thread the request names; required, and authorized for the
    /// connection's principal, by the dispatcher.
    let thread: ThreadField?
    /// Whether the method changes state: a mutating call past its deadline
    /// still completes (its change and events happen); a read is cancelled.
    let mutates: Bool
    /// An operator (marked so in the tokens file) may call it on any
    /// principal's thread. Reads only.
    let operatorReads: Bool
    let run: Run
    let runInline: RunInline?

    init(name: String, requiresHandshake: Bool, thread: ThreadField?, mutates: Bool, operatorReads: Bool = false,
         run: @escaping Run, runInline: RunInline?) {
        precondition(!(operatorReads && mutates), "method \(name): operators may only read another principal's threads")
        self.name = name
        guard let caseIndex = Wire.Request.Params.methodNames.firstIndex(of: name) else {
            preconditionFailure("method \(name) is no case of the request's params")
        }
        self.caseIndex = caseIndex
        self.requiresHandshake = requiresHandshake
        self.thread = thread
        self.mutates = mutates
        self.operatorReads = operatorReads
        self.run = run
        self.runInline = runInline
    }

    /// A method whose params are `P`, picked out of the request by `params`.
    /// The cast is the table's: handlers get their own params type.
    static func method<P: Sendable>(
        _ name: String, params: @escaping @Sendable (Wire.Request.Params) -> P?,
        thread: (name: String, read: @Sendable (P) -> String?)? = nil, mutates: Bool, operatorReads: Bool = false,
        requiresHandshake: Bool = true, inline: (@Sendable (P, Call) throws -> InlineAnswer?)? = nil,
        run: (@Sendable (P, Call) async throws -> Outcome<Wire.Response.Result>)? = nil
    ) -> MethodSpec {
        let bounded = mutates && name != "thread/import"
        @Sendable func typed(_ all: Wire.Request.Params) throws -> P {
            guard let typed = params(all) else { throw RequestError(.internal, "method table entry \(name) received other params") }
            if bounded { try InputBounds.check(all) }
            return typed
        }
        let runInline = inline.map { inline in { @Sendable (all: Wire.Request.Params, call: Call) in try inline(try typed(all), call) } }
        let runAsync: Run
        if let run {
            runAsync = { all, call in try await run(try typed(all), call) }
        } else if let runInline {
            // A method always answered inline takes the same answer when it
            // arrives behind others of its connection.
            runAsync = { all, call in
                guard case let .result(result)? = try runInline(all, call) else {
                    throw RequestError(.internal, "inline handler \(name) without an async path did not answer")
                }
                return Outcome(result)
            }
        } else {
            preconditionFailure("method \(name) has no handler")
        }
        let field = thread.map { thread in
            ThreadField(name: thread.name, read: { all in params(all).flatMap(thread.read) })
        }
        return MethodSpec(name: name, requiresHandshake: requiresHandshake, thread: field, mutates: mutates,
                          operatorReads: operatorReads, run: runAsync, runInline: runInline)
    }
}
