public import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// A child process started with posix_spawn, for the harness's frequent
/// spawns (every server process, every CLI run).
///
/// Why not Foundation's `Process`: on Linux its `run()` lists /proc/self/fd
/// to find the descriptors to close, copying each entry's whole 256-byte
/// name, which reads past the end of glibc's directory buffer when the list
/// fills it (about 1,365 descriptors). The test process passes that under the
/// full suite (1,537 at most in one run), and `run()` then segfaulted: once
/// in the suite, and in 2 of 6 runs of a 25-line program holding 1,400
/// descriptors (none of 6 at 1,200). Here the child closes every descriptor
/// above 2 itself (`posix_spawn_file_actions_addclosefrom_np`).
public final class SpawnedProcess: @unchecked Sendable {
    public let processIdentifier: Int32
    private let lock = NSLock()
    /// The raw wait status, once reaped.
    private var waitStatus: Int32?

    public struct SpawnError: Error, CustomStringConvertible { public var description: String }

    /// - Parameters:
    ///   - environment: the whole environment (nil: this process's).
    ///   - standardOutput, standardError: descriptors the child gets as 1
    ///     and 2 (nil: this process's); its standard input is /dev/null.
    public init(executable: String, arguments: [String], environment: [String: String]? = nil,
                standardOutput: Int32? = nil, standardError: Int32? = nil) throws {
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        if let standardOutput { posix_spawn_file_actions_adddup2(&actions, standardOutput, 1) }
        if let standardError { posix_spawn_file_actions_adddup2(&actions, standardError, 2) }
        guard let closeFrom = Self.addCloseFrom else { throw SpawnError(description: "posix_spawn_file_actions_addclosefrom_np is missing (glibc 2.34 or later)") }
        closeFrom(&actions, 3)
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        // Signals as a fresh process has them, whatever this one blocks or ignores.
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK))
        var defaults = sigset_t()
        sigemptyset(&defaults)
        sigaddset(&defaults, SIGPIPE)
        posix_spawnattr_setsigdefault(&attributes, &defaults)
        var mask = sigset_t()
        sigemptyset(&mask)
        posix_spawnattr_setsigmask(&attributes, &mask)
        let argv = ([executable] + arguments).map { strdup($0) } + [nil]
        let envp = (environment ?? ProcessInfo.processInfo.environment).map { strdup("\($0.key)=\($0.value)") } + [nil]
        defer {
            argv.forEach { free($0) }
            envp.forEach { free($0) }
        }
        var pid: pid_t = 0
        let result = posix_spawn(&pid, executable, &actions, &attributes, argv, envp)
        guard result == 0 else { throw SpawnError(description: "cannot start \(executable): \(String(cString: strerror(result)))") }
        processIdentifier = pid
    }

    private typealias AddCloseFrom = @convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, Int32) -> Int32
    /// Not in Swift's Glibc module (a GNU extension): looked up by name.
    private static let addCloseFrom: AddCloseFrom? = {
        guard let symbol = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "posix_spawn_file_actions_addclosefrom_np") else { return nil }
        return unsafeBitCast(symbol, to: AddCloseFrom.self)
    }()

    /// Reaps the child if it has exited; its raw wait status then.
    private func reaped() -> Int32? {
        lock.withLock {
            if let waitStatus { return waitStatus }
            var status: Int32 = 0
            var result: pid_t
            repeat { result = waitpid(processIdentifier, &status, WNOHANG) } while result == -1 && errno == EINTR
            if result == processIdentifier { waitStatus = status }
            return waitStatus
        }
    }

    public var isRunning: Bool { reaped() == nil }

    /// How it ended: by an exit, or by a signal.
    public var terminationReason: Process.TerminationReason {
        guard let status = reaped() else { return .exit }
        return status & 0x7f == 0 ? .exit : .uncaughtSignal
    }

    /// The exit status, or the signal that ended it (0 while running).
    public var terminationStatus: Int32 {
        guard let status = reaped() else { return 0 }
        return status & 0x7f == 0 ? (status >> 8) & 0xff : status & 0x7f
    }

    /// SIGTERM.
    public func terminate() { kill(processIdentifier, SIGTERM) }
}

/// The exit status (128 + the signal for a signal), or nil if the process is
/// still running after `seconds`.
public func waitForExit(_ process: SpawnedProcess, seconds: Double) -> Int32? {
    process.waitForExit(timeout: seconds)
    guard !process.isRunning else { return nil }
    return process.terminationReason == .uncaughtSignal ? 128 + process.terminationStatus : process.terminationStatus
}
