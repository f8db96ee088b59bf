import ArgumentParser
import Foundation
import ThreadwireClient
import ThreadwireWire

/// A capture file (docs/protocol.md "Capture files") split into sessions.
struct Capture {
    struct Session: Sendable {
        var requests: [Wire.Request] = []
        /// Original request id -> the id that request created.
        var created: [UInt64: String] = [:]
    }

    var sessions: [UInt64: Session] = [:]

    init(path: String) throws {
        guard let data = FileManager.default.contents(atPath: path) else { throw ValidationError("cannot read \(path)") }
        let bytes = [UInt8](data)
        let magic = Array("TWCAP1\n".utf8)
        guard bytes.starts(with: magic) else { throw ValidationError("\(path) is not a threadwire capture (no TWCAP1 header)") }
        var offset = magic.count
        func u64() throws -> UInt64 {
            guard offset + 8 <= bytes.count else { throw ValidationError("capture truncated at byte \(offset)") }
            defer { offset += 8 }
            return bytes[offset..<offset + 8].reduce(0) { $0 << 8 | UInt64($1) }
        }
        while offset < bytes.count {
            let kind = bytes[offset]
            offset += 1
            _ = try u64()  // timestamp
            let connection = try u64()
            switch kind {
            case 1:
                guard offset + 5 <= bytes.count else { throw ValidationError("capture truncated at byte \(offset)") }
                let length = Int(bytes[offset + 1..<offset + 5].reduce(0) { $0 << 8 | UInt32($1) })
                guard offset + 5 + length <= bytes.count else { throw ValidationError("capture truncated at byte \(offset)") }
                let payload = Array(bytes[offset + 5..<offset + 5 + length])
                offset += 5 + length
                // Frames that do not decode are replayed by no one: a capture of bad input is not a workload.
                if case let .request(request)? = try? Wire.Envelope(serializedBytes: payload).kind {
                    sessions[connection, default: Session()].requests.append(request)
                }
            case 2:
                let requestID = try u64()
                guard offset + 2 <= bytes.count else { throw ValidationError("capture truncated at byte \(offset)") }
                let length = Int(bytes[offset]) << 8 | Int(bytes[offset + 1])
                offset += 2
                guard offset + length <= bytes.count else { throw ValidationError("capture truncated at byte \(offset)") }
                sessions[connection, default: Session()].created[requestID] = String(decoding: bytes[offset..<offset + length], as: UTF8.self)
                offset += length
            case 3:
                // A frame withheld from the capture (its length only): nothing to replay.
                guard offset + 4 <= bytes.count else { throw ValidationError("capture truncated at byte \(offset)") }
                offset += 4
            default:
                throw ValidationError("unknown capture record kind \(kind) at byte \(offset - 1)")
            }
        }
    }
}

/// Replays one recorded session on one connection, in order, mapping ids the
/// session created to the ids the replay creates.
final class ReplayScript: LoadScript, @unchecked Sendable {
    private let session: Capture.Session
    private let loop: Bool
    private var position = 0
    private var idMap: [String: String] = [:]
    private var notifications: AsyncStream<Wire.Notification>.Iterator?

    init(session: Capture.Session, loop: Bool) {
        self.session = session
        self.loop = loop
    }

    func step(_ client: ThreadwireClient) async throws -> UInt32? {
        if notifications == nil { notifications = client.notifications.makeAsyncIterator() }
        if position == session.requests.count {
            guard loop, !session.requests.isEmpty else { return nil }
            position = 0
            idMap = [:]
        }
        let original = session.requests[position]
        position += 1
        guard var params = original.params else { return try await step(client) }
        if case .initialize = params { return try await step(client) }  // the replay connection initialized itself
        params = try remap(params)
        let response = try await client.call(params, timeoutMs: original.timeoutMs)
        let code = response.code ?? 0
        guard code == 0 else { return code }
        if let originalID = original.id, let createdID = session.created[originalID] {
            switch response.result {
            case let .threadStart(r)?, let .threadFork(r)?, let .agentSpawn(r)?: idMap[createdID] = r.thread?.id
            case let .turnStart(r)?: idMap[createdID] = r.turn?.id
            default: break
            }
        }
        // The recorded client waited for its turn to end before going on; so does the replay.
        if case let .turnStart(r)? = response.result, let turn = r.turn?.id {
            while let notification = await notifications?.next() {
                if case let .turnCompleted(done)? = notification.payload, done.turn?.id == turn { break }
            }
        }
        return code
    }

    private func remap(_ params: Wire.Request.Params) throws -> Wire.Request.Params {
        func walk(_ value: JSONValue) -> JSONValue {
            switch value {
            case let .string(s): return .string(idMap[s] ?? s)
            case let .array(items): return .array(items.map(walk))
            case let .object(fields): return .object(fields.map { ($0.0, walk($0.1)) })
            default: return value
            }
        }
        let json = walk(Wire.Request(params: params).jsonValue())
        return try Wire.Request(json: json, path: "").params ?? params
    }
}

struct Replay: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Replay a capture (threadwire-server --record) over N connections and report latency.")

    @OptionGroup var server: ServerOptions
    @Argument(help: "Capture file.") var file: String
    @Option(help: "Connections; connection i replays recorded session i mod sessions.") var connections = 1
    @Option(help: "Total requests per second (open loop); default: as fast as possible.") var rate: Double?
    @Flag(help: "As fast as possible (the default).") var max = false
    @Option(help: "Seconds to run; sessions loop until then. Default: each session once.") var duration: Double?
    @OptionGroup var output: ReportOutputOptions
    var json: Bool { output.json }

    func run() async throws {
        let capture = try Capture(path: file)
        let sessions = capture.sessions.keys.sorted().compactMap { capture.sessions[$0] }.filter { !$0.requests.isEmpty }
        guard !sessions.isEmpty else { throw ValidationError("\(file) holds no requests") }
        let loop = duration != nil
        let report = try await LoadRun.run(
            server: server, options: LoadOptions(connections: connections, rate: max ? nil : rate, duration: duration),
            progress: !json, makeScript: { ReplayScript(session: sessions[$0 % sessions.count], loop: loop) })
        print(json ? report.json.render(pretty: true) : report.text)
        if report.errors > 0 { throw ExitCode(1) }
    }
}
