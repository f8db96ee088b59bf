import Dispatch
import Foundation
import Synchronization

/// libdispatch, which runs Swift concurrency's timers on Linux, opens one
/// timerfd per clock (uptime, continuous, wall) on the first timer of that
/// clock; out of file descriptors that open fails and the clock's timers
/// never fire. `prepare()` arms a timer of every clock that never fires, so
/// each timerfd exists before the server listens and stays for the process's
/// life, and waits until the kernel shows them. (What libdispatch opens
/// every second, and dies of when it cannot, is kept free by
/// `DescriptorBudget`.)
public enum RuntimeTimers {
    /// Written once, under `prepared`; only kept alive, never read.
    nonisolated(unsafe) private static var keepers: [any DispatchSourceTimer] = []
    private static let prepared = Mutex(false)
    private static let aYear: DispatchTimeInterval = .seconds(365 * 24 * 3600)

    public static func prepare() async {
        guard prepared.withLock({ done in defer { done = true }; return !done }) else { return }
        let uptime = DispatchSource.makeTimerSource(queue: .global())
        uptime.schedule(deadline: .now() + aYear)
        uptime.setEventHandler {}
        uptime.resume()
        let wall = DispatchSource.makeTimerSource(queue: .global())
        wall.schedule(wallDeadline: .now() + aYear)
        wall.setEventHandler {}
        wall.resume()
        keepers = [uptime, wall]
        // The continuous clock has no Dispatch API: a task that sleeps on it.
        Task.detached(priority: .background) { try? await Task.sleep(for: .seconds(365 * 24 * 3600), clock: .continuous) }
        #if os(Linux)
        // libdispatch arms them on its manager thread a moment later.
        let deadline = ContinuousClock.now + .seconds(5)
        while !timerClocks().isSuperset(of: [realtime, boottime]), ContinuousClock.now < deadline {
            try? await Task.sleep(for: .milliseconds(2))
        }
        #endif
    }

    static let realtime = 0, boottime = 7

    /// The clock ids of a process's timerfds (Linux's /proc: 0 realtime,
    /// 1 monotonic, 7 boottime); empty elsewhere.
    public static func timerClocks(ofProcess process: String = "self") -> Set<Int> {
        var clocks: Set<Int> = []
        let files = FileManager.default
        for descriptor in (try? files.contentsOfDirectory(atPath: "/proc/\(process)/fd")) ?? [] {
            guard (try? files.destinationOfSymbolicLink(atPath: "/proc/\(process)/fd/\(descriptor)")) == "anon_inode:[timerfd]",
                  let info = try? String(contentsOfFile: "/proc/\(process)/fdinfo/\(descriptor)", encoding: .utf8),
                  let line = info.split(separator: "\n").first(where: { $0.hasPrefix("clockid:") }),
                  let clock = Int(line.dropFirst("clockid:".count).trimmingCharacters(in: .whitespaces)) else { continue }
            clocks.insert(clock)
        }
        return clocks
    }
}
