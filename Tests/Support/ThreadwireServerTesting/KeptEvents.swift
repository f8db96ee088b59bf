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
    public func kept(of thread: String, through head: UInt64, timeout: Duration = Patience.standard) async throws -> [KeptEvent] {
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

/// The two ways a client joins a thread's events after a position: as a
/// participant (thread/resume) or as a watcher (thread/subscribe). Tests of
/// what a joining client hears run with both.
public enum Joining: String, CaseIterable, Sendable, CustomStringConvertible {
    case resume = "thread/resume"
    case subscribe = "thread/subscribe"

    public var description: String { rawValue }

    /// The request joining `thread` after event `after`.
    public func request(_ thread: String, after: UInt64) -> Wire.Request.Params {
        switch self {
        case .resume: .threadResume(Wire.ThreadResumeParams(threadId: thread, excludeTurns: true, afterThreadSequence: after))
        case .subscribe: .threadSubscribe(Wire.ThreadSubscribeParams(threadId: thread, afterThreadSequence: after))
        }
    }
}
