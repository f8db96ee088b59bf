public import Synchronization
public import ThreadwireClient
public import ThreadwireWire

/// A kept notification as tests compare it (issue 49): its number in its
/// thread and its payload (the per-connection sequence and trace differ).
public struct KeptEvent: Equatable, CustomStringConvertible, Sendable {
    public var number: UInt64
    public var payload: Wire.Notification.Payload
    public var description: String { "\(number) \(payload.methodName)" }
    public init(number: UInt64, payload: Wire.Notification.Payload) {
        self.number = number
        self.payload = payload
    }

    /// The numbered notifications among `notifications` (of `thread` only, if given).
    public static func of(_ notifications: [Wire.Notification], thread: String? = nil) -> [KeptEvent] {
        notifications.compactMap { note in
            guard let number = note.threadSequence, let payload = note.payload,
                  thread == nil || payload.threadID == thread else { return nil }
            return KeptEvent(number: number, payload: payload)
        }
    }
}

extension Inbox {
    /// The kept events of `thread` heard so far, once the one numbered
    /// `head` is among them (or `timeout` passed: then what was heard).
    public func kept(of thread: String, through head: UInt64, timeout: Duration = .seconds(10)) async throws -> [KeptEvent] {
        let deadline = ContinuousClock.now + timeout
        var events: [KeptEvent] = []
        while ContinuousClock.now < deadline {
            events = KeptEvent.of(all, thread: thread)
            if events.last?.number == head { break }
            try await Task.sleep(for: .milliseconds(20))
        }
        return events
    }
}

/// Raised while writers run; a reader checks it between its connections.
public final class RunningFlag: Sendable {
    private let raised = Mutex(true)
    public init() {}
    public var isRaised: Bool { raised.withLock { $0 } }
    public func lower() { raised.withLock { $0 = false } }
}
