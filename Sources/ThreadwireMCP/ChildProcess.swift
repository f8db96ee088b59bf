import Foundation
import SystemPackage

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// A child process on two pipes (its stdin and stdout; stderr is ours),
/// reaped by a blocking waitpid on a thread of its own.
///
/// Why not swift-subprocess: with 1.0.2 on the machines this project runs
/// on, children that exited stayed zombies and `run` never returned (seen
/// under the test suite's load), so a supervisor never learned that its
/// server had died. waitpid(pid) on a dedicated thread cannot miss an exit.
struct ChildProcess: Sendable {
    let pid: pid_t
    /// Our ends: we write the child's stdin, read its stdout.
    let toChild: FileDescriptor
    let fromChild: FileDescriptor

    struct SpawnError: Error, CustomStringConvertible { var description: String }

    /// `command` is run by name through PATH unless it contains a '/'.
    static func spawn(command: String, arguments: [String], environment: [String: String], cwd: String?) throws -> ChildProcess {
        let input = try FileDescriptor.pipe()
        let output: (readEnd: FileDescriptor, writeEnd: FileDescriptor)
        do { output = try FileDescriptor.pipe() } catch {
            try? input.readEnd.close()
            try? input.writeEnd.close()
            throw error
        }
        // Our ends never reach the child (it would never see EOF on stdin).
        _ = fcntl(input.writeEnd.rawValue, F_SETFD, FD_CLOEXEC)
        _ = fcntl(output.readEnd.rawValue, F_SETFD, FD_CLOEXEC)
        defer {
            try? input.readEnd.close()
            try? output.writeEnd.close()
        }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_adddup2(&actions, input.readEnd.rawValue, 0)
        posix_spawn_file_actions_adddup2(&actions, output.writeEnd.rawValue, 1)
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        // Its own process group: a signal for ours (Ctrl-C) is not one for it; we stop it.
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK))
        posix_spawnattr_setpgroup(&attributes, 0)
        var defaults = sigset_t()
        sigemptyset(&defaults)
        sigaddset(&defaults, SIGPIPE)
        posix_spawnattr_setsigdefault(&attributes, &defaults)
        var mask = sigset_t()
        sigemptyset(&mask)
        posix_spawnattr_setsigmask(&attributes, &mask)

        var merged = ProcessInfo.processInfo.environment
        for (key, value) in environment { merged[key] = value }
        // Glibc's Swift module lacks posix_spawn_file_actions_addchdir_np: coreutils' env changes directory.
        let line = cwd.map { ["/usr/bin/env", "--chdir=\($0)", command] } ?? [command]
        let argv = (line + arguments).map { strdup($0) } + [nil]
        let envp = merged.map { strdup("\($0.key)=\($0.value)") } + [nil]
        defer {
            argv.forEach { free($0) }
            envp.forEach { free($0) }
        }
        var pid: pid_t = 0
        let result = line[0].contains("/")
            ? posix_spawn(&pid, line[0], &actions, &attributes, argv, envp)
            : posix_spawnp(&pid, line[0], &actions, &attributes, argv, envp)
        guard result == 0 else {
            try? input.writeEnd.close()
            try? output.readEnd.close()
            throw SpawnError(description: "cannot start \(command): \(String(cString: strerror(result)))")
        }
        return ChildProcess(pid: pid, toChild: input.writeEnd, fromChild: output.readEnd)
    }

    /// Waits for the exit (reaping it) and describes it.
    func waitForExit() async -> String {
        let pid = self.pid
        return await withCheckedContinuation { continuation in
            Thread.detachNewThread {
                var status: Int32 = 0
                while waitpid(pid, &status, 0) == -1 && errno == EINTR {}
                let signal = status & 0x7f
                continuation.resume(returning: signal == 0 ? "exited with status \((status >> 8) & 0xff)" : "killed by signal \(signal)")
            }
        }
    }

    /// SIGTERM, then SIGKILL if it is still there after `grace`.
    func terminate(grace: Duration = .seconds(2)) {
        kill(pid, SIGTERM)
        let pid = self.pid
        Task.detached {
            try? await Task.sleep(for: grace)
            // Still ours while unreaped: the pid cannot have been reused.
            kill(pid, SIGKILL)
        }
    }

    func closePipes() {
        try? toChild.close()
        try? fromChild.close()
    }
}
