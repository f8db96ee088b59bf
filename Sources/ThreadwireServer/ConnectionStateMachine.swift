import ThreadwireCore

/// A connection's life as a pure value: it takes events and says what to do,
/// with no socket, lock or clock of its own, so every transition is tested
/// directly (Tests/ThreadwireServerTests/CallLayerTests.swift).
/// `Connection` holds one under its lock and carries out the actions.
///
///     handshake ──initialize──▶ ready ──server drains──▶ draining
///         │                       │                          │
///         └───────── close (timeout, idle, refusal, backlog, revoked token) ──▶ closing ──channel inactive──▶ closed
///
/// Beside the phase it keeps what bounds the memory a client can make the
/// server hold: requests read but not answered (past the limits reads
/// pause until they drain) and notification bytes queued but not yet taken
/// by the socket (past the backlog limit the connection closes), and the
/// per-connection notification numbers.
struct ConnectionStateMachine: Sendable {
    /// The bounds the queue and the backlog are held to.
    struct Bounds: Sendable, Equatable {
        var maxQueuedRequests = Int.max
        var maxQueuedRequestBytes = Int.max
        var maxNotificationBacklogBytes = Int.max
    }

    /// Requests read and not yet answered.
    struct RequestQueue: Sendable, Equatable {
        var requests = 0
        var bytes = 0
        /// Reads were paused because the queue filled.
        var readsPaused = false
    }

    /// After a request left the queue.
    struct Finished: Sendable, Equatable {
        /// The queue is below its limits again after pausing reads.
        var resumeReads = false
        /// Nothing is queued: whoever waits for the drain may go on.
        var queueEmpty = false
    }

    /// What to do with a notification being sent.
    enum NotificationAction: Sendable, Equatable {
        /// Not for this connection (no session, closing, or opted out).
        case drop
        /// Frame it with this number.
        case number(UInt64)
    }

    /// After a numbered notification's frame was built.
    enum QueuedAction: Sendable, Equatable {
        case send
        /// Closing already: not sent.
        case drop
        /// Over the backlog: the notification is not sent and the connection closes.
        case close(StatusCode, String, reason: CloseReason)
    }

    /// Who the connection acts for, fixed by initialize.
    struct Session: Sendable, Equatable {
        var principal: Principal = .standalone
        var optOut: Set<String> = []
        /// The token it authenticated with, to close it if the token is
        /// revoked (SIGHUP). Never logged.
        var credential: [UInt8]?
        /// Another instance relaying its clients' requests.
        var peer = false
        /// The server requests it answers (declared in initialize).
        var capabilities: Set<ClientCapability> = []
    }

    enum State: Sendable, Equatable {
        case handshake
        case ready(Session)
        /// The server is shutting down: requests that need the handshake are refused.
        case draining(Session?)
        /// A last frame is on its way: no notification is sent any more.
        /// Requests already read still run for the session they had.
        case closing(Session?)
        case closed
    }

    enum Action: Sendable, Equatable {
        case none
        /// Send one error frame (a Response without id), then close.
        case close(StatusCode, String, reason: CloseReason)
    }

    private(set) var state: State = .handshake
    private(set) var queue = RequestQueue()
    /// Notification bytes queued for the socket and not yet written.
    private(set) var notificationBacklog = 0
    private var nextSequence: UInt64 = 1
    let bounds: Bounds

    init(bounds: Bounds = Bounds()) { self.bounds = bounds }

    var session: Session? {
        switch state {
        case let .ready(session): session
        case let .draining(session): session
        case let .closing(session): session
        case .handshake, .closed: nil
        }
    }

    var isInitialized: Bool { session != nil }
    var isClosing: Bool {
        switch state {
        case .closing, .closed: true
        case .handshake, .ready, .draining: false
        }
    }
    var isDraining: Bool { if case .draining = state { true } else { false } }

    /// initialize succeeded: false if the connection already had one (or is going away).
    mutating func initialized(_ session: Session) -> Bool {
        guard case .handshake = state else { return false }
        state = .ready(session)
        return true
    }

    mutating func handshakeDeadlinePassed(timeoutMs: Int) -> Action {
        guard case .handshake = state else { return .none }
        state = .closing(nil)
        return .close(.deadlineExceeded, "initialize did not complete within handshake_timeout_ms (\(timeoutMs)); closing", reason: .handshakeTimeout)
    }

    /// Read-idle for the whole timeout: closed if initialized, nothing is in
    /// flight and it holds no subscription (subscribers wait for
    /// notifications by design). Before initialize the handshake deadline decides.
    mutating func idleTimeoutPassed(timeoutMs: Int, requestsInFlight: Bool, subscribed: Bool) -> Action {
        guard case let .ready(session) = state, !requestsInFlight, !subscribed else { return .none }
        state = .closing(session)
        return .close(.unavailable, "no request for idle_timeout_ms (\(timeoutMs)) with none in flight and no subscription; closing", reason: .idle)
    }

    mutating func serverDraining() {
        switch state {
        case .handshake: state = .draining(nil)
        case let .ready(session): state = .draining(session)
        case .draining, .closing, .closed: break
        }
    }

    /// Whether a request may start now; the refusal otherwise.
    func admits(requiresHandshake: Bool, method: String) -> RequestError? {
        guard requiresHandshake else { return nil }
        switch state {
        case .handshake: return RequestError(.failedPrecondition, "call initialize before \(method)")
        case .ready: return nil
        case .draining(nil): return RequestError(.failedPrecondition, "call initialize before \(method)")
        case .draining: return RequestError(.unavailable, "the server is shutting down")
        case let .closing(session): return session == nil ? RequestError(.failedPrecondition, "call initialize before \(method)") : nil
        case .closed: return RequestError(.unavailable, "the connection is closed")
        }
    }

    /// Anything that ends the connection with a last frame: only the first
    /// close sends one.
    mutating func close(_ code: StatusCode, _ message: String, reason: CloseReason) -> Action {
        guard !isClosing else { return .none }
        state = .closing(session)
        return .close(code, message, reason: reason)
    }

    /// A last response that ends the connection (a failed authentication)
    /// is being written: no notification follows it.
    mutating func closingAfterLastResponse() {
        guard !isClosing else { return }
        state = .closing(session)
    }

    mutating func channelClosed() { state = .closed }

    // MARK: The request queue

    /// A request of `bytes` was read and queued. False when the queue is now
    /// full: reads pause until `requestFinished` drains it.
    mutating func requestQueued(bytes: Int) -> Bool {
        queue.requests += 1
        queue.bytes += bytes
        guard queue.requests < bounds.maxQueuedRequests, queue.bytes < bounds.maxQueuedRequestBytes else {
            queue.readsPaused = true
            return false
        }
        return true
    }

    mutating func requestFinished(bytes: Int) -> Finished {
        queue.requests -= 1
        queue.bytes -= bytes
        var finished = Finished(queueEmpty: queue.requests == 0)
        if queue.readsPaused, queue.requests < bounds.maxQueuedRequests, queue.bytes < bounds.maxQueuedRequestBytes {
            queue.readsPaused = false
            finished.resumeReads = true
        }
        return finished
    }

    var hasRequestsInFlight: Bool { queue.requests > 0 }

    /// Whether the socket may be read: not while the queue is full, the
    /// client takes no answers, or the connection is closing.
    func readsAllowed(channelWritable: Bool) -> Bool {
        channelWritable && !queue.readsPaused && !isClosing
    }

    /// What the event loop asks for every request, as bits: `Connection`
    /// stores them in an atomic whenever the machine changes, so asking takes
    /// no lock. Each agrees with the method it stands for (CallLayerTests).
    struct LoopFlags: OptionSet, Sendable, Equatable {
        let rawValue: UInt8
        /// `hasRequestsInFlight`.
        static let requestsInFlight = LoopFlags(rawValue: 1 << 0)
        /// `readsAllowed` is false whatever the channel: the queue is full or the connection is closing.
        static let readsHeld = LoopFlags(rawValue: 1 << 1)
        /// `admits` refuses nothing: initialized, neither draining nor closing.
        static let admitsAll = LoopFlags(rawValue: 1 << 2)
    }

    var loopFlags: LoopFlags {
        var flags: LoopFlags = []
        if hasRequestsInFlight { flags.insert(.requestsInFlight) }
        if queue.readsPaused || isClosing { flags.insert(.readsHeld) }
        if case .ready = state { flags.insert(.admitsAll) }
        return flags
    }

    /// Whether the shutdown drain may stop waiting for this connection:
    /// nothing is queued, or it cannot finish its queue (its client takes
    /// no answers, or it is closing or closed).
    func drainDone(channelWritable: Bool, channelActive: Bool) -> Bool {
        queue.requests == 0 || !channelWritable || !channelActive || isClosing
    }

    // MARK: Notifications

    /// A notification `method` is being sent: its number, or drop it.
    func notificationNumber(method: String) -> NotificationAction {
        guard let session, !isClosing, !session.optOut.contains(method) else { return .drop }
        return .number(nextSequence)
    }

    /// The notification numbered last was too large to send: its number is
    /// spent all the same, so the client sees the gap (and is told why).
    mutating func notificationSkipped() { nextSequence += 1 }

    /// The numbered notification's frame of `bytes` is ready: queued (and
    /// counted in the backlog until `notificationBytesWritten`), unless the
    /// backlog would pass its limit, which closes the connection.
    mutating func notificationQueued(bytes: Int) -> QueuedAction {
        guard !isClosing else { return .drop }
        if notificationBacklog + bytes > bounds.maxNotificationBacklogBytes {
            state = .closing(session)
            return .close(.resourceExhausted,
                "\(notificationBacklog) notification bytes are waiting for this connection to read them; max_notification_backlog_bytes is \(bounds.maxNotificationBacklogBytes); closing",
                reason: .slowSubscriber)
        }
        nextSequence += 1
        notificationBacklog += bytes
        return .send
    }

    /// The socket took `bytes` of queued notifications (or they failed).
    mutating func notificationBytesWritten(_ bytes: Int) { notificationBacklog -= bytes }

    /// Whether a replay may queue `bytes` more now: within half the backlog
    /// limit (the other half is for live notifications meanwhile), or into
    /// an empty backlog (one that large could go no other way), or the
    /// connection is closing (the replay then stops).
    func hasReplayRoom(for bytes: Int) -> Bool {
        isClosing || notificationBacklog == 0 || notificationBacklog + bytes <= bounds.maxNotificationBacklogBytes / 2
    }
}

/// Why the server closed a connection: the `reason` label of
/// `threadwire_connections_closed_by_server_total` and `tw.close.reason` in
/// logs, one list for both.
public enum CloseReason: String, Sendable, CaseIterable {
    /// No initialize within handshake_timeout_ms.
    case handshakeTimeout
    /// Silent for idle_timeout_ms with nothing in flight and no subscription.
    case idle
    /// Notifications left unread past max_notification_backlog_bytes.
    case slowSubscriber
    /// initialize with a missing or wrong token.
    case unauthenticated
    /// The token it authenticated with left the tokens file (SIGHUP).
    case tokenRevoked
    /// Accepted with max_connections already open.
    case maxConnections
    /// Accepted into the reserved descriptor while out of descriptors.
    case outOfDescriptors
    /// A frame that breaks the framing (a bad length, over max_frame_bytes).
    case frameError
    /// Incomplete frames of all connections over max_partial_frame_bytes.
    case partialFrames
}

