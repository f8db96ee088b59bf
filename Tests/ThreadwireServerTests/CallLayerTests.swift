import Testing
import ThreadwireServerTesting
@testable import ThreadwireServer
import ThreadwireCore
import ThreadwireNIO
import ThreadwireWire

/// The call layer's pure parts, without sockets: the connection's state
/// machine, the table of pending calls, and the method table.
@Suite("call layer (no sockets)")
struct CallLayerTests {
    typealias Machine = ConnectionStateMachine

    @Test("handshake → ready → draining: requests are admitted, refused before initialize, refused while draining")
    func connectionLifecycle() {
        var machine = Machine()
        #expect(machine.admits(requiresHandshake: true, method: "thread/start")?.code == .failedPrecondition)
        #expect(machine.admits(requiresHandshake: false, method: "initialize") == nil)
        let session = Machine.Session(principal: "alice", optOut: ["item/started"], credential: [1, 2], peer: false)
        let initialized = machine.initialized(session)
        #expect(initialized)
        let initializedAgain = machine.initialized(session)
        #expect(!initializedAgain, "a second initialize is refused")
        #expect(machine.session == session)
        #expect(machine.admits(requiresHandshake: true, method: "thread/start") == nil)
        let deadlineWhenReady = machine.handshakeDeadlinePassed(timeoutMs: 10)
        #expect(deadlineWhenReady == .none, "an initialized connection outlives the handshake deadline")
        machine.serverDraining()
        #expect(machine.isDraining && machine.session == session)
        #expect(machine.admits(requiresHandshake: true, method: "thread/read")?.code == .unavailable)
        #expect(machine.admits(requiresHandshake: false, method: "health/check") == nil)
        let idleWhileDraining = machine.idleTimeoutPassed(timeoutMs: 5, requestsInFlight: false, subscribed: false)
        #expect(idleWhileDraining == .none,
                "a draining connection is closed by the drain, not the idle timer")
    }

    @Test("the handshake deadline closes only a connection that did not initialize, once")
    func handshakeDeadline() {
        var machine = Machine()
        guard case let .close(code, message, reason) = machine.handshakeDeadlinePassed(timeoutMs: 250) else {
            Issue.record("no close"); return
        }
        #expect(code == .deadlineExceeded && reason == .handshakeTimeout && message.contains("handshake_timeout_ms (250)"))
        #expect(machine.isClosing && !machine.isInitialized)
        let deadlineAgain = machine.handshakeDeadlinePassed(timeoutMs: 250)
        #expect(deadlineAgain == .none)
        let secondClose = machine.close(.unavailable, "again", reason: .idle)
        #expect(secondClose == .none, "only the first close sends a frame")
        let initializedWhileClosing = machine.initialized(Machine.Session())
        #expect(!initializedWhileClosing, "a closing connection cannot initialize")
        machine.channelClosed()
        #expect(machine.state == .closed)
    }

    @Test("the idle timeout spares connections with requests in flight or a subscription")
    func idleTimeout() {
        var machine = Machine()
        let idleBeforeInitialize = machine.idleTimeoutPassed(timeoutMs: 5, requestsInFlight: false, subscribed: false)
        #expect(idleBeforeInitialize == .none,
                "before initialize the handshake deadline decides")
        _ = machine.initialized(Machine.Session(principal: "bob"))
        let idleWithRequestInFlight = machine.idleTimeoutPassed(timeoutMs: 5, requestsInFlight: true, subscribed: false)
        #expect(idleWithRequestInFlight == .none)
        let idleWhileSubscribed = machine.idleTimeoutPassed(timeoutMs: 5, requestsInFlight: false, subscribed: true)
        #expect(idleWhileSubscribed == .none)
        guard case let .close(code, _, reason) = machine.idleTimeoutPassed(timeoutMs: 5, requestsInFlight: false, subscribed: false) else {
            Issue.record("an idle connection was not closed"); return
        }
        #expect(code == .unavailable && reason == .idle)
        // Requests already read still run for the session they had.
        #expect(machine.session?.principal == "bob")
        #expect(machine.admits(requiresHandshake: true, method: "thread/read") == nil)
    }

    @Test("the request queue pauses reads at its count or byte limit and resumes them below both; the drain is told when it empties")
    func requestQueue() {
        var machine = Machine(bounds: .init(maxQueuedRequests: 3, maxQueuedRequestBytes: 100))
        _ = machine.initialized(Machine.Session())
        let first = machine.requestQueued(bytes: 10), second = machine.requestQueued(bytes: 10)
        #expect(first && second)
        #expect(machine.readsAllowed(channelWritable: true) && !machine.readsAllowed(channelWritable: false))
        let third = machine.requestQueued(bytes: 10)
        #expect(!third, "the third request fills the queue")
        #expect(!machine.readsAllowed(channelWritable: true))
        #expect(!machine.drainDone(channelWritable: true, channelActive: true))
        #expect(machine.drainDone(channelWritable: false, channelActive: true), "a client that takes no answers cannot finish its queue")
        let belowCount = machine.requestFinished(bytes: 10)
        #expect(belowCount == .init(resumeReads: true, queueEmpty: false))
        #expect(machine.readsAllowed(channelWritable: true))
        let notPaused = machine.requestFinished(bytes: 10)
        #expect(notPaused == .init(resumeReads: false, queueEmpty: false), "reads were not paused")
        // By bytes: one large request fills it.
        let large = machine.requestQueued(bytes: 95)
        #expect(!large)
        #expect(machine.queue == .init(requests: 2, bytes: 105, readsPaused: true))
        let belowBytes = machine.requestFinished(bytes: 10)
        #expect(belowBytes == .init(resumeReads: true, queueEmpty: false), "95 bytes of 100 in 1 request: below both")
        let last = machine.requestFinished(bytes: 95)
        #expect(last.queueEmpty)
        #expect(!machine.hasRequestsInFlight && machine.drainDone(channelWritable: true, channelActive: true))
        _ = machine.close(.unavailable, "bye", reason: .idle)
        #expect(!machine.readsAllowed(channelWritable: true), "a closing connection is not read")
    }

    @Test("the loop's flags, read without the lock, agree with the machine's answers through every phase and queue state")
    func loopFlagsAgree() {
        var steps: [(String, Machine)] = []
        var machine = Machine(bounds: .init(maxQueuedRequests: 2, maxQueuedRequestBytes: 100))
        steps.append(("handshake", machine))
        _ = machine.requestQueued(bytes: 5)
        steps.append(("handshake, an initialize queued", machine))
        _ = machine.requestFinished(bytes: 5)
        _ = machine.initialized(Machine.Session(principal: "alice"))
        steps.append(("ready", machine))
        _ = machine.requestQueued(bytes: 10)
        steps.append(("ready, one queued", machine))
        _ = machine.requestQueued(bytes: 10)
        steps.append(("ready, the queue full", machine))
        _ = machine.requestFinished(bytes: 10)
        steps.append(("ready, below the limit again", machine))
        machine.serverDraining()
        steps.append(("draining, one queued", machine))
        _ = machine.requestFinished(bytes: 10)
        steps.append(("draining, empty", machine))
        _ = machine.close(.unavailable, "bye", reason: .idle)
        steps.append(("closing", machine))
        machine.channelClosed()
        steps.append(("closed", machine))
        var handshakeClosing = Machine()
        _ = handshakeClosing.handshakeDeadlinePassed(timeoutMs: 10)
        steps.append(("closing before initialize", handshakeClosing))

        for (name, step) in steps {
            let flags = step.loopFlags
            #expect(flags.contains(.requestsInFlight) == step.hasRequestsInFlight, "\(name): requests in flight")
            #expect(flags.contains(.readsHeld) == !step.readsAllowed(channelWritable: true), "\(name): reads held")
            #expect(!step.readsAllowed(channelWritable: false), "\(name): an unwritable channel is never read")
            let admitted = step.admits(requiresHandshake: true, method: "thread/read") == nil
            // The flag may be conservative (the lock then decides), never wrong.
            #expect(!flags.contains(.admitsAll) || admitted, "\(name): admits all")
        }
        #expect(steps.filter { $0.1.loopFlags.contains(.admitsAll) }.map(\.0)
                == ["ready", "ready, one queued", "ready, the queue full", "ready, below the limit again"])
        #expect(steps.filter { $0.1.loopFlags.contains(.readsHeld) }.map(\.0)
                == ["ready, the queue full", "closing", "closed", "closing before initialize"])
    }

    @Test("notifications are numbered 1, 2, 3 per connection, a skipped one spends its number, and the backlog limit closes the connection once")
    func notificationBacklog() {
        var machine = Machine(bounds: .init(maxNotificationBacklogBytes: 100))
        #expect(machine.notificationNumber(method: "turn/started") == .drop, "nothing before initialize")
        _ = machine.initialized(Machine.Session(optOut: ["item/started"]))
        #expect(machine.notificationNumber(method: "item/started") == .drop, "opted out")
        #expect(machine.notificationNumber(method: "turn/started") == .number(1))
        let sixty = machine.notificationQueued(bytes: 60)
        #expect(sixty == .send)
        #expect(machine.notificationNumber(method: "turn/started") == .number(2))
        machine.notificationSkipped()
        #expect(machine.notificationNumber(method: "turn/started") == .number(3))
        let forty = machine.notificationQueued(bytes: 40)
        #expect(forty == .send, "exactly at the limit")
        machine.notificationBytesWritten(60)
        #expect(machine.notificationBacklog == 40)
        #expect(machine.notificationNumber(method: "turn/started") == .number(4))
        guard case let .close(code, message, reason) = machine.notificationQueued(bytes: 61) else {
            Issue.record("a backlog over the limit did not close"); return
        }
        #expect(code == .resourceExhausted && reason == .slowSubscriber && message.contains("40 notification bytes"))
        #expect(machine.isClosing && machine.notificationNumber(method: "turn/started") == .drop)
        let afterClose = machine.notificationQueued(bytes: 1)
        #expect(afterClose == .drop)
        let secondClose = machine.close(.unavailable, "again", reason: .idle)
        #expect(secondClose == .none, "one last frame")
    }

    @Test("a pending call gets its answer once; late, duplicate and unknown answers change nothing")
    func pendingCallAnswered() async throws {
        let calls = PendingCalls<String>()
        let sent = SentIDs()
        async let answer = calls.call { id in sent.add(id) }
        let id = try await sent.first()
        #expect(calls.resolve(id, with: "first"))
        #expect(try await answer == "first")
        #expect(!calls.resolve(id, with: "second"), "a duplicate answer finds no call")
        #expect(!calls.resolve(id + 100, with: "stray"), "an id never issued finds no call")
        #expect(calls.count == 0)
    }

    @Test("a pending call fails at its deadline, on cancellation, and when the connection closes")
    func pendingCallFailures() async throws {
        let calls = PendingCalls<String>()
        await #expect(throws: CallFailure.deadlineExceeded(milliseconds: 50)) {
            try await calls.call(deadline: .milliseconds(50)) { _ in }
        }
        #expect(calls.count == 0, "the expired call is forgotten")

        let sent = SentIDs()
        let waiting = Task { try await calls.call { id in sent.add(id) } }
        let cancelledID = try await sent.first()
        waiting.cancel()
        await #expect(throws: CallFailure.cancelled) { try await waiting.value }
        #expect(!calls.resolve(cancelledID, with: "late"), "an answer after cancellation changes nothing")

        let closing = SentIDs()
        let pending = Task { try await calls.call(deadline: .seconds(60)) { id in closing.add(id) } }
        _ = try await closing.first()
        calls.closeAll()
        await #expect(throws: CallFailure.connectionClosed) { try await pending.value }
        await #expect(throws: CallFailure.connectionClosed) { try await calls.call { _ in } }
    }

    @Test("every method of the contract has one table entry, and each entry reads the thread field the contract names")
    func methodTableCoversTheContract() throws {
        for field in Wire.Request.Params.fieldNames {
            let params = try #require(try Wire.Request.Params.fromJSON(fieldName: field, .object([]), path: field))
            let spec = try #require(MethodTable.methods[params.methodName], "no entry for \(params.methodName)")
            #expect(spec.name == params.methodName)
            #expect(spec.requiresHandshake == !["initialize", "health/check", "reflection/descriptors"].contains(spec.name))
            guard let thread = spec.thread else { continue }
            #expect(thread.read(params) == nil, "\(spec.name): empty params name no thread")
            let named = try #require(try Wire.Request.Params.fromJSON(
                fieldName: field, .object([(thread.name, .string("t-1"))]), path: field))
            #expect(thread.read(named) == "t-1", "\(spec.name) reads its thread from \(thread.name)")
        }
        #expect(MethodTable.methods.count == Wire.Request.Params.fieldNames.count)
        let readsOnly = MethodTable.methods.values.filter { !$0.mutates }.map(\.name).sorted()
        #expect(readsOnly == ["cluster/status", "health/check", "initialize", "mcp_server/list", "model/list", "reflection/descriptors", "thread/items/list",
                              "thread/list", "thread/loaded/list", "thread/queue/list", "thread/read", "thread/subscribe", "thread/turns/list"])
    }

    @Test("the gRPC service has one rpc per table entry, named after its field, whose request bytes are that method's params")
    func grpcServiceMirrorsTheTable() throws {
        #expect(WireSchema.serviceName == "threadwire.v1.Threadwire")
        #expect(Set(WireSchema.serviceMethods.map(\.method)) == Set(MethodTable.methods.keys))
        #expect(WireSchema.serviceMethods.count == MethodTable.methods.count)
        for method in WireSchema.serviceMethods {
            let field = try #require(Wire.Request.Params.fieldNames.first { params in
                (try? Wire.Request.Params.fromJSON(fieldName: params, .object([]), path: params))?.methodName == method.method
            })
            #expect(method.rpc == field.split(separator: "_").map { $0.prefix(1).uppercased() + $0.dropFirst() }.joined())
            // Empty bytes are a valid empty message of the rpc's own type.
            #expect(try method.params([]).methodName == method.method)
        }
        let start = try #require(WireSchema.serviceMethods.first { $0.rpc == "ThreadStart" })
        let bytes = Wire.ThreadStartParams(model: "m-1").serializedBytes()
        guard case let .threadStart(decoded) = try start.params(bytes) else { Issue.record("ThreadStart took other params"); return }
        #expect(decoded.model == "m-1")
    }
}

/// Ids a test's `send` saw, for the test to answer them.
final class SentIDs: Sendable {
    private let ids = LockedIDs()
    func add(_ id: UInt64) { ids.append(id) }
    func first() async throws -> UInt64 {
        let deadline = ContinuousClock.now + .seconds(30)
        while ContinuousClock.now < deadline {
            if let id = ids.first { return id }
            try await Task.sleep(for: .milliseconds(2))
        }
        throw TestTimeout(description: "no call was sent")
    }
}

import Synchronization
final class LockedIDs: Sendable {
    private let box = Mutex<[UInt64]>([])
    func append(_ id: UInt64) { box.withLock { $0.append(id) } }
    var first: UInt64? { box.withLock { $0.first } }

    @Test("HOST:PORT is read one way everywhere: the port after the last colon, 0 to 65535")
    func hostPort() {
        #expect(HostPort("127.0.0.1:7420") == HostPort(host: "127.0.0.1", port: 7420))
        #expect(HostPort("[::1]:0") == HostPort(host: "[::1]", port: 0))
        #expect(HostPort("db.internal:65535")?.description == "db.internal:65535")
        #expect(HostPort("localhost") == nil)
        #expect(HostPort("localhost:65536") == nil)
        #expect(HostPort("localhost:-1") == nil)
        #expect(HostPort("localhost:http") == nil)
    }
}
