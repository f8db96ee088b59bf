import Foundation
import Logging
import MCP
import SystemPackage

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// MCP's stdio framing (one JSON-RPC message per line) over a child's pipes,
/// read by a blocking read on a thread of its own.
///
/// Why not the SDK's StdioTransport (0.12.1): its read loop sets O_NONBLOCK
/// and sleeps 10 ms whenever nothing is there yet, so an answer can wait up
/// to 10 ms after it arrived. A blocking read wakes as the bytes arrive.
actor PipeTransport: Transport {
    nonisolated let logger: Logger
    private let input: FileDescriptor
    private let output: FileDescriptor
    private let messages: AsyncThrowingStream<Data, any Error>
    private let sink: AsyncThrowingStream<Data, any Error>.Continuation
    private var started = false

    /// `input`: the child's stdout (read); `output`: its stdin (written).
    /// The transport does not close them.
    init(input: FileDescriptor, output: FileDescriptor, logger: Logger) {
        self.input = input
        self.output = output
        self.logger = logger
        (messages, sink) = AsyncThrowingStream.makeStream()
    }

    func connect() async throws {
        guard !started else { return }
        started = true
        let input = self.input
        let sink = self.sink
        Thread.detachNewThread {
            var pending = Data()
            var buffer = [UInt8](repeating: 0, count: 65536)
            while true {
                let count = buffer.withUnsafeMutableBytes { read(input.rawValue, $0.baseAddress, $0.count) }
                if count < 0 && errno == EINTR { continue }
                // EOF (the child exited) or an error. The stream stays open until
                // disconnect(): the SDK's client loop asks for it again at once
                // when it ends, and would spin until the supervisor, which reaps
                // the child, disconnects it (failing what is pending).
                guard count > 0 else { return }
                pending.append(contentsOf: buffer[..<count])
                while let newline = pending.firstIndex(of: UInt8(ascii: "\n")) {
                    let line = pending[pending.startIndex..<newline]
                    if !line.isEmpty { sink.yield(Data(line)) }
                    pending = Data(pending[(newline + 1)...])
                }
            }
        }
    }

    func disconnect() async {
        sink.finish()
    }

    func send(_ data: Data) async throws {
        var line = data
        line.append(UInt8(ascii: "\n"))
        var offset = 0
        while offset < line.count {
            let written = line.withUnsafeBytes { write(output.rawValue, $0.baseAddress! + offset, $0.count - offset) }
            if written < 0 {
                if errno == EINTR { continue }
                throw MCPError.transportError(Errno(rawValue: errno))
            }
            offset += written
        }
    }

    func receive() -> AsyncThrowingStream<Data, any Error> {
        messages
    }
}
