// Over 400 lines: 22 small subcommands and the options they share; each is a
// screen long, and the list of them is the CLI's table of contents.
import ArgumentParser
import Foundation
import ThreadwireClient
import ThreadwireNIO
import ThreadwireWire

@main
struct CLI: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "threadwire",
        abstract: "Drive a threadwire server by hand.",
        discussion: """
            Exit codes: 0 success; 2 a usage error (bad arguments or options); 4 `health` answered NOT_SERVING;
            64 + the status code when the server answers a call with a non-OK status (NOT_FOUND 69,
            INVALID_ARGUMENT 67, UNAUTHENTICATED 80, ...), as grpcurl does, UNAVAILABLE (78) also when the
            server cannot be reached; 1 anything else.
            """,
        version: ThreadwireRelease.version,
        subcommands: [Call.self, ListMethods.self, Describe.self, Health.self, ThreadCommand.self, TurnCommand.self, ModeCommand.self,
                      AgentCommand.self, Watch.self, Import.self, Replay.self, Bench.self, Conformance.self])

    /// ArgumentParser's own run, with the exit codes above: usage errors
    /// exit 2 (not 64, which here means a status), and a server out of
    /// reach is UNAVAILABLE's 78 with one line saying so.
    static func main() async {
        var command: any ParsableCommand
        do {
            command = try parseAsRoot()
        } catch {
            if exitCode(for: error) == .validationFailure {
                FileHandle.standardError.write(Data((fullMessage(for: error) + "\n").utf8))
                Foundation.exit(2)
            }
            exit(withError: error)
        }
        do {
            if var asyncCommand = command as? any AsyncParsableCommand {
                try await asyncCommand.run()
            } else {
                try command.run()
            }
        } catch {
            let code = exitCode(for: error)
            if code == .validationFailure {
                // Found while running (a request body, a file): the message is the help, not the usage screen.
                FileHandle.standardError.write(Data(("threadwire: " + message(for: error) + "\n").utf8))
                Foundation.exit(2)
            }
            if error is ExitCode || error is CleanExit || code == .success { exit(withError: error) }
            if let unreachable = StatusExit.unreachable(error) {
                FileHandle.standardError.write(Data((unreachable + "\n").utf8))
                Foundation.exit(StatusExit.code(for: 14))
            }
            exit(withError: error)
        }
    }
}

/// How a call's status becomes the process's exit code.
enum StatusExit {
    static let names = ["OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
                        "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
                        "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"]

    static func name(_ code: UInt32) -> String { Int(code) < names.count ? names[Int(code)] : "CODE_\(code)" }

    /// 64 + the code, as grpcurl exits.
    static func code(for status: UInt32) -> Int32 { 64 + Int32(clamping: status) }

    /// One line for an error that means the server could not be reached
    /// (nil for any other error).
    static func unreachable(_ error: any Error, arguments: [String] = CommandLine.arguments,
                            environment: [String: String] = ProcessInfo.processInfo.environment) -> String? {
        let text = "\(error)"
        // What happened, in words, rather than SwiftNIO's description of its attempt.
        let reasons = [("Connection refused", "connection refused"), ("connection refused", "connection refused"),
                       ("connectTimeout", "timed out connecting"), ("No route to host", "no route to host"),
                       ("unreachable", "network unreachable"), ("NIOConnectionError", "the connection failed")]
        guard let reason = reasons.first(where: { text.contains($0.0) })?.1 else { return nil }
        var server = environment["THREADWIRE_SERVER"] ?? "127.0.0.1:7420"
        for (index, argument) in arguments.enumerated() {
            if argument == "--server", index + 1 < arguments.count { server = arguments[index + 1] }
            if argument.hasPrefix("--server=") { server = String(argument.dropFirst("--server=".count)) }
        }
        return "threadwire: UNAVAILABLE: cannot reach the server at \(server): \(reason)"
    }
}

struct ServerOptions: ParsableArguments {
    @Option(name: .long, help: "Server HOST:PORT.")
    var server = ProcessInfo.processInfo.environment["THREADWIRE_SERVER"] ?? "127.0.0.1:7420"

    @Option(name: .long, help: "Bearer token for a server that authenticates (default: $THREADWIRE_AUTH_TOKEN). Prefer the variable: arguments show in ps.")
    var authToken = ProcessInfo.processInfo.environment["THREADWIRE_AUTH_TOKEN"]

    @Flag(name: .long, help: "Speak TLS, verifying the server against the system's CA certificates (implied by --tls-ca).")
    var tls = false

    @Option(name: .long, help: "Speak TLS, verifying the server against this PEM CA certificate.")
    var tlsCa: String?

    @Option(name: .long, help: "Mutual TLS: PEM client certificate (with --tls-key).")
    var tlsCert: String?

    @Option(name: .long, help: "Mutual TLS: PEM private key of --tls-cert.")
    var tlsKey: String?

    var clientTLS: ClientTLS? {
        guard tls || tlsCa != nil || tlsCert != nil else { return nil }
        return ClientTLS(caFile: tlsCa, certificateFile: tlsCert, keyFile: tlsKey)
    }

    @Option(name: .long, help: "Attempts per call: UNAVAILABLE answers and lost connections are retried with backoff, and a change carries an idempotency key so a retry applies it once (1: no retry; default 5, for `health` 1).")
    var attempts: Int?

    /// The calls of one command: reconnecting and retried (see `--attempts`).
    func session(initialize: Bool = true, defaultAttempts: Int = 5) throws -> ReconnectingClient {
        ReconnectingClient(policy: try retryPolicy(defaultAttempts: defaultAttempts)) { try await connect(initialize: initialize) }
    }

    /// Checks the options a retry would not mend, then the policy.
    func retryPolicy(defaultAttempts: Int = 5) throws -> RetryPolicy {
        guard HostPort(server) != nil else { throw ValidationError("--server must be HOST:PORT, got '\(server)'") }
        if (tlsCert == nil) != (tlsKey == nil) { throw ValidationError("--tls-cert and --tls-key go together") }
        let attempts = self.attempts ?? defaultAttempts
        guard attempts >= 1 else { throw ValidationError("--attempts must be at least 1, got \(attempts)") }
        var policy = RetryPolicy()
        policy.maxAttempts = attempts
        return policy
    }

    func connect(initialize: Bool = true) async throws -> ThreadwireClient {
        guard let address = HostPort(server) else { throw ValidationError("--server must be HOST:PORT, got '\(server)'") }
        if (tlsCert == nil) != (tlsKey == nil) { throw ValidationError("--tls-cert and --tls-key go together") }
        let client = try await ThreadwireClient.connect(host: address.host, port: address.port, tls: clientTLS)
        if initialize { try await client.initialize(name: "threadwire-cli", authToken: authToken) }
        return client
    }
}

func resultJSON(_ result: Wire.Response.Result) -> JSONValue {
    Wire.Response(result: result).jsonValue()[result.fieldName] ?? .object([])
}

struct Call: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Call any method with JSON params (field names as in the .proto), print the JSON result.",
        discussion: """
            Examples: threadwire call thread/start -d '{"multi_agent_mode": "PROACTIVE"}'
                      threadwire call thread/read -d @params.json -o yaml
                      echo '{"thread_id": "…"}' | threadwire call thread/read -d @-
            """)

    @OptionGroup var options: ServerOptions
        @OptionGroup var out: OutputOptions
    @Argument(help: "Method name, e.g. thread/start, health/check, initialize.")
    var method: String
    @Option(name: [.customShort("d"), .customLong("data"), .customLong("json")],
            help: "The params as a JSON object; @FILE reads them from a file, @- from standard input (--json: the older name).")
    var data = "{}"

    /// The params' text: inline, @FILE or @- as curl and grpcurl take them.
    var json: String {
        get throws {
            guard data.hasPrefix("@") else { return data }
            let source = String(data.dropFirst())
            let bytes: Data? = source == "-" ? FileHandle.standardInput.readDataToEndOfFile() : FileManager.default.contents(atPath: source)
            guard let bytes else { throw ValidationError("-d @\(source): cannot read the file") }
            return String(decoding: bytes, as: UTF8.self)
        }
    }
    @Flag(help: "Build the request from the server's schema (reflection/descriptors) rather than this CLI's compiled contract; the default for a method this CLI does not know.")
    var reflect = false

    func run() async throws {
        let field = method.replacingOccurrences(of: "/", with: "_")
        let json = try self.json
        let parsed: Wire.Request.Params?
        do {
            parsed = reflect ? nil : try Wire.Request.Params.fromJSON(fieldName: field, try JSONValue.parse(json), path: "")
        } catch let error as WireError {
            // The body is the caller's to fix: a usage error (exit 2), saying where.
            throw ValidationError("-d: \(error)")
        }
        guard var params = parsed else {
            try await callThroughReflection()
            return
        }
        // A hand-written initialize gets the --auth-token unless it names one.
        if case var .initialize(initialize) = params, initialize.authToken == nil, let token = options.authToken {
            initialize.authToken = token
            params = .initialize(initialize)
        }
        // initialize and health/check work on a fresh connection; others initialize first.
        let client = try options.session(initialize: field != "initialize" && field != "health_check")
        defer { Task { await client.close() } }
        try output(try await client.call(params), as: out.format)
    }
}

extension Call {
    /// The request built from the server's own schema: any method it
    /// serves, even one this CLI was not compiled with.
    func callThroughReflection() async throws {
        let params = try JSONValue.parse(try json)
        let client = try await options.connect(initialize: !["initialize", "health/check", "reflection/descriptors"].contains(method))
        defer { Task { await client.close() } }
        guard case let .reflectionDescriptors(reflected) = try await client.result(.reflectionDescriptors(.init())) else {
            throw ValidationError("the server did not answer reflection/descriptors with its schema")
        }
        let schema = try DynamicSchema(fileDescriptorSet: reflected.fileDescriptorSet ?? [])
        let envelopeType = reflected.envelopeType ?? "threadwire.v1.Envelope"
        guard let spec = reflected.methods.first(where: { $0.name == method }), let field = spec.field, let paramsType = spec.paramsType,
              let number = schema.fieldNumber(field, in: envelopeType.replacingOccurrences(of: "Envelope", with: "Request")) else {
            throw ValidationError("the server has no method '\(method)'; it has: \(reflected.methods.compactMap(\.name).joined(separator: ", "))")
        }
        let body = try schema.encode(params, as: paramsType)
        let answer = try await client.callRaw { id in DynamicSchema.requestEnvelope(id: id, timeoutMs: nil, field: number, params: body) }
        guard case let .object(envelope) = try schema.decode(answer, as: envelopeType),
              case let .object(response)? = envelope.first(where: { $0.0 == "response" })?.1 else {
            throw ValidationError("the server's answer is not a response")
        }
        let member = { (name: String) in response.first { $0.0 == name }?.1 }
        let code: UInt64 = if case let .uint(code)? = member("code") { code } else { 0 }
        guard code == 0 else {
            let message: String = if case let .string(text)? = member("message") { text } else { "" }
            let error = JSONValue.object([("code", .uint(code)), ("message", .string(message))])
            FileHandle.standardError.write(Data((error.render(pretty: true) + "\n").utf8))
            throw ExitCode(1)
        }
        print(Rendered.text(member(field) ?? .object([]), as: out.format), terminator: "")
    }
}

struct Health: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Check the server's health (no initialize needed): exit 0 when SERVING, 4 when NOT_SERVING, 78 when unreachable.",
        discussion: "One attempt unless --attempts says more, so it can be a probe (as grpc_health_probe).")
    @OptionGroup var options: ServerOptions
        @OptionGroup var out: OutputOptions
    func run() async throws {
        let client = try options.session(initialize: false, defaultAttempts: 1)
        let response = try await client.call(.healthCheck(Wire.HealthCheckParams()))
        await client.close()
        try output(response, as: out.format)
        if case let .healthCheck(health)? = response.result, health.status != .serving { throw ExitCode(4) }
    }
}

func parseMode(_ text: String) throws -> Wire.MultiAgentMode {
    guard let mode = try? Wire.MultiAgentMode(json: .string(text), path: "mode"), mode != .unspecified else {
        throw ValidationError("mode must be explicitRequestOnly or proactive, got '\(text)'")
    }
    return mode
}

struct ThreadCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "thread", abstract: "Start, resume, fork, read, list, name, compact, roll back and revert threads.",
        subcommands: [Start.self, Resume.self, Fork.self, Read.self, List.self, Items.self, Loaded.self, Name.self, Compact.self,
                      Rollback.self, Revert.self])

    struct Start: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Start a thread: its runtime is resolved by its first turn, its mode is what --mode selects.")
        @OptionGroup var options: ServerOptions
        @OptionGroup var out: OutputOptions
        @Option(help: "The model (default: the server's default_model).") var model: String?
        @Option(help: "Selected multi-agent mode: explicitRequestOnly or proactive.") var mode: String?
        @Option(name: .customLong("config"), help: "KEY=VALUE override, e.g. features.multi_agent_v2=true.") var config: [String] = []
        @Flag(help: "Start a review thread (pinned disabled).") var review = false
        @Option(help: "Reasoning effort (none, minimal, low, medium, high, xhigh, or what the model's catalog entry lists).") var effort: String?
        @Option(help: "Reasoning summary: auto, concise, detailed or none.") var summary: String?
        @Flag(help: "Pause every turn after each batch of tool calls until `turn continue`.") var pauseAfterTools = false
        func run() async throws {
            var params = Wire.ThreadStartParams(model: model)
            if pauseAfterTools { params.pauseAfterTools = true }
            params.reasoningEffort = effort
            params.reasoningSummary = summary
            params.multiAgentMode = try mode.map(parseMode)
            params.config = try config.map { entry in
                guard let eq = entry.firstIndex(of: "=") else { throw ValidationError("--config takes KEY=VALUE, got '\(entry)'") }
                return Wire.KeyValue(key: String(entry[..<eq]), value: String(entry[entry.index(after: eq)...]))
            }
            if review { params.source = .review }
            let client = try options.session()
            try output(try await client.call(.threadStart(params)), as: out.format)
            await client.close()
        }
    }

    struct Resume: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Resume a thread: load it (pinning a legacy thread's runtime) and subscribe this connection.")
        @OptionGroup var options: ServerOptions
        @OptionGroup var out: OutputOptions
        @Argument(help: "The thread's id (thread list -o table shows them).") var threadID: String
        func run() async throws {
            let client = try options.session()
            try output(try await client.call(.threadResume(Wire.ThreadResumeParams(threadId: threadID, excludeTurns: true))), as: out.format)
            await client.close()
        }
    }

    struct Fork: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Fork a thread: whole, or up to a turn (--at TURN_ID: after it; --before TURN_ID).")
        @OptionGroup var options: ServerOptions
        @OptionGroup var out: OutputOptions
        @Argument(help: "The thread's id (thread list -o table shows them).") var threadID: String
        @Option(help: "Fork after this turn.") var at: String?
        @Option(help: "Fork before this turn.") var before: String?
        func run() async throws {
            guard at == nil || before == nil else { throw ValidationError("give --at or --before, not both") }
            var params = Wire.ThreadForkParams(threadId: threadID, excludeTurns: true)
            if let at { params.position = .atTurnId(at) }
            if let before { params.position = .beforeTurnId(before) }
            let client = try options.session()
            try output(try await client.call(.threadFork(params)), as: out.format)
            await client.close()
        }
    }

    struct Revert: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Take turns out of the model's context from a boundary: --before TURN_ID (it and later ones) or --after TURN_ID.")
        @OptionGroup var options: ServerOptions
        @OptionGroup var out: OutputOptions
        @Argument(help: "The thread's id (thread list -o table shows them).") var threadID: String
        @Option(help: "Revert this turn and every later one.") var before: String?
        @Option(help: "Revert every turn after this one.") var after: String?
        func run() async throws {
            var params = Wire.ThreadRevertParams(threadId: threadID)
            switch (before, after) {
            case let (turn?, nil): params.boundary = .beforeTurnId(turn)
            case let (nil, turn?): params.boundary = .afterTurnId(turn)
            default: throw ValidationError("give one of --before TURN_ID or --after TURN_ID")
            }
            let client = try options.session()
            try output(try await client.call(.threadRevert(params)), as: out.format)
            await client.close()
        }
    }

    struct Items: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "A page of a thread's items across its turns.")
        @OptionGroup var options: ServerOptions
        @OptionGroup var out: OutputOptions
        @Argument(help: "The thread's id (thread list -o table shows them).") var threadID: String
        @Option(help: "Items per page.") var limit: UInt32 = 50
        @Option(help: "From a previous page's next_cursor.") var cursor: String?
        @Flag(help: "Newest first.") var newestFirst = false
        func run() async throws {
            let client = try options.session()
            try output(try await client.call(.threadItemsList(Wire.ThreadItemsListParams(
                threadId: threadID, cursor: cursor, limit: limit, sortDirection: newestFirst ? .descending : nil))), as: out.format)
            await client.close()
        }
    }

    struct Loaded: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "The ids of your threads loaded on the server that answers.")
        @OptionGroup var options: ServerOptions
        @OptionGroup var out: OutputOptions
        func run() async throws {
            let client = try options.session()
            try output(try await client.call(.threadLoadedList(Wire.ThreadLoadedListParams())), as: out.format)
            await client.close()
        }
    }

    struct Read: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Read a thread without loading or subscribing to it.")
        @OptionGroup var options: ServerOptions
        @OptionGroup var out: OutputOptions
        @Argument(help: "The thread's id (thread list -o table shows them).") var threadID: String
        @Flag(help: "Include its turns and their items.") var turns = false
        @Flag(help: "With --turns: also what the model was shown.") var modelRequests = false
        @Flag(help: "With --turns: also turns taken back by thread/rollback.") var rolledBack = false
        func run() async throws {
            let client = try options.session()
            try output(try await client.call(.threadRead(Wire.ThreadReadParams(
                threadId: threadID, includeTurns: turns, includeModelRequests: modelRequests, includeRolledBack: rolledBack))), as: out.format)
            await client.close()
        }
    }

    struct Name: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Name a thread (an empty name clears it).")
        @OptionGroup var options: ServerOptions
        @OptionGroup var out: OutputOptions
        @Argument(help: "The thread's id (thread list -o table shows them).") var threadID: String
        @Argument(help: "The new name (\"\" clears it).") var name: String
        func run() async throws {
            let client = try options.session()
            try output(try await client.call(.threadNameSet(Wire.ThreadNameSetParams(threadId: threadID, name: name))), as: out.format)
            await client.close()
        }
    }

    struct Compact: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Compact a thread's context now and print the compaction turn's notifications.")
        @OptionGroup var options: ServerOptions
        @OptionGroup var out: OutputOptions
        @Argument(help: "The thread's id (thread list -o table shows them).") var threadID: String
        func run() async throws {
            let client = try options.session()
            let response = try await client.call(.threadCompactStart(Wire.ThreadCompactStartParams(threadId: threadID)))
            try output(response, as: out.format)
            guard case let .threadCompactStart(result)? = response.result, let turnID = result.turn?.id else { return }
            for await notification in try await client.client().notifications {
                writeLine(notification.jsonValue().render())
                if case let .turnCompleted(done)? = notification.payload, done.turn?.id == turnID { break }
            }
            await client.close()
        }
    }

    struct Rollback: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Take the last N turns out of the model's context.")
        @OptionGroup var options: ServerOptions
        @OptionGroup var out: OutputOptions
        @Argument(help: "The thread's id (thread list -o table shows them).") var threadID: String
        @Argument(help: "How many turns, newest first.") var numTurns: UInt32 = 1
        func run() async throws {
            let client = try options.session()
            try output(try await client.call(.threadRollback(Wire.ThreadRollbackParams(threadId: threadID, numTurns: numTurns))), as: out.format)
            await client.close()
        }
    }

    struct List: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "List threads, newest first (-o table: one line each, -o wide: more columns).")
        @OptionGroup var options: ServerOptions
        @OptionGroup var out: OutputOptions
        @Option(help: "Threads per page (at most 100).") var limit: UInt32 = 20
        @Flag(help: "Archived threads instead of the others.") var archived = false
        @Option(help: "Only threads whose name or preview contains this (3 characters or more, ignoring case).") var search: String?
        func run() async throws {
            let client = try options.session()
            let response = try await client.call(.threadList(Wire.ThreadListParams(limit: limit, archived: archived, searchTerm: search)))
            await client.close()
            try output(response, as: out.format)
        }
    }
}

struct TurnCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "turn", abstract: "Start, steer, continue or interrupt turns.",
        subcommands: [Start.self, Steer.self, Continue.self, Interrupt.self])

    struct Start: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Start a turn: print the response, then (unless --no-wait) its notifications as JSON lines until it completes; with -o table, wide or yaml, the finished turn.")
        @OptionGroup var options: ServerOptions
        @OptionGroup var out: OutputOptions
        @Argument(help: "The thread's id (thread list -o table shows them).") var threadID: String
        @Argument(help: "The input text (lines starting with #tool, #hold, #fail script the embedded model).") var text: String
        @Option(help: "Sticky model for this and later turns.") var model: String?
        @Option(help: "Sticky mode for this and later turns: explicitRequestOnly, proactive or clear.") var mode: String?
        @Flag(help: "Return right after the response.") var noWait = false
        @Option(help: "Sticky approval policy for this and later turns: never, on_request or always.") var approvalPolicy: String?
        @Option(help: "Sticky reasoning effort for this and later turns (\"\" clears it).") var effort: String?
        @OptionGroup var answering: ServerRequestOptions
        func run() async throws {
            var params = Wire.TurnStartParams(threadId: threadID, input: [Wire.UserInput(content: .text(text))], model: model)
            params.reasoningEffort = effort
            if let mode { params.multiAgentModeUpdate = mode == "clear" ? .clearMultiAgentMode(true) : .multiAgentMode(try parseMode(mode)) }
            if let approvalPolicy {
                guard let policy = try? Wire.ApprovalPolicy(json: .string(approvalPolicy.uppercased()), path: "approval_policy"), policy != .unspecified else {
                    throw ValidationError("--approval-policy must be never, on_request or always, got '\(approvalPolicy)'")
                }
                params.approvalPolicy = policy
            }
            let client = try answering.session(options)
            let response = try await client.call(.turnStart(params))
            try output(response, as: out.format)
            guard !noWait, case let .turnStart(result)? = response.result, let turnID = result.turn?.id else { return }
            for await notification in try await client.client().notifications {
                // JSON: every notification as a line; other formats: the finished turn, as they print a turn.
                if out.format == .json { writeLine(notification.jsonValue().render()) }
                if case let .turnCompleted(done)? = notification.payload, done.turn?.id == turnID, done.threadId == threadID {
                    if out.format != .json, out.format != .id, let finished = notification.jsonValue()["turn_completed"] {
                        let text = out.format == .yaml ? "---\n" + Rendered.text(finished, as: .yaml) : "\n" + Rendered.text(finished, as: out.format)
                        FileHandle.standardOutput.write(Data(text.utf8))
                    }
                    break
                }
            }
            await client.close()
        }
    }

    struct Steer: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Add input to the running turn; it reaches the model at the next model request.")
        @OptionGroup var options: ServerOptions
        @OptionGroup var out: OutputOptions
        @Argument(help: "The thread's id (thread list -o table shows them).") var threadID: String
        @Argument(help: "The running turn's id.") var turnID: String
        @Argument(help: "The input to add.") var text: String
        func run() async throws {
            let client = try options.session()
            try output(try await client.call(.turnSteer(Wire.TurnSteerParams(
                threadId: threadID, expectedTurnId: turnID, input: [Wire.UserInput(content: .text(text))]))), as: out.format)
            await client.close()
        }
    }

    struct Continue: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Let a turn paused after its tool calls (the thread's pause_after_tools) make its next model request (the paused one, unless TURN_ID names it).")
        @OptionGroup var options: ServerOptions
        @OptionGroup var out: OutputOptions
        @Argument(help: "The thread's id (thread list -o table shows them).") var threadID: String
        @Argument(help: "The paused turn; absent: the thread's active one.") var turnID: String?
        func run() async throws {
            let client = try options.session()
            guard let turn = try await TurnCommand.turn(turnID, of: threadID, client: client, out: out, missing: "paused") else { return }
            try output(try await client.call(.turnContinue(Wire.TurnContinueParams(threadId: threadID, turnId: turn))), as: out.format)
            await client.close()
        }
    }

    struct Interrupt: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Interrupt a thread's running turn (the one running now, unless TURN_ID names it).")
        @OptionGroup var options: ServerOptions
        @OptionGroup var out: OutputOptions
        @Argument(help: "The thread's id (thread list -o table shows them).") var threadID: String
        @Argument(help: "The turn to interrupt; absent: the running one.") var turnID: String?
        func run() async throws {
            let client = try options.session()
            guard let turn = try await TurnCommand.turn(turnID, of: threadID, client: client, out: out, missing: "running") else { return }
            try output(try await client.call(.turnInterrupt(Wire.TurnInterruptParams(threadId: threadID, turnId: turn))), as: out.format)
            await client.close()
        }
    }

    /// The turn a command names, else the thread's active one; a thread with
    /// none exits as FAILED_PRECONDITION, saying it has no `missing` turn.
    /// Nil when the read itself failed (its answer is printed).
    static func turn(_ named: String?, of threadID: String, client: ReconnectingClient, out: OutputOptions,
                     missing: String) async throws -> String? {
        if let named { return named }
        let read = try await client.call(.threadRead(Wire.ThreadReadParams(threadId: threadID)))
        guard case let .threadRead(result)? = read.result else {
            try output(read, as: out.format)
            return nil
        }
        guard let active = result.thread?.status?.activeTurnId else {
            FileHandle.standardError.write(Data("threadwire: FAILED_PRECONDITION: thread \(threadID) has no \(missing) turn\n".utf8))
            throw ExitCode(StatusExit.code(for: 9))
        }
        return active
    }
}

struct ModeCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "mode", abstract: "Show or change a thread's selected multi-agent mode.",
        subcommands: [Show.self, Set.self])

    struct Show: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Print the selected mode, the pinned runtime and the last turn's effective mode (-o json or yaml: as an object).")
        @OptionGroup var options: ServerOptions
        @OptionGroup(title: "Output") var out: ModeOutputOptions
        @Argument(help: "The thread's id (thread list -o table shows them).") var threadID: String
        func run() async throws {
            let client = try options.session()
            let result = try await client.result(.threadRead(Wire.ThreadReadParams(threadId: threadID, includeTurns: true)))
            guard case let .threadRead(read) = result, let thread = read.thread else { throw ExitCode(1) }
            let effective = thread.turns.last?.context?.effectiveMultiAgentMode
            let selected = thread.multiAgentMode.map { "\($0)" } ?? "unset"
            let effectiveText = thread.turns.isEmpty ? "(no turn yet)" : effective.map { "\($0)" } ?? "none (not applicable)"
            let runtime = thread.multiAgentRuntime.map { $0 == .unspecified ? "unresolved (first turn decides)" : "\($0)" } ?? "unresolved"
            switch out.format {
            case .table, .wide, .id:
                print("selected:  \(selected)")
                print("effective: \(effectiveText) (last turn)")
                print("runtime:   \(runtime)")
            case .json, .yaml:
                let shown = JSONValue.object([("selected", thread.multiAgentMode.map { .string("\($0)") } ?? .null),
                                              ("effective", thread.turns.isEmpty ? .null : effective.map { .string("\($0)") } ?? .null),
                                              ("runtime", thread.multiAgentRuntime.map { .string("\($0)") } ?? .null)])
                print(Rendered.text(shown, as: out.format), terminator: "")
            }
            await client.close()
        }
    }

    struct Set: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Select explicitRequestOnly or proactive, or clear the selection.")
        @OptionGroup var options: ServerOptions
        @OptionGroup var out: OutputOptions
        @Argument(help: "The thread's id (thread list -o table shows them).") var threadID: String
        @Argument(help: "explicitRequestOnly, proactive or clear.") var mode: String
        func run() async throws {
            var params = Wire.ThreadSettingsUpdateParams(threadId: threadID)
            params.multiAgentModeUpdate = mode == "clear" ? .clearMultiAgentMode(true) : .multiAgentMode(try parseMode(mode))
            let client = try options.session()
            try output(try await client.call(.threadSettingsUpdate(params)), as: out.format)
            await client.close()
        }
    }
}

/// mode show prints lines for people unless asked for JSON or YAML.
struct ModeOutputOptions: ParsableArguments {
    @Option(name: [.customShort("o"), .customLong("output")], help: "table (three lines, the default), json or yaml.")
    var format: OutputFormat = .table
}

struct AgentCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "agent", abstract: "Spawn child agents.", subcommands: [Spawn.self])

    struct Spawn: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Spawn a child agent of a thread: it inherits the parent's runtime and the spawning turn's effective mode.")
        @OptionGroup var options: ServerOptions
        @OptionGroup var out: OutputOptions
        @Argument(help: "The parent thread's id.") var parentThreadID: String
        @Option(help: "The child's first input (starts its first turn).") var message: String?
        @Option(help: "The child's model (default: the parent's).") var model: String?
        @Option(help: "The child's task name (default: one the server picks).") var taskName: String?
        func run() async throws {
            let client = try options.session()
            try output(try await client.call(.agentSpawn(Wire.AgentSpawnParams(
                parentThreadId: parentThreadID, message: message, model: model, taskName: taskName))), as: out.format)
            await client.close()
        }
    }
}

struct Watch: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Subscribe to threads and print notifications as JSON lines; with --approve or --client-tool, answer what their turns wait for.")
    @OptionGroup var options: ServerOptions
    @Argument(help: "Threads to watch (each is resumed, which subscribes; requests a turn waits for are offered again).") var threadIDs: [String]
    @OptionGroup var answering: ServerRequestOptions
    @Flag(help: "End when the connection ends, instead of connecting again and resuming each thread after the last event printed.")
    var once = false
    func run() async throws {
        if once {
            let client = try await answering.connect(options)
            for id in threadIDs {
                _ = try await client.result(.threadResume(Wire.ThreadResumeParams(threadId: id, excludeTurns: true)))
            }
            FileHandle.standardError.write(Data("watch: subscribed to \(threadIDs.joined(separator: ", "))\n".utf8))
            for await notification in client.notifications {
                writeLine(notification.jsonValue().render())
            }
            return
        }
        // The first connection fails loudly (a wrong address, a bad token);
        // later ones are retried with backoff for as long as it runs.
        await (try answering.connect(options)).close()
        FileHandle.standardError.write(Data("watch: subscribing to \(threadIDs.joined(separator: ", ")) (resuming after any dropped connection)\n".utf8))
        var subscription = ResumingSubscription(threads: threadIDs) { [options, answering] in try await answering.connect(options) }
        subscription.onGap = { id, message in
            FileHandle.standardError.write(Data("watch: thread \(id): events were missed (\(message)); going on from its newest\n".utf8))
        }
        await subscription.run { notification in writeLine(notification.jsonValue().render()) }
    }
}

/// Unbuffered, so `watch` output reaches a pipe as it happens.
func writeLine(_ line: String) {
    FileHandle.standardOutput.write(Data((line + "\n").utf8))
}
