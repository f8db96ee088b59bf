import ArgumentParser
import Foundation
import ThreadwireClient
import ThreadwireWire

/// Synthetic workloads on the real methods.
struct Bench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Generate a synthetic load and report throughput and latency.")

    enum Workload: String, ExpressibleByArgument, CaseIterable {
        case health, read, settings, turn
    }

    @OptionGroup var server: ServerOptions
    @Option(help: "health (health/check), read (thread/read), settings (thread/settings/update, durable), turn (turn/start to completion).")
    var workload: Workload = .health
    @Option(help: "Client connections, each sending requests in turn.") var connections = 16
    @Option(help: "Total requests per second (open loop); default: as fast as possible.") var rate: Double?
    @Option(help: "Seconds to run.") var duration = 5.0
    @OptionGroup var output: ReportOutputOptions
    var json: Bool { output.json }
    @Flag(help: "Send each change (settings, turn) with a new idempotency key, as retrying clients do.") var idempotencyKeys = false

    func run() async throws {
        let threads = ThreadBox()
        let workload = self.workload
        let keyed = idempotencyKeys
        let report = try await LoadRun.run(
            server: server, options: LoadOptions(connections: connections, rate: rate, duration: duration), progress: !json,
            makeScript: { BenchScript(workload: workload, thread: threads.get($0), keyed: keyed) },
            setUp: { client, index in
                guard workload != .health else { return }
                guard case let .threadStart(started) = try await client.result(.threadStart(Wire.ThreadStartParams())),
                      let id = started.thread?.id else { throw ValidationError("thread/start failed") }
                threads.set(index, id)
            })
        print(json ? report.json.render(pretty: true) : report.text)
        if report.errors > 0 { throw ExitCode(1) }
    }
}

final class ThreadBox: @unchecked Sendable {
    private let lock = NSLock()
    private var ids: [Int: String] = [:]
    func set(_ index: Int, _ id: String) { lock.lock(); ids[index] = id; lock.unlock() }
    func get(_ index: Int) -> String { lock.lock(); defer { lock.unlock() }; return ids[index] ?? "" }
}

final class BenchScript: LoadScript, @unchecked Sendable {
    let workload: Bench.Workload
    let thread: String
    let keyed: Bool
    private var counter = 0
    private var notifications: AsyncStream<Wire.Notification>.Iterator?

    init(workload: Bench.Workload, thread: String, keyed: Bool) {
        self.workload = workload
        self.thread = thread
        self.keyed = keyed
    }

    private var key: String? { keyed ? UUID().uuidString : nil }

    func step(_ client: ThreadwireClient) async throws -> UInt32? {
        counter += 1
        switch workload {
        case .health:
            return try await client.call(.healthCheck(.init())).code ?? 0
        case .read:
            return try await client.call(.threadRead(Wire.ThreadReadParams(threadId: thread))).code ?? 0
        case .settings:
            return try await client.call(.threadSettingsUpdate(Wire.ThreadSettingsUpdateParams(threadId: thread, model: "m\(counter)")),
                                         idempotencyKey: key).code ?? 0
        case .turn:
            if notifications == nil { notifications = client.notifications.makeAsyncIterator() }
            let response = try await client.call(.turnStart(Wire.TurnStartParams(threadId: thread, input: [Wire.UserInput(content: .text("step \(counter)"))])),
                                                 idempotencyKey: key)
            guard response.code ?? 0 == 0, case let .turnStart(started)? = response.result else { return response.code ?? 0 }
            while let notification = await notifications?.next() {
                if case let .turnCompleted(done)? = notification.payload, done.turn?.id == started.turn?.id { break }
            }
            return 0
        }
    }
}
