#if canImport(Glibc)
import Glibc
#endif
import NIOCore

/// The listening socket, made here rather than by NIO's bind so that the
/// server knows its descriptor (DescriptorReserve accepts on it directly).
enum ListeningSocket {
    static func open(host: String, port: Int, backlog: Int32) throws -> Int32 {
        let address = try SocketAddress.makeAddressResolvingHost(host, port: port)
        let fd = socket(address.protocolFamily, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw ListenError(host: host, port: port, errno: errno) }
        var on: Int32 = 1
        guard setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, socklen_t(MemoryLayout<Int32>.size)) == 0,
              address.withSockAddr({ bind(fd, $0, socklen_t($1)) }) == 0,
              listen(fd, backlog) == 0 else {
            let failure = ListenError(host: host, port: port, errno: errno)
            close(fd)
            throw failure
        }
        return fd
    }

    struct ListenError: Error, CustomStringConvertible {
        let host: String
        let port: Int
        let errno: Int32
        var description: String { "cannot listen on \(host):\(port): \(String(cString: strerror(errno)))" }
    }

    /// NIO listens again with its own default backlog when it adopts the
    /// socket; Linux lets a second listen set it back.
    static func setBacklog(_ fd: Int32, _ backlog: Int32) {
        _ = listen(fd, backlog)
    }
}
