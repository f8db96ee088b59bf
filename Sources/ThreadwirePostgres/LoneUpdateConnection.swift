import Logging
import NIOCore
import NIOPosix
import PostgresNIO
import Synchronization
import ThreadwireCore

/// A connection of its own for lone updates (`PostgresThreadStore.commit`),
/// outside the pool: a lone update then needs no lease, and its deadline
/// closes this connection, which fails the statement at once. Through the
/// pool, the deadline had to run the statement in a task of its own that it
/// could abandon (a task, a continuation and two executor hops: about 13 µs
/// of a lone update's 100 in the server). One update uses it at a time;
/// while it is busy, connecting or gone, commits take the group commit.
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
    private let configuration: PostgresConnection.Configuration
    private let logger: Logger
    static let retryDelay: Duration = .seconds(1)

    init(configuration: PostgresConnection.Configuration, logger: Logger) {
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
        let (configuration, logger) = (configuration, logger)
        Task {
            let made: PostgresConnection?
            do {
                made = try await PostgresConnection.connect(
                    on: MultiThreadedEventLoopGroup.singleton.next(), configuration: configuration, id: 0, logger: logger)
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
