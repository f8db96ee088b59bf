/// An incremental parser of a `text/event-stream` body (server-sent events,
/// as the WHATWG HTML standard defines them): feed it bytes as they arrive,
/// in any split, and it returns each event once its blank line arrives.
/// Lines end with LF, CR or CRLF (a CRLF split across two chunks counts
/// once); comment lines (":") are skipped; `data` lines are joined with LF.
public struct ServerSentEventParser: Sendable {
    public struct Event: Sendable, Equatable {
        public var type: String?
        public var data: String
        public var id: String?
        public init(type: String? = nil, data: String, id: String? = nil) {
            self.type = type
            self.data = data
            self.id = id
        }
    }

    /// A line longer than this is an error, so a provider that never sends a
    /// line break cannot make the buffer grow without bound.
    public let maxLineBytes: Int
    private var line: [UInt8] = []
    private var afterCR = false
    private var data: [String] = []
    private var type: String?
    private var id: String?

    public init(maxLineBytes: Int = 4 << 20) { self.maxLineBytes = maxLineBytes }

    public struct LineTooLong: Error, CustomStringConvertible {
        public let limit: Int
        public var description: String { "a server-sent event line is longer than \(limit) bytes" }
    }

    public mutating func feed(_ bytes: some Sequence<UInt8>) throws -> [Event] {
        var events: [Event] = []
        for byte in bytes {
            if afterCR {
                afterCR = false
                if byte == UInt8(ascii: "\n") { continue }
            }
            switch byte {
            case UInt8(ascii: "\n"):
                if let event = endLine() { events.append(event) }
            case UInt8(ascii: "\r"):
                afterCR = true
                if let event = endLine() { events.append(event) }
            default:
                guard line.count < maxLineBytes else { throw LineTooLong(limit: maxLineBytes) }
                line.append(byte)
            }
        }
        return events
    }

    private mutating func endLine() -> Event? {
        defer { line.removeAll(keepingCapacity: true) }
        if line.isEmpty {
            // Dispatch: an event without data lines is dropped, its type too.
            defer {
                data.removeAll()
                type = nil
            }
            guard !data.isEmpty else { return nil }
            return Event(type: type, data: data.joined(separator: "\n"), id: id)
        }
        if line.first == UInt8(ascii: ":") { return nil }
        let colon = line.firstIndex(of: UInt8(ascii: ":"))
        let field = String(decoding: line[..<(colon ?? line.endIndex)], as: UTF8.self)
        var valueStart = colon.map { $0 + 1 } ?? line.endIndex
        if valueStart < line.endIndex, line[valueStart] == UInt8(ascii: " ") { valueStart += 1 }
        let value = String(decoding: line[valueStart...], as: UTF8.self)
        switch field {
        case "data": data.append(value)
        case "event": type = value
        case "id": if !value.contains("\0") { id = value }
        default: break  // "retry" and unknown fields
        }
        return nil
    }
}
