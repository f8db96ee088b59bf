public import NIOCore
import NIOPosix
import Synchronization

/// An event loop as a task executor (SE-0417), preferred by the tasks that
/// serve a connection's requests: their jobs run on the connection's loop,
/// not isolated to anything, as on the global executor.
///
/// Why not just the global executor: the server installs NIO's event loops as
/// Swift's global executor, and NIO runs each of those jobs *isolated to the
/// loop* (`runSynchronously(on:)` with the loop as the serial executor).
/// Every nonisolated `async` function hops to the generic executor on entry
/// and after each `await`; from a serial executor that hop cannot continue
/// in place, so the runtime enqueues the job again and the loop picks it up
/// on its next pass. A settings/update on PostgreSQL made 62 such enqueues
/// per request. A job run here is on the generic executor with this executor
/// preferred, which is what those hops ask for, so they go on at once (4
/// enqueues per request were left: the real suspensions, such as the
/// database's answer).
public final class EventLoopTaskExecutor: TaskExecutor, @unchecked Sendable {
    public let eventLoop: any EventLoop

    private init(eventLoop: any EventLoop) { self.eventLoop = eventLoop }

    public func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        let executor = asUnownedTaskExecutor()
        eventLoop.execute { job.runSynchronously(on: executor) }
    }

    /// One per loop, made on first use and kept for the process (the loops
    /// of `MultiThreadedEventLoopGroup.singleton` live as long). Each holds
    /// its loop, so no other loop can take a key's address while it is here.
    private static let byLoop = Mutex<[ObjectIdentifier: EventLoopTaskExecutor]>([:])

    /// The executor of the event loop running the caller; nil off a
    /// `MultiThreadedEventLoopGroup` thread (a test's `EmbeddedEventLoop`
    /// runs jobs only when the test turns it, and from one thread only).
    public static func current() -> EventLoopTaskExecutor? {
        guard let eventLoop = MultiThreadedEventLoopGroup.currentEventLoop else { return nil }
        return byLoop.withLock { executors in
            if let executor = executors[ObjectIdentifier(eventLoop)] { return executor }
            let executor = EventLoopTaskExecutor(eventLoop: eventLoop)
            executors[ObjectIdentifier(eventLoop)] = executor
            return executor
        }
    }
}
