import ArgumentParser
import Foundation
import ThreadwireClient
import ThreadwireWire

/// How `turn start` and `watch` answer what the server asks while a turn
/// runs: approvals on the terminal (or always yes / always no), client tools
/// from local commands, the model's questions on the terminal.
struct ServerRequestOptions: ParsableArguments {
    @Option(help: "Answer approvals: ask (on the terminal), yes (approve all) or no (decline all). Omitted: this connection is not asked.")
    var approve: Approve?

    @Option(name: .customLong("client-tool"),
            help: "NAME=COMMAND: serve client tool NAME with COMMAND (run by /bin/sh; the JSON arguments on stdin, its stdout is the output; a non-zero exit is a failed call). Repeatable.")
    var clientTools: [String] = []

    enum Approve: String, ExpressibleByArgument { case ask, yes, no }

    var commands: [String: String] {
        get throws {
            var table: [String: String] = [:]
            for entry in clientTools {
                guard let equals = entry.firstIndex(of: "="), equals != entry.startIndex, entry.index(after: equals) != entry.endIndex else {
                    throw ValidationError("--client-tool takes NAME=COMMAND, got '\(entry)'")
                }
                table[String(entry[..<equals])] = String(entry[entry.index(after: equals)...])
            }
            return table
        }
    }

    /// `connect`, again on every reconnect, with the server's retries (`--attempts`).
    func session(_ server: ServerOptions) throws -> ReconnectingClient {
        ReconnectingClient(policy: try server.retryPolicy()) { try await connect(server) }
    }

    /// A connection that declared what these options answer, already serving.
    func connect(_ server: ServerOptions) async throws -> ThreadwireClient {
        let commands = try self.commands
        let client = try await server.connect(initialize: false)
        try await client.initialize(name: "threadwire-cli", authToken: server.authToken, clientTools: !commands.isEmpty,
                                    approvals: approve != nil, userInput: approve == .ask)
        let terminal = Terminal()
        let approve = self.approve
        client.serve(ThreadwireClient.ServerRequestHandlers(
            toolCall: { _, call in
                guard let command = commands[call.tool ?? ""] else {
                    throw CLIError("no --client-tool for \(call.tool ?? "")")
                }
                return try await runToolCommand(command, input: call.arguments ?? "{}")
            },
            approval: { request, params in
                switch approve {
                case .yes?: return Wire.ApprovalResult(decision: .approve)
                case .no?, nil: return Wire.ApprovalResult(decision: .decline, reason: "declined by the operator (threadwire --approve no)")
                case .ask?:
                    let who = request.taskPath.map { " by \($0)" } ?? ""
                    let line = await terminal.ask(
                        "approve \(params.tool ?? "?")\(who) (thread \(request.threadId ?? "?"), root \(request.rootThreadId ?? "?"))"
                            + " with \(params.arguments ?? "{}")? [y]es, [t]ree (this tool, whole agent tree), [n]o REASON, [c]ancel the turn: ")
                    switch line.first.map(String.init)?.lowercased() {
                    case "y": return Wire.ApprovalResult(decision: .approve)
                    case "t": return Wire.ApprovalResult(decision: .approveForTree)
                    case "c": return Wire.ApprovalResult(decision: .cancel)
                    default:
                        let reason = line.drop { $0 != " " }.trimmingCharacters(in: .whitespaces)
                        return Wire.ApprovalResult(decision: .decline, reason: reason.isEmpty ? "declined by the operator" : reason)
                    }
                }
            },
            userInput: { request, params in
                let choices = params.choices.isEmpty ? "" : " (\(params.choices.joined(separator: " / ")))"
                let line = await terminal.ask("\(request.taskPath ?? "the agent") asks: \(params.question ?? "")\(choices)\n> ")
                return Wire.UserInputResult(answer: line)
            }))
        return client
    }
}

struct CLIError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

/// One question at a time on the terminal (prompts on stderr, answers from stdin).
actor Terminal {
    func ask(_ prompt: String) async -> String {
        FileHandle.standardError.write(Data(prompt.utf8))
        return await withCheckedContinuation { continuation in
            Thread.detachNewThread { continuation.resume(returning: readLine() ?? "") }
        }
    }
}

/// Runs `command` with /bin/sh, `input` on its stdin; stdout is the output.
func runToolCommand(_ command: String, input: String) async throws -> Wire.ToolCallResult {
    try await withCheckedThrowingContinuation { continuation in
        Thread.detachNewThread {
            let process = Process()
            process.executableURL = URL(fileURLWithPath: "/bin/sh")
            process.arguments = ["-c", command]
            let stdin = Pipe()
            let stdout = Pipe()
            let stderr = Pipe()
            process.standardInput = stdin
            process.standardOutput = stdout
            process.standardError = stderr
            do { try process.run() } catch {
                continuation.resume(throwing: CLIError("cannot run '\(command)': \(error)"))
                return
            }
            let errors = LockedData()
            let reader = Thread { errors.set(stderr.fileHandleForReading.readDataToEndOfFile()) }
            reader.start()
            try? stdin.fileHandleForWriting.write(contentsOf: Data(input.utf8))
            try? stdin.fileHandleForWriting.close()
            let output = String(decoding: stdout.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
            process.waitUntilExit()
            let failed = process.terminationStatus != 0
            let errorText = errors.wait()
            continuation.resume(returning: Wire.ToolCallResult(
                output: failed ? output + (errorText.isEmpty ? "" : "\n" + errorText) + "\n(exit status \(process.terminationStatus))" : output,
                isError: failed))
        }
    }
}

final class LockedData: @unchecked Sendable {
    private let condition = NSCondition()
    private var data: Data?
    func set(_ value: Data) {
        condition.lock()
        data = value
        condition.broadcast()
        condition.unlock()
    }
    func wait() -> String {
        condition.lock()
        defer { condition.unlock() }
        while data == nil { condition.wait() }
        return String(decoding: data ?? Data(), as: UTF8.self)
    }
}
