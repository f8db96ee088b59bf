/// `HOST:PORT`, as flags, configs and advertised addresses write it (the
/// port after the last colon, so `[::1]:7420` keeps its brackets in the host).
/// The one parser of it, for the server, the client and the relay.
public struct HostPort: Sendable, Equatable, CustomStringConvertible {
    public var host: String
    public var port: Int

    public init(host: String, port: Int) {
        self.host = host
        self.port = port
    }

    /// Nil unless `text` is HOST:PORT with a port from 0 to 65535.
    public init?(_ text: String) {
        guard let colon = text.lastIndex(of: ":"), let port = Int(text[text.index(after: colon)...]), (0...65535).contains(port) else {
            return nil
        }
        self.init(host: String(text[..<colon]), port: port)
    }

    public var description: String { "\(host):\(port)" }
}
