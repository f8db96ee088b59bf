import Foundation
import Synchronization
import Testing
import ThreadwireClient
import ThreadwireServerTesting
import ThreadwireWire

/// Issue 49 across instances: event numbers are assigned in the owner's
/// commits on PostgreSQL, so after a kill -9 of the owner the instance that
/// takes the thread over goes on from the stored number, and a client
/// resuming through another instance misses nothing and hears nothing twice.
@Suite("events resumed across a failover (real servers, real PostgreSQL)", .timeLimit(.minutes(4)))
struct EventFailoverTests {
    typealias Event = KeptEvent

    static func kept(_ notifications: [Wire.Notification]) -> [Event] { KeptEvent.of(notifications) }

    @Test("kill -9 of the owner among three instances while two clients write through the others: a subscriber resuming through the survivors after the last number it handled hears every stored event once, in order",
          arguments: Joining.allCases)
    func resumeAcrossFailover(joining: Joining) async throws {
        let group = try await InstanceGroup.start(3)
        defer { group.stopAll() }
        let ports = group.instances.map(\.port)
        func client(_ index: Int) async throws -> ThreadwireClient {
            let client = try await ThreadwireClient.connect(host: "127.0.0.1", port: ports[index])
            try await client.initialize(name: "events-\(index)")
            return client
        }
        let creator = try await client(0)
        let id = try #require(try await creator.startThread().thread?.id)

        // Two writers through the instances that survive; a refusal while the
        // thread changes hands is retried, as a client does.
        let writing = RunningFlag()
        let writers = Task {
            defer { writing.lower() }
            try await withThrowingTaskGroup(of: Void.self) { tasks in
                for writer in 1...2 {
                    tasks.addTask {
                        var connection = try await client(writer)
                        for n in 0..<60 {
                            while true {
                                do {
                                    _ = try await connection.updateSettings(Wire.ThreadSettingsUpdateParams(threadId: id, model: "w\(writer)-\(n)"))
                                    break
                                } catch ClientError.connectionClosed {
                                    connection = try await client(writer)
                                } catch ClientError.status {
                                    try await Task.sleep(for: .milliseconds(100))
                                }
                            }
                            try await Task.sleep(for: .milliseconds(20))
                        }
                    }
                }
                try await tasks.waitForAll()
            }
        }

        var heard: [Event] = []
        var connections = 0
        var killed = false
        var killedAfter: UInt64 = 0
        var finished = false
        while true {
            let at = 1 + connections % 2
            connections += 1
            guard let subscriber = try? await client(at) else { continue }
            let inbox = Inbox(subscriber)
            let after = heard.last?.number ?? 0
            do {
                _ = try await subscriber.result(joining.request(id, after: after))
            } catch {
                // The owner is gone and its lease not yet lapsed: retry.
                await subscriber.close()
                try await Task.sleep(for: .milliseconds(200))
                continue
            }
            try await Task.sleep(for: .milliseconds(finished ? 500 : 150))
            await subscriber.close()
            let got = Self.kept(await inbox.all).filter { $0.number > after }
            #expect(got.map(\.number) == Array((after + 1)..<(after + 1 + UInt64(got.count))), "after \(after): \(got)")
            heard += got
            if !killed && heard.count >= 30 {
                await group.instances[0].kill9()
                killed = true
                killedAfter = heard.last?.number ?? 0
            }
            if finished { break }
            if !writing.isRaised { finished = true }
        }
        try await writers.value
        #expect(killed)

        // What the store holds, replayed from the start through a survivor.
        let reader = try await client(1)
        let head = try #require(try await reader.read(id, turns: false).thread?.threadSequence)
        let inbox = Inbox(reader)
        _ = try await reader.result(.threadResume(Wire.ThreadResumeParams(threadId: id, excludeTurns: true, afterThreadSequence: 0)))
        let stored = try await inbox.kept(of: id, through: head)
        #expect(head >= 121, "thread/started and 120 settings changes at least (a retried change may land twice)")
        #expect(stored.map(\.number) == Array(1...head), "the stored events are numbered without gap or repeat across the failover")
        #expect(head > killedAfter + 20, "the survivors went on numbering after the kill: \(killedAfter) then up to \(head)")
        #expect(heard == stored, "heard \(heard.count) events over \(connections) connections; stored \(stored.count)")
    }
}

@Suite("threadwire watch resumes (real binaries)", .timeLimit(.minutes(2)))
struct WatchResumeTests {
    @Test("threadwire watch survives a restart of the server: after it, every change is printed once, in order, with none lost while the server was down")
    func watchAcrossRestart() async throws {
        let server = try await ServerProcess.launch()
        let port = server.port
        var client = try await server.client()
        let id = try #require(try await client.startThread().thread?.id)
        let out = Pipe()
        let watch = Process()
        watch.executableURL = URL(fileURLWithPath: CLIServerRequestTests.cli)
        watch.arguments = ["watch", "--server", "127.0.0.1:\(port)", id]
        watch.standardOutput = out
        watch.standardError = FileHandle.nullDevice
        try watch.run()
        defer { watch.terminate() }
        let lines = LineCollector(out.fileHandleForReading)
        try await waitUntil("watch is subscribed") {
            _ = try await client.updateSettings(Wire.ThreadSettingsUpdateParams(threadId: id, model: "probe-\(UUID())"))
            return lines.count > 0 ? true : nil
        }
        for n in 0..<10 { _ = try await client.updateSettings(Wire.ThreadSettingsUpdateParams(threadId: id, model: "before-\(n)")) }
        await server.stop()
        try await server.restart(environment: [:], port: port)
        client = try await server.client()
        // Changed at once after the restart, before watch has reconnected.
        for n in 0..<10 { _ = try await client.updateSettings(Wire.ThreadSettingsUpdateParams(threadId: id, model: "after-\(n)")) }
        let head = try #require(try await client.read(id, turns: false).thread?.threadSequence)
        let printed = try await waitUntil("watch printed event \(head)", timeout: .seconds(20)) { () -> [UInt64]? in
            let numbers = lines.all.compactMap { line -> UInt64? in
                guard let data = line.data(using: .utf8), let object = try? JSONSerialization.jsonObject(with: data) as? [String: Any] else { return nil }
                return (object["thread_sequence"] as? NSNumber)?.uint64Value ?? (object["thread_sequence"] as? String).flatMap(UInt64.init)
            }
            return numbers.last == head ? numbers : nil
        }
        let first = try #require(printed.first)
        #expect(printed == Array(first...head), "each change once, in order, across the restart: \(printed)")
        #expect(lines.all.contains { $0.contains("after-0") } && lines.all.contains { $0.contains("before-9") })
    }
}

/// Lines a process writes, read off the test pool.
final class LineCollector: Sendable {
    private let lines = Mutex<[String]>([])
    init(_ handle: FileHandle) {
        Thread.detachNewThread { [self] in
            var buffer = Data()
            while true {
                let chunk = handle.availableData
                if chunk.isEmpty { return }
                buffer.append(chunk)
                while let newline = buffer.firstIndex(of: 0x0A) {
                    let line = String(decoding: buffer[buffer.startIndex..<newline], as: UTF8.self)
                    buffer.removeSubrange(buffer.startIndex...newline)
                    lines.withLock { $0.append(line) }
                }
            }
        }
    }
    var all: [String] { lines.withLock { $0 } }
    var count: Int { lines.withLock { $0.count } }
}
