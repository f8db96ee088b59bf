import Foundation

/// A task executor with an OS thread of its own, for work that must happen
/// on time whatever the rest of the process does. On the shared pool (one
/// thread per core) two tasks that block their threads hold every other task
/// back for as long as they block: at the start of a full test run on 2
/// cores that was 7.7 s, and lease renewals held back past the lease make an
/// instance give up its trees although the store answers.
public final class DedicatedThreadExecutor: TaskExecutor, @unchecked Sendable {
    /// Guards `jobs`; signalled when one is added.
    private let condition = NSCondition()
    private var jobs: [UnownedJob] = []

    /// The executor lease renewals run on, one for the process.
    public static let leases = DedicatedThreadExecutor(name: "threadwire-leases")

    public init(name: String) {
        // The thread keeps the executor: both live as long as the process.
        let thread = Thread { [self] in
            Thread.current.threadDictionary[Self.marker] = self
            run()
        }
        thread.name = name
        thread.start()
    }

    private static let marker = "threadwire.DedicatedThreadExecutor"

    /// Whether the caller runs on this executor's thread.
    public var isCurrent: Bool { (Thread.current.threadDictionary[Self.marker] as AnyObject?) === self }

    public func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        condition.lock()
        jobs.append(job)
        condition.signal()
        condition.unlock()
    }

    private func run() {
        var batch: [UnownedJob] = []
        while true {
            condition.lock()
            while jobs.isEmpty { condition.wait() }
            swap(&batch, &jobs)
            condition.unlock()
            for job in batch { job.runSynchronously(on: asUnownedTaskExecutor()) }
            batch.removeAll(keepingCapacity: true)
        }
    }
}
