public import Foundation
public import ThreadwireNIO
public import ThreadwireWire
#if canImport(Glibc)
import Glibc
#endif

/// A plain blocking TCP socket for clients that misbehave on purpose: they
/// pipeline without reading, trickle partial frames, or hold connections.
public final class RawSocket: @unchecked Sendable {
    public let fd: Int32
    private var inbound: [UInt8] = []

    /// - Parameter receiveBuffer: a small SO_RCVBUF, so a client that does
    ///   not read stops taking bytes early.
    public init(port: Int, receiveBuffer: Int? = nil) throws {
        fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw RawSocketError.system("socket", errno) }
        if var size = receiveBuffer.map(Int32.init) {
            setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, socklen_t(MemoryLayout<Int32>.size))
        }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let result = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard result == 0 else {
            let error = errno
            Glibc.close(fd)
            throw RawSocketError.system("connect", error)
        }
    }

    /// A socket already connected to a server (an in-process server's
    /// socket pair end, `InProcessServer.connectSocket`); closed with this.
    public init(connected: Int32) {
        fd = connected
    }

    public static func frame(id: UInt64, _ params: Wire.Request.Params) -> [UInt8] {
        Framing.frame(Wire.Envelope(kind: .request(Wire.Request(id: id, params: params))).serializedBytes())
    }

    public static let initialize = frame(id: 1, .initialize(Wire.InitializeParams(
        clientInfo: Wire.ClientInfo(name: "raw"), protocolVersion: 1)))

    /// Bytes sent but not yet acknowledged by the peer's kernel (SIOCOUTQ).
    public var unsentBytes: Int {
        var count: Int32 = 0
        return ioctl(fd, UInt(TIOCOUTQ), &count) == 0 ? Int(count) : -1
    }

    /// Waits until the peer's kernel took everything sent (at most `seconds`).
    public func waitUntilSent(seconds: Double) async {
        let deadline = ContinuousClock.now + .milliseconds(Int(seconds * 1000))
        while unsentBytes > 0, ContinuousClock.now < deadline { try? await Task.sleep(for: .milliseconds(10)) }
    }

    /// Sends all of `bytes` (blocking).
    public func send(_ bytes: [UInt8]) throws {
        var offset = 0
        while offset < bytes.count {
            let sent = bytes[offset...].withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            guard sent > 0 else { throw RawSocketError.system("send", errno) }
            offset += sent
        }
    }

    /// Sends `bytes` over and over until `maxBytes` went out, the peer took
    /// nothing for `stallSeconds` (it pushes back), or `seconds` passed;
    /// returns the bytes it took. Never reads.
    public func push(repeating bytes: [UInt8], seconds: Double, maxBytes: Int, stallSeconds: Double = 2) async -> Int {
        await offPool { self.pushBlocking(repeating: bytes, seconds: seconds, maxBytes: maxBytes, stallSeconds: stallSeconds) }
    }

    private func pushBlocking(repeating bytes: [UInt8], seconds: Double, maxBytes: Int, stallSeconds: Double) -> Int {
        let deadline = Date().addingTimeInterval(seconds)
        var lastProgress = Date()
        var total = 0
        var offset = 0
        while Date() < deadline, total < maxBytes, Date().timeIntervalSince(lastProgress) < stallSeconds {
            var poller = pollfd(fd: fd, events: Int16(POLLOUT), revents: 0)
            guard poll(&poller, 1, 50) >= 0 else { break }
            if poller.revents & Int16(POLLOUT) == 0 {
                if poller.revents & Int16(POLLERR | POLLHUP) != 0 { break }
                continue
            }
            let count = min(bytes.count - offset, maxBytes - total)
            let sent = bytes[offset..<(offset + count)].withUnsafeBytes {
                Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL | MSG_DONTWAIT))
            }
            if sent < 0 {
                if errno == EAGAIN || errno == EWOULDBLOCK { continue }
                break
            }
            if sent > 0 { lastProgress = Date() }
            total += sent
            offset = (offset + sent) % bytes.count
        }
        return total
    }

    /// Reads frames until the peer closes (true) or `seconds` pass (false).
    public func readUntilClosed(seconds: Double) async -> (envelopes: [Wire.Envelope], closed: Bool) {
        await offPool { self.readUntilClosedBlocking(seconds: seconds) }
    }

    private func readUntilClosedBlocking(seconds: Double) -> (envelopes: [Wire.Envelope], closed: Bool) {
        let deadline = Date().addingTimeInterval(seconds)
        var chunk = [UInt8](repeating: 0, count: 256 * 1024)
        var closed = false
        while Date() < deadline {
            var poller = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            guard poll(&poller, 1, 50) >= 0 else { break }
            if poller.revents == 0 { continue }
            let count = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if count <= 0 {
                closed = true
                break
            }
            inbound += chunk[..<count]
        }
        return (decodeFrames(), closed)
    }

    /// Reads until `count` frames arrived or `seconds` pass.
    public func readFrames(_ count: Int, seconds: Double) async -> [Wire.Envelope] {
        await offPool { self.readFramesBlocking(count, seconds: seconds) }
    }

    private func readFramesBlocking(_ count: Int, seconds: Double) -> [Wire.Envelope] {
        let deadline = Date().addingTimeInterval(seconds)
        var chunk = [UInt8](repeating: 0, count: 64 * 1024)
        var frames: [Wire.Envelope] = []
        while Date() < deadline, frames.count < count {
            frames += decodeFrames()
            if frames.count >= count { break }
            var poller = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            guard poll(&poller, 1, 50) >= 0 else { break }
            if poller.revents == 0 { continue }
            let received = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if received <= 0 { break }
            inbound += chunk[..<received]
        }
        return frames + decodeFrames()
    }

    /// Reads until the response to request `id` arrives (frames before it
    /// are dropped) or `seconds` pass (nil).
    public func response(to id: UInt64, seconds: Double) async -> Wire.Response? {
        let deadline = Date().addingTimeInterval(seconds)
        while Date() < deadline {
            let frames = await readFrames(1, seconds: deadline.timeIntervalSinceNow)
            if let answer = frames.lazy.compactMap(\.response).first(where: { $0.id == id }) { return answer }
            if frames.isEmpty { return nil }
        }
        return nil
    }

    private func decodeFrames() -> [Wire.Envelope] {
        var envelopes: [Wire.Envelope] = []
        var offset = 0
        while inbound.count - offset >= Framing.headerSize {
            let length = inbound[(offset + 1)...(offset + 4)].reduce(0) { $0 << 8 | Int($1) }
            guard inbound.count - offset >= Framing.headerSize + length else { break }
            let payload = Array(inbound[(offset + Framing.headerSize)..<(offset + Framing.headerSize + length)])
            if let envelope = try? Wire.Envelope(serializedBytes: payload) { envelopes.append(envelope) }
            offset += Framing.headerSize + length
        }
        inbound.removeFirst(offset)
        return envelopes
    }

    private let closedFlag = NSLock()
    private var isClosed = false

    /// Idempotent: a second close must not close a descriptor number that
    /// something else (e.g. NIO in this process) has been given since.
    public func close() {
        closedFlag.lock()
        defer { closedFlag.unlock() }
        guard !isClosed else { return }
        isClosed = true
        Glibc.close(fd)
    }
}

public enum RawSocketError: Error {
    case system(String, Int32)
}

extension Wire.Envelope {
    public var response: Wire.Response? {
        if case let .response(response)? = kind { return response }
        return nil
    }

    public var notification: Wire.Notification? {
        if case let .notification(notification)? = kind { return notification }
        return nil
    }
}

/// Runs blocking socket work on a thread of its own: blocking a thread of
/// the cooperative pool (two on a 2-core machine) would stall other tests.
public func offPool<T: Sendable>(_ body: @escaping @Sendable () -> T) async -> T {
    await withCheckedContinuation { continuation in
        Thread.detachNewThread { continuation.resume(returning: body()) }
    }
}

/// One plain HTTP/1.1 GET to the admin endpoint: status code and body.
public func httpGet(port: Int, path: String, headers: [String: String] = [:]) async throws -> (status: Int, body: String) {
    let result = await offPool { Result { try httpGetBlocking(port: port, path: path, headers: headers) } }
    return try result.get()
}

public func httpGetBlocking(port: Int, path: String, headers: [String: String] = [:]) throws -> (status: Int, body: String) {
    let socket = try RawSocket(port: port)
    defer { socket.close() }
    let extra = headers.map { "\($0.key): \($0.value)\r\n" }.joined()
    try socket.send(Array("GET \(path) HTTP/1.1\r\nHost: 127.0.0.1\r\n\(extra)Connection: close\r\n\r\n".utf8))
    var bytes: [UInt8] = []
    var chunk = [UInt8](repeating: 0, count: 64 * 1024)
    let deadline = Date().addingTimeInterval(10)
    while Date() < deadline {
        let count = chunk.withUnsafeMutableBytes { recv(socket.fd, $0.baseAddress, $0.count, 0) }
        if count <= 0 { break }
        bytes += chunk[..<count]
    }
    let text = String(decoding: bytes, as: UTF8.self)
    guard let headerEnd = text.range(of: "\r\n\r\n") else { throw RawSocketError.system("http", 0) }
    let statusLine = text[..<headerEnd.lowerBound].split(separator: "\r\n").first ?? ""
    let status = Int(statusLine.split(separator: " ").dropFirst().first ?? "") ?? 0
    var body = String(text[headerEnd.upperBound...])
    if text[..<headerEnd.lowerBound].lowercased().contains("transfer-encoding: chunked") {
        body = dechunk(body)
    }
    return (status, body)
}

private func dechunk(_ text: String) -> String {
    var rest = Substring(text)
    var out = ""
    while let lineEnd = rest.range(of: "\r\n") {
        guard let size = Int(rest[..<lineEnd.lowerBound], radix: 16), size > 0 else { break }
        let start = lineEnd.upperBound
        let utf8 = rest.utf8
        let end = utf8.index(start, offsetBy: size)
        out += String(rest[start..<end])
        rest = rest[end...].dropFirst(2)
    }
    return out
}
