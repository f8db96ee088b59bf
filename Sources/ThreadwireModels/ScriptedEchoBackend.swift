public import ThreadwireCore
import Foundation

/// The embedded, offline, deterministic backend. It echoes the user's input and
/// can be scripted by lines of that input:
///   `#tool NAME {json}`  emit a tool call on the turn's first model call
///   `#hold`              keep the turn running until it is interrupted
///   `#fail`              fail the turn
///   `#sleep MS`          answer after MS milliseconds (a slow model)
///   `#stream`            stream the echo word by word (item/agent_message/delta)
///   `#fail-compaction`   fail any compaction of a context holding this line
/// It reports usage estimated from the text (4 bytes a token), and answers a
/// compaction's summarisation call with a summary of the user's inputs.
public struct ScriptedEchoBackend: ModelBackend {
    public init() {}

    public func respond(to request: ModelRequest, stream: ModelStream) async throws -> ModelResponse {
        let outputs = try await outputs(for: request, stream: stream)
        return ModelResponse(outputs: outputs, usage: Self.estimatedUsage(request, outputs))
    }

    /// Usage as a provider would report it, estimated at 4 bytes a token, so
    /// token usage and context windows can be tried offline.
    static func estimatedUsage(_ request: ModelRequest, _ outputs: [ModelOutput]) -> TokenUsage {
        let tokens = { (bytes: Int) in (bytes + 3) / 4 }
        let input = tokens(request.context.reduce(0) { $0 + $1.text.utf8.count })
        let output = tokens(outputs.reduce(0) { total, output in
            switch output {
            case let .message(text): return total + text.utf8.count
            case let .toolCall(name, arguments, _): return total + name.utf8.count + arguments.utf8.count
            }
        })
        return TokenUsage(inputTokens: input, outputTokens: output, totalTokens: input + output)
    }

    func outputs(for request: ModelRequest, stream: ModelStream) async throws -> [ModelOutput] {
        if request.isCompaction { return [.message(try Self.summary(of: request))] }
        // The current turn's input is the newest user input; tool outputs after
        // it mean the scripted calls already ran.
        guard let inputIndex = request.context.lastIndex(where: { $0.kind == .userInput }) else {
            return [.message("echo: (no input)")]
        }
        let input = request.context[inputIndex].text
        let afterInput = request.context[(inputIndex + 1)...]
        let lines = input.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
        if lines.contains(where: { $0.trimmingCharacters(in: .whitespaces) == "#fail" }) {
            throw ModelCallError(.providerError, "the scripted backend was asked to fail (#fail)")
        }
        if lines.contains(where: { $0.trimmingCharacters(in: .whitespaces) == "#hold" }) {
            while true { try await Task.sleep(nanoseconds: 3_600_000_000_000) }
        }
        if let line = lines.first(where: { $0.hasPrefix("#sleep ") }), let ms = Int(line.dropFirst("#sleep ".count).trimmingCharacters(in: .whitespaces)) {
            try await Task.sleep(for: .milliseconds(max(0, ms)))
        }
        let plain = lines.filter { !$0.hasPrefix("#") }.joined(separator: "\n")
        let toolsAlreadyRan = afterInput.contains { $0.kind == .toolOutput }
        if !toolsAlreadyRan {
            var calls: [ModelOutput] = []
            for (index, line) in lines.enumerated() where line.hasPrefix("#tool ") {
                let rest = line.dropFirst("#tool ".count)
                let name = String(rest.prefix { $0 != " " })
                let arguments = rest.dropFirst(name.count).trimmingCharacters(in: .whitespaces)
                calls.append(.toolCall(name: name, arguments: arguments.isEmpty ? "{}" : arguments, callID: "call_\(index)"))
            }
            if !calls.isEmpty { return calls }
        }
        let answer = "echo: " + plain
        if lines.contains(where: { $0.trimmingCharacters(in: .whitespaces) == "#stream" }) {
            var pieces = answer.split(separator: " ", omittingEmptySubsequences: false).map { $0 + " " }
            pieces[pieces.count - 1].removeLast()
            for piece in pieces {
                try Task.checkCancellation()
                stream.text(String(piece))
                await Task.yield()
            }
        }
        return [.message(answer)]
    }

    /// A compaction's summary: the user's inputs (less script lines), newest last.
    static func summary(of request: ModelRequest) throws -> String {
        let inputs = request.context.dropLast().filter { $0.kind == .userInput }.map(\.text)
        let lines = inputs.flatMap { $0.split(separator: "\n").map { $0.trimmingCharacters(in: .whitespaces) } }
        if lines.contains("#fail-compaction") {
            throw ModelCallError(.providerError, "the scripted backend was asked to fail compactions (#fail-compaction)")
        }
        let asked = inputs.map { $0.split(separator: "\n").filter { !$0.hasPrefix("#") }.joined(separator: " ").prefix(60) }
        return "summary of \(request.context.count - 2) items; the user asked: " + asked.joined(separator: "; ")
    }
}
