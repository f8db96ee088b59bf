import ArgumentParser
import ThreadwireClient
import ThreadwireNIO
import ThreadwireWire

/// The cross-language conformance scenario (integration/conformance/README.md): the
/// same session every client runs, printing the same transcript.
struct Conformance: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Run the cross-language conformance scenario and print its transcript.",
        discussion: "The Python, C, Go and TypeScript clients run the same scenario; make test compares the transcripts line by line.")

    @OptionGroup var options: ServerOptions

    func run() async throws {
        guard let address = HostPort(options.server) else { throw ValidationError("--server must be HOST:PORT, got '\(options.server)'") }
        let client = try await ThreadwireClient.connect(host: address.host, port: address.port, tls: options.clientTLS)
        defer { Task { await client.close() } }
        // Notifications are collected from the first frame on.
        let notes = Task {
            var methods: [String] = []
            var last: Wire.Turn?
            for await note in client.notifications {
                guard let payload = note.payload else { continue }
                methods.append(payload.methodName)
                if case let .turnCompleted(done) = payload { last = done.turn; break }
            }
            return (methods, last)
        }

        let info = try await client.initialize(name: "conformance-swift", optOut: ["item/agent_message/delta", "thread/token_usage/updated"],
                                               authToken: options.authToken)
        print("initialize: protocol_version=\(info.protocolVersion ?? 0) server=\(info.serverInfo?.name ?? "")")

        guard case let .threadStart(started) = try await client.result(.threadStart(Wire.ThreadStartParams(multiAgentMode: .proactive))),
              let threadID = started.thread?.id else { throw ValidationError("thread/start returned no thread") }
        print("thread/start: selected_mode=\(started.multiAgentMode?.protoValueName ?? "none")")

        guard case let .turnStart(turn) = try await client.result(.turnStart(Wire.TurnStartParams(threadId: threadID, input: [Wire.UserInput(content: .text("conformance"))]))) else {
            throw ValidationError("turn/start returned no turn")
        }
        print("turn/start: status=\(turn.turn?.status?.protoValueName ?? "none")")
        let (methods, completed) = await notes.value
        print("notifications: \(methods.joined(separator: " "))")
        print("turn/completed: status=\(completed?.status?.protoValueName ?? "none") items=\((completed?.items ?? []).map { $0.type?.protoValueName ?? "none" }.joined(separator: ","))")

        var clear = Wire.ThreadSettingsUpdateParams(threadId: threadID)
        clear.multiAgentModeUpdate = .clearMultiAgentMode(true)
        guard case let .threadSettingsUpdate(updated) = try await client.result(.threadSettingsUpdate(clear)) else {
            throw ValidationError("thread/settings/update returned no settings")
        }
        print("thread/settings/update: changed=\(updated.changed ?? false) selected_mode=\(updated.settings?.multiAgentMode?.protoValueName ?? "none")")

        // 1,000 requests written before any answer is read, then one whose
        // 1 ms deadline cannot be met: its answer queues behind the 1,000.
        var requests: [(params: Wire.Request.Params, timeoutMs: UInt32?)] = (0..<1000).map { index in
            index % 2 == 0 ? (.threadRead(Wire.ThreadReadParams(threadId: threadID)), nil) : (.healthCheck(Wire.HealthCheckParams()), nil)
        }
        requests.append((.threadRead(Wire.ThreadReadParams(threadId: threadID)), 1))
        let responses = try await client.pipeline(requests)
        let answered = responses.prefix(1000)
        let matched = answered.enumerated().allSatisfy { index, response in
            switch response.result {
            case let .threadRead(read)?: return index % 2 == 0 && read.thread?.id == threadID
            case .healthCheck?: return index % 2 == 1
            default: return false
            }
        }
        let ids = answered.compactMap(\.id)
        let inOrder = ids.count == 1000 && zip(ids, ids.dropFirst()).allSatisfy { $0 < $1 }
        print("pipelined: sent=1000 answered=\(answered.count) ids=\(inOrder && matched ? "matched" : "mismatched") codes=\(answered.allSatisfy { ($0.code ?? 0) == 0 } ? "all_ok" : "errors")")
        print("deadline: code=\(responses.last?.code ?? 0)")

        let missing = try await client.call(.threadRead(Wire.ThreadReadParams(threadId: "no-such-thread")))
        print("thread/read no-such-thread: code=\(missing.code ?? 0)")
    }
}
