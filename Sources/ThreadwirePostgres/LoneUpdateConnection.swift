import Logging
import NIOCore
import NIOPosix
import PostgresNIO
import Synchronization

/// Connections of their own for lone updates (`PostgresThreadStore.commit`),
/// outside the pool, one per event loop, each made on first use. A lone
/// update runs on the connection of the loop its task runs on (the loop of
/// its client's connection): PostgreSQL's answer is then read on the same
/// thread and the task resumes there. With the pool's connections on other
/// loops, each update crossed between loops twice, which cost about 80 µs
/// of a lone update's 270 on 2 cores. Outside the pool an update also needs
/// no lease, and its deadline can close its connection, which ends the
/// statement at once (through the pool it ran in a task of its own that the
/// deadline abandoned: a task, a continuation and two executor hops).
///
/// Only a caller running on one of the group's loops gets one (the server
/// runs its tasks on them): postgres-nio drops a statement written to a
/// connection that has just closed without ever failing it, so the
/// statement must be written from the connection's own loop right after
/// checking that it is open (see `PostgresThreadStore.updateThread`).
final class LoneUpdateConnections: Sendable {
    private let byLoop: [ObjectIdentifier: LoneUpdateConnection]

    init(configuration: PostgresConnection.Configuration, logger: Logger,
         group: MultiThreadedEventLoopGroup = .singleton) {
        var byLoop: [ObjectIdentifier: LoneUpdateConnection] = [:]
        for loop in group.makeIterator() {
            byLoop[ObjectIdentifier(loop)] = LoneUpdateConnection(on: loop, configuration: configuration, logger: logger)
        }
        self.byLoop = byLoop
    }

    /// The calling loop's connection, the caller's until it gives it back
    /// (see `LoneUpdateConnection.take`); nil off the group's loops.
    func take() -> (line: LoneUpdateConnection, connection: PostgresConnection)? {
        guard let loop = MultiThreadedEventLoopGroup.currentEventLoop, let line = byLoop[ObjectIdentifier(loop)] else { return nil }
        return line.take().map { (line, $0) }
    }

    /// At shutdown.
    func close() {
        for line in byLoop.values { line.close() }
    }
}

/// One event loop's connection for lone updates. One update uses it at a
/// time; while it is busy, connecting or gone, commits take the group commit.
final class LoneUpdateConnection: Sendable {
    private enum State {
        case idle(PostgresConnection)
        case inUse
        case connecting
        /// No connection; the next one is tried from `retryAt` on, so a
        /// database that went away is not dialled at every commit.
        case absent(retryAt: ContinuousClock.Instant)
        case closed
    }

    private let state = Mutex(State.absent(retryAt: .now))
    private let eventLoop: any EventLoop
    private let configuration: PostgresConnection.Configuration
    private let logger: Logger
    static let retryDelay: Duration = .seconds(1)

    init(on eventLoop: any EventLoop, configuration: PostgresConnection.Configuration, logger: Logger) {
        self.eventLoop = eventLoop
        self.configuration = configuration
        self.logger = logger
    }

    /// The connection, the caller's until `giveBack` or `discard`, if it is
    /// idle; nil otherwise (one is then made in the background if none is).
    func take() -> PostgresConnection? {
        let (connection, connect) = state.withLock { state -> (PostgresConnection?, Bool) in
            switch state {
            case let .idle(connection) where connection.isClosed:
                // Closed while idle (a restart, a network failure): a new one.
                state = .connecting
                return (nil, true)
            case let .idle(connection):
                state = .inUse
                return (connection, false)
            case let .absent(retryAt) where retryAt <= .now:
                state = .connecting
                return (nil, true)
            case .absent, .inUse, .connecting, .closed:
                return (nil, false)
            }
        }
        if connect { startConnecting() }
        return connection
    }

    /// Back after a statement that ended: kept if it is still open.
    func giveBack(_ connection: PostgresConnection) {
        guard !connection.isClosed else { return discard(connection) }
        let stillOpen = state.withLock { state -> Bool in
            guard case .inUse = state else { return false }
            state = .idle(connection)
            return true
        }
        if !stillOpen { connection.closeNow() }
    }

    /// After a failure or a deadline: closed, and a new one made later.
    func discard(_ connection: PostgresConnection) {
        state.withLock { state in
            if case .inUse = state { state = .absent(retryAt: .now) }
        }
        connection.closeNow()
    }

    /// At shutdown.
    func close() {
        let idle = state.withLock { state -> PostgresConnection? in
            defer { state = .closed }
            if case let .idle(connection) = state { return connection }
            return nil
        }
        idle?.closeNow()
    }

    private func startConnecting() {
        let (eventLoop, configuration, logger) = (eventLoop, configuration, logger)
        Task {
            let made: PostgresConnection?
            do {
                made = try await PostgresConnection.connect(on: eventLoop, configuration: configuration, id: 0, logger: logger)
            } catch {
                logger.debug("PostgreSQL: the lone-update connection failed; commits use the group commit",
                             metadata: ["tw.error": "\(error)"])
                made = nil
            }
            let kept = state.withLock { state -> Bool in
                guard case .connecting = state else { return false }
                state = made.map { .idle($0) } ?? .absent(retryAt: .now + Self.retryDelay)
                return made != nil
            }
            if !kept { made?.closeNow() }
        }
    }
}

/// Whether a deadline or the statement came first, decided once: after the
/// statement ends, the deadline no longer closes anything.
final class StatementDeadline: Sendable {
    private enum State { case running, settled, expired }
    private let state = Mutex(State.running)

    /// From the deadline: true if it came first (the caller then closes the connection).
    func expire() -> Bool {
        state.withLock { state in
            guard case .running = state else { return false }
            state = .expired
            return true
        }
    }

    /// From the statement's end: true if the deadline came first.
    func settle() -> Bool {
        state.withLock { state in
            guard case .running = state else { return true }
            state = .settled
            return false
        }
    }
}

extension PostgresConnection {
    /// Closes without waiting (the channel fails whatever still runs on
    /// it); the connection is kept until it is closed, as it asks.
    func closeNow() {
        let closed: EventLoopFuture<Void> = close()
        closed.whenComplete { _ in withExtendedLifetime(self) {} }
    }
}
