public import AsyncHTTPClient
public import Foundation
public import NIOCore
public import Testing

/// Tests/provider/fake_openai.py as a real process: an OpenAI-compatible
/// Chat Completions server scripted per test (see that file).
public final class FakeProvider: @unchecked Sendable {
    public let process: Process
    public let port: Int
    /// Its standard input: the provider exits when this closes, so it never
    /// outlives the test process (an orphan would also keep the test
    /// runner's output pipe open and hang it).
    private let lifeline: Pipe
    public var baseURL: String { "http://127.0.0.1:\(port)/v1" }

    public static var script: String {
        URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("provider/fake_openai.py").path
    }

    private init(process: Process, port: Int, lifeline: Pipe) {
        self.process = process
        self.port = port
        self.lifeline = lifeline
    }

    public static func launch() async throws -> FakeProvider {
        try await offThread {
            let process = Process()
            process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
            process.arguments = ["python3", script, "--exit-on-stdin-eof"]
            let stdout = Pipe()
            let lifeline = Pipe()
            process.standardOutput = stdout
            process.standardInput = lifeline
            process.standardError = FileHandle.nullDevice
            try process.run()
            var buffered = Data()
            while !buffered.contains(UInt8(ascii: "\n")) {
                let chunk = stdout.fileHandleForReading.availableData
                if chunk.isEmpty { throw TestTimeout(description: "the fake provider did not start") }
                buffered += chunk
            }
            let line = String(decoding: buffered, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
            guard line.hasPrefix("listening "), let port = Int(line.dropFirst("listening ".count)) else {
                throw TestTimeout(description: "the fake provider said '\(line)'")
            }
            return FakeProvider(process: process, port: port, lifeline: lifeline)
        }
    }

    public func stop() {
        try? lifeline.fileHandleForWriting.close()
        if process.isRunning { kill(process.processIdentifier, SIGKILL) }
    }

    deinit { stop() }

    /// Queues responses, served in order to the next chat requests.
    public func script(_ responses: [[String: Any]]) async throws {
        _ = try await call("POST", "/control/script", JSONSerialization.data(withJSONObject: ["responses": responses]))
    }

    /// Every chat request so far, in arrival order.
    public func requests() async throws -> [[String: Any]] {
        let data = try await call("GET", "/control/requests", nil)
        return try #require(try JSONSerialization.jsonObject(with: data) as? [[String: Any]])
    }

    private func call(_ method: String, _ path: String, _ body: Data?) async throws -> Data {
        var request = HTTPClientRequest(url: "http://127.0.0.1:\(port)\(path)")
        request.method = .RAW(value: method)
        if let body { request.body = .bytes(ByteBuffer(bytes: body)) }
        let response = try await HTTPClient.shared.execute(request, timeout: .seconds(10))
        let buffer = try await response.body.collect(upTo: 64 << 20)
        return Data(buffer.readableBytesView)
    }

    // MARK: Building responses

    /// A streamed answer: text pieces, then tool calls (arguments split into
    /// `pieces` chunks each), then a usage chunk.
    public static func stream(text: [String] = [], toolCalls: [(name: String, arguments: String)] = [], pieces: Int = 3,
                       usage: (input: Int, output: Int)? = (12, 5), delayMs: Int = 0) -> [String: Any] {
        var events: [[String: Any]] = []
        func chunk(_ delta: [String: Any], finish: String? = nil) {
            var choice: [String: Any] = ["index": 0, "delta": delta]
            choice["finish_reason"] = finish ?? NSNull()
            events.append(["delay_ms": delayMs, "data": json(["id": "c1", "object": "chat.completion.chunk", "choices": [choice]])])
        }
        chunk(["role": "assistant", "content": ""])
        for piece in text { chunk(["content": piece]) }
        for (index, call) in toolCalls.enumerated() {
            let arguments = Array(call.arguments)
            let size = max(1, (arguments.count + pieces - 1) / pieces)
            var start = 0
            var first = true
            repeat {
                let part = String(arguments[start..<min(start + size, arguments.count)])
                var entry: [String: Any] = ["index": index, "function": ["arguments": part]]
                if first {
                    entry["id"] = "call_\(index)"
                    entry["type"] = "function"
                    entry["function"] = ["name": call.name, "arguments": part]
                }
                chunk(["tool_calls": [entry]])
                first = false
                start += size
            } while start < arguments.count
        }
        chunk([:], finish: toolCalls.isEmpty ? "stop" : "tool_calls")
        if let usage {
            events.append(["data": json(["id": "c1", "choices": [Any](),
                                         "usage": ["prompt_tokens": usage.input, "completion_tokens": usage.output,
                                                   "total_tokens": usage.input + usage.output]])])
        }
        return ["events": events]
    }

    /// A streamed Responses API answer: text deltas, then function calls
    /// (arguments in `pieces` deltas each), then `response.completed` with usage.
    public static func responsesStream(text: [String] = [], toolCalls: [(name: String, arguments: String)] = [], pieces: Int = 3,
                                usage: (input: Int, output: Int) = (20, 6)) -> [String: Any] {
        var events: [[String: Any]] = []
        func event(_ type: String, _ fields: [String: Any]) {
            events.append(["raw": "event: \(type)\ndata: \(json(fields.merging(["type": type]) { $1 }))\n\n"])
        }
        event("response.created", ["response": ["id": "r1", "status": "in_progress"]])
        for piece in text { event("response.output_text.delta", ["output_index": 0, "delta": piece]) }
        for (offset, call) in toolCalls.enumerated() {
            let index = offset + 1
            event("response.output_item.added", ["output_index": index,
                                                 "item": ["type": "function_call", "call_id": "fc_\(offset)", "name": call.name, "arguments": ""]])
            let arguments = Array(call.arguments)
            let size = max(1, (arguments.count + pieces - 1) / pieces)
            var start = 0
            while start < arguments.count {
                event("response.function_call_arguments.delta",
                      ["output_index": index, "delta": String(arguments[start..<min(start + size, arguments.count)])])
                start += size
            }
        }
        event("response.completed", ["response": ["id": "r1", "status": "completed",
                                                  "usage": ["input_tokens": usage.input, "output_tokens": usage.output,
                                                            "total_tokens": usage.input + usage.output]]])
        return ["events": events, "done": false]
    }

    public static func json(_ value: Any) -> String {
        String(decoding: try! JSONSerialization.data(withJSONObject: value, options: [.sortedKeys]), as: UTF8.self)
    }
}
