import Foundation
import Logging
import ServiceLifecycle
#if canImport(Glibc)
import Glibc
#endif

/// Readiness for systemd's Type=notify (sd_notify(3)): READY=1 once the
/// server serves, STOPPING=1 when the drain begins. Off unless systemd set
/// NOTIFY_SOCKET. Last in the service group, so it hears the shutdown first.
struct SystemdNotifier: Service {
    let socketPath: String
    let waitUntilServing: @Sendable () async -> Void
    let describe: String
    let logger: Logger

    init?(environment: [String: String], describe: String, logger: Logger, waitUntilServing: @escaping @Sendable () async -> Void) {
        guard let path = environment["NOTIFY_SOCKET"], !path.isEmpty else { return nil }
        socketPath = path
        self.waitUntilServing = waitUntilServing
        self.describe = describe
        self.logger = logger
    }

    func run() async throws {
        await cancelWhenGracefulShutdown { await waitUntilServing() }
        guard !Task.isCancelled, !Task.isShuttingDownGracefully else { return }
        send("READY=1\nSTATUS=serving \(describe)\nMAINPID=\(getpid())")
        try? await gracefulShutdown()
        send("STOPPING=1\nSTATUS=draining")
    }

    /// One datagram to the socket; "@" starts an abstract socket name.
    func send(_ message: String) {
        let fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { return logger.warning("sd_notify: no socket", metadata: ["tw.errno": "\(errno)"]) }
        defer { close(fd) }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        var path = Array(socketPath.utf8)
        if path.first == UInt8(ascii: "@") { path[0] = 0 }
        let capacity = MemoryLayout.size(ofValue: address.sun_path)
        guard path.count < capacity else { return logger.warning("sd_notify: NOTIFY_SOCKET is too long") }
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            for (index, byte) in path.enumerated() { raw[index] = byte }
        }
        let length = socklen_t(MemoryLayout<sa_family_t>.size + path.count + (path.first == 0 ? 0 : 1))
        let sent = message.withCString { text in
            withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { sendto(fd, text, strlen(text), 0, $0, length) }
            }
        }
        if sent < 0 { logger.warning("sd_notify: not sent", metadata: ["tw.errno": "\(errno)", "tw.socket": "\(socketPath)"]) }
    }
}
