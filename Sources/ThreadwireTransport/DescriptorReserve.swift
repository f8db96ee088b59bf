#if canImport(Glibc)
import Glibc
#endif
import NIOCore
import Synchronization

/// One file descriptor kept in reserve for running out of them. When accept
/// fails with EMFILE/ENFILE the pending connection stays in the backlog and
/// the listener stays readable, so the event loop would retry at once, for
/// ever (NIO keeps the read pending after a failed accept, so a delayed read
/// alone does not stop it). Instead the listener's event loop frees the
/// spare, accepts one pending connection itself, sends it an UNAVAILABLE
/// error frame, closes it and takes the spare back: the backlog drains with
/// clear errors instead of a spinning core.
///
/// All of that happens in one step on the listener's event loop. An earlier
/// version let NIO accept on the freed spare and refused the connection from
/// its handler; the accept loop then took the descriptor the refused
/// connection gave back before the spare was reopened, the spare was lost and
/// the loop spun.
final class DescriptorReserve: Sendable {
    private let spare = Mutex<Int32>(-1)
    private let warnings = WarningEpisodes()
    /// The refusal sent to a connection accepted on the spare (none with TLS:
    /// there is no handshake to send it through).
    private let refusal: [UInt8]?

    /// - Parameter refusal: the frame a refused connection is sent (the
    ///   call layer writes it; nil with TLS).
    init(refusal: [UInt8]?) {
        self.refusal = refusal
        reacquire()
    }

    private func reacquire() {
        spare.withLock { fd in
            if fd < 0 { fd = open("/dev/null", O_RDONLY | O_CLOEXEC) }
        }
    }

    /// Whether the spare is open now (it is given back after each refusal).
    var holdsSpare: Bool { spare.withLock { $0 >= 0 } }

    /// One warning per episode rather than one per refused connection.
    func shouldWarn() -> Bool { warnings.begins() }

    static func isOutOfDescriptors(_ error: IOError) -> Bool {
        error.errnoCode == EMFILE || error.errnoCode == ENFILE
    }

    /// Refuses one pending connection of `listener` on the spare descriptor;
    /// false if there is no spare (it could not be reopened) or nothing was
    /// pending. Runs on the listener's event loop.
    func refusePending(listener: Int32) -> Bool {
        spare.withLock { fd in
            if fd < 0 { fd = open("/dev/null", O_RDONLY | O_CLOEXEC) }
            guard fd >= 0 else { return false }
            close(fd)
            let connection = accept(listener, nil, nil)
            if connection >= 0 {
                _ = fcntl(connection, F_SETFD, FD_CLOEXEC)
                _ = fcntl(connection, F_SETFL, fcntl(connection, F_GETFL) | O_NONBLOCK)
                // What the client already sent is read first: closing with
                // unread bytes would reset the connection before the client
                // reads the refusal.
                var scratch = [UInt8](repeating: 0, count: 4096)
                _ = scratch.withUnsafeMutableBytes { recv(connection, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) }
                if let refusal {
                    _ = refusal.withUnsafeBytes { send(connection, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT | MSG_NOSIGNAL)) }
                }
                shutdown(connection, Int32(SHUT_WR))
                close(connection)
            }
            fd = open("/dev/null", O_RDONLY | O_CLOEXEC)
            return connection >= 0
        }
    }
}

/// Episodes of a repeated event, for warning once per episode: one begins
/// when the event comes 10 s or more after the one before.
final class WarningEpisodes: Sendable {
    private let last = Mutex<ContinuousClock.Instant?>(nil)

    /// True when this occurrence begins an episode.
    func begins() -> Bool {
        last.withLock { last in
            let now = ContinuousClock.now
            if let last, now - last < .seconds(10) { return false }
            last = now
            return true
        }
    }
}
