import Dispatch

/// libdispatch, which runs Swift concurrency's timers on Linux, opens its
/// epoll and eventfd and one timerfd per clock (uptime, continuous, wall)
/// lazily, on the first timer of each kind, and traps (SIGILL) when that
/// open fails. Out of file descriptors, a server whose first timer of some
/// clock came late (a background pass, a deadline) died. `prepare()` makes
/// every one of them exist while descriptors are still free, before the
/// server listens; libdispatch keeps them for the process's life.
public enum RuntimeTimers {
    public static func prepare() async {
        try? await Task.sleep(for: .milliseconds(1), clock: .continuous)
        try? await Task.sleep(for: .milliseconds(1), clock: .suspending)
        await withCheckedContinuation { (done: CheckedContinuation<Void, Never>) in
            DispatchQueue.global().asyncAfter(wallDeadline: .now() + .milliseconds(1)) { done.resume() }
        }
        await withCheckedContinuation { (done: CheckedContinuation<Void, Never>) in
            DispatchQueue.global().asyncAfter(deadline: .now() + .milliseconds(1)) { done.resume() }
        }
    }
}
