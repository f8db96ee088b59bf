import ArgumentParser
import Foundation
import Histogram
import ThreadwireClient
import ThreadwireWire

/// Streaming turns against a server whose model is a provider that stamps
/// every chunk with its send time (Benchmarks/streaming.sh sets that up):
/// the latency threadwire adds between a provider chunk and the client's
/// item/agent_message/delta, and the server's memory per streaming turn.
struct Streaming: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "streaming", abstract: "Delta latency and memory per streaming turn (see Benchmarks/streaming.sh).")

    @Option(help: "host:port of the server") var server = "127.0.0.1:7420"
    @Option(help: "Client connections") var connections = 50
    @Option(help: "Concurrent streaming turns (one thread each), spread over the connections") var turns = 200
    @Option(help: "The model slug the provider serves") var model = "remote-1"
    @Option(help: "The server's pid, to sample its resident memory") var serverPid: Int32 = 0

    func run() async throws {
        let parts = server.split(separator: ":")
        guard parts.count == 2, let port = Int(parts[1]) else { throw ValidationError("--server HOST:PORT") }
        let host = String(parts[0])
        let idle = residentBytes()
        let peak = PeakMemory(pid: serverPid)
        let sampler = Task { await peak.sample() }
        let started = ContinuousClock.now
        let results = try await withThrowingTaskGroup(of: (Histogram<UInt64>, Int, Int).self) { group in
            for index in 0..<connections {
                let share = turns / connections + (index < turns % connections ? 1 : 0)
                group.addTask { try await Self.drive(host: host, port: port, turns: share, model: model) }
            }
            var all: [(Histogram<UInt64>, Int, Int)] = []
            for try await result in group { all.append(result) }
            return all
        }
        let elapsed = ContinuousClock.now - started
        sampler.cancel()
        var merged = Histogram<UInt64>(highestTrackableValue: 60_000_000, numberOfSignificantValueDigits: .three)
        for (histogram, _, _) in results { merged.add(histogram) }
        let deltas = results.map(\.1).reduce(0, +)
        let completed = results.map(\.2).reduce(0, +)
        let peakBytes = await peak.value
        print(String(format: "turns %d completed %d, deltas %d in %.2f s", turns, completed, deltas,
                     Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18))
        print("provider chunk -> client delta latency: p50 \(merged.valueAtPercentile(50)) us, p99 \(merged.valueAtPercentile(99)) us, max \(merged.max) us")
        if serverPid > 0 {
            print(String(format: "server RSS idle %.1f MiB, peak %.1f MiB: %.1f KiB per streaming turn",
                         Double(idle) / 1_048_576, Double(peakBytes) / 1_048_576, Double(peakBytes - idle) / 1024 / Double(turns)))
        }
    }

    /// One connection: starts its turns at once, then reads every delta.
    static func drive(host: String, port: Int, turns: Int, model: String) async throws -> (Histogram<UInt64>, Int, Int) {
        let client = try await ThreadwireClient.connect(host: host, port: port)
        _ = try await client.initialize(name: "threadwire-bench-streaming")
        var histogram = Histogram<UInt64>(highestTrackableValue: 60_000_000, numberOfSignificantValueDigits: .three)
        var threads: [String] = []
        for _ in 0..<turns {
            guard case let .threadStart(started) = try await client.result(.threadStart(Wire.ThreadStartParams(model: model))),
                  let id = started.thread?.id else { throw ValidationError("thread/start failed") }
            threads.append(id)
        }
        for id in threads {
            _ = try await client.result(.turnStart(Wire.TurnStartParams(threadId: id, input: [Wire.UserInput(content: .text("stream"))])))
        }
        var deltas = 0
        var completed = 0
        for await notification in client.notifications {
            switch notification.payload {
            case let .itemAgentMessageDelta(delta)?:
                let now = wallClockNanoseconds()
                // Each chunk's text is "ts=<provider send time in ns>;".
                for stamp in (delta.delta ?? "").split(separator: ";") where stamp.hasPrefix("ts=") {
                    if let sent = UInt64(stamp.dropFirst(3)), now > sent {
                        _ = histogram.record(Swift.max(1, (now - sent) / 1000))
                        deltas += 1
                    }
                }
            case .turnCompleted?:
                completed += 1
            default:
                break
            }
            if completed == turns { break }
        }
        await client.close()
        return (histogram, deltas, completed)
    }

    private func residentBytes() -> Int { PeakMemory.resident(serverPid) }
}

func wallClockNanoseconds() -> UInt64 {
    var now = timespec()
    clock_gettime(CLOCK_REALTIME, &now)
    return UInt64(now.tv_sec) * 1_000_000_000 + UInt64(now.tv_nsec)
}

actor PeakMemory {
    let pid: Int32
    private(set) var value = 0
    init(pid: Int32) { self.pid = pid }

    func sample() async {
        while !Task.isCancelled {
            value = Swift.max(value, Self.resident(pid))
            try? await Task.sleep(for: .milliseconds(20))
        }
    }

    static func resident(_ pid: Int32) -> Int {
        guard pid > 0, let status = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8),
              let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmRSS:") }),
              let kib = Int(line.split(separator: " ").dropFirst().first ?? "") else { return 0 }
        return kib * 1024
    }
}
