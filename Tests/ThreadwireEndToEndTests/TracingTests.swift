import Foundation
import Synchronization
import Testing
import ThreadwireServerTesting
import ThreadwireClient
import ThreadwireWire

/// OpenTelemetry traces of the real server, exported over OTLP/HTTP to a real
/// receiver (integration/tracing/otlp_receiver.py, decoding with PyPI's
/// opentelemetry-proto), and the JSON logs that join them.
@Suite("traced with OpenTelemetry (real OTLP/HTTP receiver)", .timeLimit(.minutes(4)),
       .enabled(if: OTLPReceiver.python != nil, "opentelemetry-proto is not in .build/venv (make py-deps installs it)"))
struct TracingTests {
    static let traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
    static let parentSpan = "00f067aa0ba902b7"
    static var traceparent: [Wire.KeyValue] { [Wire.KeyValue(key: "traceparent", value: "00-\(traceID)-\(parentSpan)-01")] }

    static func environment(_ receiver: OTLPReceiver, service: String = "threadwire", sampler: String? = nil,
                            samplerArgument: String? = nil) -> [String: String] {
        var environment = ["OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:\(receiver.port)", "OTEL_BSP_SCHEDULE_DELAY": "100",
                           "OTEL_SERVICE_NAME": service]
        environment["OTEL_TRACES_SAMPLER"] = sampler
        environment["OTEL_TRACES_SAMPLER_ARG"] = samplerArgument
        return environment
    }

    @Test("a request with a traceparent continues the caller's trace (request, engine command, store commit); the notifications it causes carry the trace id; JSON log lines carry it too")
    func continuesTheCallersTrace() async throws {
        let receiver = try await OTLPReceiver.start()
        defer { receiver.stop() }
        let server = try await ServerProcess.launch(arguments: ["--log-format", "json", "--log-level", "debug"],
                                                    environment: Self.environment(receiver))
        defer { server.stopInBackground() }
        let writer = try await server.client()
        let watcher = try await server.client()
        let thread = try #require(try await writer.startThread().thread?.id)
        _ = try await watcher.resume(thread)
        let metadata = Mutex<[Wire.KeyValue]?>(nil)
        let watching = Task {
            for await notification in watcher.notifications {
                if case let .threadSettingsUpdated(update) = notification.payload, update.settings?.model == "traced" {
                    metadata.withLock { $0 = notification.metadata }
                    return
                }
            }
        }
        let response = try await writer.call(.threadSettingsUpdate(Wire.ThreadSettingsUpdateParams(threadId: thread, model: "traced")),
                                             metadata: Self.traceparent)
        #expect(response.code ?? 0 == 0)
        try await waitUntil("the watcher heard thread/settings/updated") { metadata.withLock { $0 } != nil }
        watching.cancel()
        let heard = metadata.withLock { $0 } ?? []
        #expect(heard.first { $0.key == "trace_id" }?.value == Self.traceID, "the notification names the request's trace: \(heard)")
        #expect(heard.first { $0.key == "traceparent" }?.value?.contains(Self.traceID) == true)

        let spans = try await receiver.waitForSpans(trace: Self.traceID, named: ["thread/settings/update", "engine thread/settings/update", "store.commit"])
        let request = try #require(spans.first { $0.name == "thread/settings/update" })
        #expect(request.parentSpanID == Self.parentSpan, "the server span is a child of the caller's span")
        #expect(request.kind == 2, "SPAN_KIND_SERVER")
        #expect(request.attributes["rpc.method"] == "thread/settings/update")
        #expect(request.attributes["threadwire.thread.id"] == thread)
        #expect(request.attributes["enduser.id"] == "default")
        #expect(request.attributes["rpc.threadwire.status_code"] == "0")
        let engine = try #require(spans.first { $0.name == "engine thread/settings/update" })
        #expect(engine.parentSpanID == request.spanID)
        let commit = try #require(spans.first { $0.name == "store.commit" })
        #expect(commit.parentSpanID == engine.spanID)
        #expect(commit.attributes["db.system"] == "sqlite")

        // A request without a traceparent starts a trace of its own.
        _ = try await writer.updateSettings(Wire.ThreadSettingsUpdateParams(threadId: thread, model: "untraced"))
        let fresh = try await receiver.waitFor { spans in
            spans.contains { $0.name == "thread/settings/update" && $0.traceID != Self.traceID && $0.parentSpanID.isEmpty }
        }
        #expect(fresh)

        // The JSON log: every line an object; the request's line carries its trace.
        let log = try String(contentsOfFile: server.stderrPath, encoding: .utf8)
        let lines = log.split(separator: "\n").filter { !$0.isEmpty }
        #expect(!lines.isEmpty)
        var traced = false
        for line in lines {
            guard let object = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any] else {
                Issue.record("a log line that is not a JSON object: \(line)")
                continue
            }
            #expect(object["level"] is String && object["message"] is String && object["time"] is String)
            if object["message"] as? String == "request", object["tw.method"] as? String == "thread/settings/update",
               object["trace_id"] as? String == Self.traceID {
                #expect(object["span_id"] as? String == request.spanID)
                #expect(object["thread_id"] as? String == thread)
                #expect(object["request_id"] != nil)
                traced = true
            }
        }
        #expect(traced, "a JSON log line of the traced request carries its trace and span ids")
    }

    @Test("a turn's spans: the turn, each model call (provider, model, tokens, time to first token) and its client tool call, in the trace of the turn/start that began it")
    func turnSpans() async throws {
        let receiver = try await OTLPReceiver.start()
        defer { receiver.stop() }
        let server = try await ServerProcess.launch(environment: Self.environment(receiver))
        defer { server.stopInBackground() }
        let client = try await server.capableClient()
        _ = client.serveClientTools { _, _ in Wire.ToolCallResult(output: "file contents") }
        let thread = try #require(try await client.startThread(ClientToolTests.startParams()).thread?.id)
        let response = try await client.call(.turnStart(Wire.TurnStartParams(
            threadId: thread, input: [Wire.UserInput(content: .text("#tool read_file {\"path\":\"a\"}\nread it"))])), metadata: Self.traceparent)
        #expect(response.code ?? 0 == 0)
        let spans = try await receiver.waitForSpans(trace: Self.traceID, named: ["turn/start", "turn", "tool read_file"], models: 2)
        let turn = try #require(spans.first { $0.name == "turn" })
        let models = spans.filter { $0.name.hasPrefix("model ") }
        #expect(models.count == 2, "two model calls: the tool call, then the answer")
        for model in models {
            #expect(model.parentSpanID == turn.spanID)
            #expect(model.attributes["gen_ai.system"] == "scripted-echo")
            #expect(model.attributes["gen_ai.usage.input_tokens"] != nil)
            #expect(model.attributes["threadwire.model.time_to_first_token_ms"] != nil)
            #expect(model.attributes["threadwire.model.retries"] == "0")
        }
        let tool = try #require(spans.first { $0.name == "tool read_file" })
        #expect(tool.parentSpanID == turn.spanID)
        #expect(tool.attributes["threadwire.tool.source"] == "client")
        #expect(spans.allSatisfy { $0.traceID == Self.traceID })
    }

    @Test("a request relayed to the thread's owner is one trace across both instances: the relay hop's span is the parent of the owner's server span")
    func relayedOneTrace() async throws {
        let receiver = try await OTLPReceiver.start()
        defer { receiver.stop() }
        // Traces the instances start are not recorded: the relay must carry
        // "not sampled" to the owner, and the caller's "sampled" through.
        let group = try await InstanceGroup.start(2) { index in
            Self.environment(receiver, service: "threadwire-\(index)", sampler: "parentbased_always_off")
        }
        defer { group.stopAll() }
        let owner = try await group.instances[0].client()
        let thread = try #require(try await owner.startThread().thread?.id)
        let elsewhere = try await group.instances[1].client()
        let unrecorded = try await elsewhere.call(.threadSettingsUpdate(Wire.ThreadSettingsUpdateParams(threadId: thread, model: "unrecorded")))
        #expect(unrecorded.code ?? 0 == 0)
        let response = try await elsewhere.call(.threadSettingsUpdate(Wire.ThreadSettingsUpdateParams(threadId: thread, model: "relayed")),
                                                metadata: Self.traceparent)
        #expect(response.code ?? 0 == 0)
        let spans = try await receiver.waitForSpans(trace: Self.traceID, named: ["relay thread/settings/update", "store.commit"], requests: 2)
        let requests = spans.filter { $0.name == "thread/settings/update" }
        let entry = try #require(requests.first { $0.parentSpanID == Self.parentSpan })
        let relay = try #require(spans.first { $0.name == "relay thread/settings/update" })
        #expect(relay.parentSpanID == entry.spanID)
        #expect(relay.kind == 3, "SPAN_KIND_CLIENT")
        let owned = try #require(requests.first { $0.parentSpanID == relay.spanID }, "the owner's server span is the relay's child")
        #expect(owned.attributes["threadwire.relayed"] == "true")
        let commit = try #require(spans.first { $0.name == "store.commit" })
        #expect(commit.attributes["db.system"] == "postgresql")
        // Each instance exported its own spans of the one trace.
        #expect(entry.service == "threadwire-1" && relay.service == "threadwire-1")
        #expect(owned.service == "threadwire-0" && commit.service == "threadwire-0")
        // Each instance exports in order, so the unrecorded request's spans would be in by now.
        #expect(Set(receiver.spans().map(\.traceID)) == [Self.traceID], "the unsampled relayed request was recorded by neither instance")
    }

    static func randomTraceID() -> String {
        String((0..<32).map { _ in "0123456789abcdef".randomElement()! })
    }

    @Test("head sampling at parentbased_traceidratio 0.5: about half the traces this instance starts are recorded (once sampled, not a quarter); every caller-sampled request is recorded")
    func rootRatio() async throws {
        let receiver = try await OTLPReceiver.start()
        defer { receiver.stop() }
        let server = try await ServerProcess.launch(
            environment: Self.environment(receiver, sampler: "parentbased_traceidratio", samplerArgument: "0.5"))
        defer { server.stopInBackground() }
        let client = try await server.client()
        let thread = try #require(try await client.startThread().thread?.id)
        let roots = 400
        for index in 0..<roots {
            _ = try await client.updateSettings(Wire.ThreadSettingsUpdateParams(threadId: thread, model: "root-\(index)"))
        }
        var callers: [String] = []
        for index in 0..<20 {
            let trace = Self.randomTraceID()
            callers.append(trace)
            let response = try await client.call(.threadSettingsUpdate(Wire.ThreadSettingsUpdateParams(threadId: thread, model: "caller-\(index)")),
                                                 metadata: [Wire.KeyValue(key: "traceparent", value: "00-\(trace)-\(Self.parentSpan)-01")])
            #expect(response.code ?? 0 == 0)
        }
        // One exporter, batches in order: once the last caller's spans are in, all earlier ones are.
        _ = try await receiver.waitForSpans(trace: callers.last!, named: ["thread/settings/update", "store.commit"])
        let spans = receiver.spans()
        let recordedRoots = Set(spans.filter { $0.name == "thread/settings/update" && $0.parentSpanID.isEmpty }.map(\.traceID)).count
        // Binomial(400, 0.5): 200 ± 10; sampling twice would give 100 ± 9.
        #expect((150...250).contains(recordedRoots), "\(recordedRoots) of \(roots) root traces recorded at 0.5")
        let recordedCallers = Set(spans.filter { $0.name == "thread/settings/update" && $0.parentSpanID == Self.parentSpan }.map(\.traceID))
        #expect(recordedCallers == Set(callers), "parent-based: every request whose caller sampled it is recorded")
    }

    @Test("parentbased_always_off: traces this instance starts and callers' unsampled traces are not recorded, yet their notifications and log lines carry W3C trace ids flagged not sampled (the caller's when there is one)")
    func unsampledStillCarryIDs() async throws {
        let receiver = try await OTLPReceiver.start()
        defer { receiver.stop() }
        let server = try await ServerProcess.launch(arguments: ["--log-format", "json", "--log-level", "debug"],
                                                    environment: Self.environment(receiver, sampler: "parentbased_always_off"))
        defer { server.stopInBackground() }
        let writer = try await server.client()
        let watcher = try await server.client()
        let thread = try #require(try await writer.startThread().thread?.id)
        _ = try await watcher.resume(thread)
        // Every thread/settings/updated the watcher hears, by the model it set.
        let heard = Mutex<[String: [Wire.KeyValue]]>([:])
        let watching = Task {
            for await notification in watcher.notifications {
                if case let .threadSettingsUpdated(update) = notification.payload, let model = update.settings?.model {
                    heard.withLock { $0[model] = notification.metadata }
                }
            }
        }
        defer { watching.cancel() }
        for index in 0..<20 {
            _ = try await writer.updateSettings(Wire.ThreadSettingsUpdateParams(threadId: thread, model: "root-\(index)"))
        }
        let unsampledCaller = Self.randomTraceID()
        _ = try await writer.call(.threadSettingsUpdate(Wire.ThreadSettingsUpdateParams(threadId: thread, model: "caller-unsampled")),
                                  metadata: [Wire.KeyValue(key: "traceparent", value: "00-\(unsampledCaller)-\(Self.parentSpan)-00")])
        let sampledCaller = Self.randomTraceID()
        _ = try await writer.call(.threadSettingsUpdate(Wire.ThreadSettingsUpdateParams(threadId: thread, model: "caller-sampled")),
                                  metadata: [Wire.KeyValue(key: "traceparent", value: "00-\(sampledCaller)-\(Self.parentSpan)-01")])
        try await waitUntil("the watcher heard all 22 updates") { heard.withLock { $0.count } >= 22 }
        let notifications = heard.withLock { $0 }

        var rootTraces = Set<String>()
        for index in 0..<20 {
            let metadata = notifications["root-\(index)"] ?? []
            let parent = metadata.first { $0.key == "traceparent" }?.value ?? ""
            let fields = parent.split(separator: "-")
            #expect(fields.count == 4 && fields[0] == "00" && fields[1].count == 32 && fields[2].count == 16 && fields[3] == "00",
                    "an unrecorded root still has a W3C context, flagged not sampled: \(parent)")
            #expect(fields[1] != String(repeating: "0", count: 32) && fields[1].allSatisfy(\.isHexDigit))
            let traceID = metadata.first { $0.key == "trace_id" }?.value ?? ""
            #expect(fields.count > 1 && traceID == String(fields[1]))
            rootTraces.insert(traceID)
        }
        #expect(rootTraces.count == 20, "each root request has a trace of its own")
        let fromCaller = notifications["caller-unsampled"] ?? []
        #expect(fromCaller.first { $0.key == "trace_id" }?.value == unsampledCaller, "the caller's unsampled trace id is kept: \(fromCaller)")
        #expect(fromCaller.first { $0.key == "traceparent" }?.value?.hasSuffix("-00") == true)
        #expect(notifications["caller-sampled"]?.first { $0.key == "traceparent" }?.value?.hasSuffix("-01") == true)

        // Only the sampled caller's trace was exported.
        _ = try await receiver.waitForSpans(trace: sampledCaller, named: ["thread/settings/update", "engine thread/settings/update", "store.commit"])
        let exported = Set(receiver.spans().map(\.traceID))
        #expect(exported == [sampledCaller], "nothing but the sampled caller's trace is recorded: \(exported.count) traces")

        // The log lines of unrecorded requests carry their trace ids too.
        let log = try String(contentsOfFile: server.stderrPath, encoding: .utf8)
        var logged = Set<String>()
        for line in log.split(separator: "\n") {
            guard let object = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any],
                  object["message"] as? String == "request", object["tw.method"] as? String == "thread/settings/update",
                  let trace = object["trace_id"] as? String else { continue }
            logged.insert(trace)
        }
        #expect(rootTraces.union([unsampledCaller, sampledCaller]).isSubset(of: logged), "every request's log line names its trace")
    }

    @Test("a collector that is down: requests are served as before, and the spans that could not be exported are counted in /metrics")
    func collectorDown() async throws {
        let closedPort = try freePort()
        let server = try await ServerProcess.launch(
            arguments: ["--admin-listen", "127.0.0.1:0"],
            environment: ["OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:\(closedPort)", "OTEL_BSP_SCHEDULE_DELAY": "100",
                          "OTEL_EXPORTER_OTLP_TIMEOUT": "500"])
        defer { server.stopInBackground() }
        let client = try await server.client()
        let thread = try #require(try await client.startThread().thread?.id)
        for index in 0..<200 {
            _ = try await client.updateSettings(Wire.ThreadSettingsUpdateParams(threadId: thread, model: "m\(index)"))
        }
        var dropped = 0.0
        let deadline = ContinuousClock.now + .seconds(60)
        while ContinuousClock.now < deadline {
            let metrics = try await httpGet(port: server.adminPort, path: "/metrics").body
            dropped = metrics.split(separator: "\n").first { $0.hasPrefix("threadwire_trace_spans_dropped_total ") }
                .flatMap { Double($0.split(separator: " ").last ?? "") } ?? 0
            if dropped > 0 { break }
            try await Task.sleep(for: .milliseconds(200))
        }
        #expect(dropped > 0, "spans that could not be exported are counted")
        #expect(try await client.read(thread, turns: false).settings?.model == "m199", "serving went on")
    }

    func waitUntil(_ what: String, within limit: Duration = .seconds(20), _ condition: () -> Bool) async throws {
        let deadline = ContinuousClock.now + limit
        while !condition() {
            guard ContinuousClock.now < deadline else {
                Issue.record("timed out waiting until \(what)")
                throw TestTimeout(description: what)
            }
            try await Task.sleep(for: .milliseconds(20))
        }
    }
}

/// integration/tracing/otlp_receiver.py as a process: the spans it received, one JSON object a line.
final class OTLPReceiver: @unchecked Sendable {
    struct ReceivedSpan: Sendable {
        var service: String
        var traceID: String
        var spanID: String
        var parentSpanID: String
        var name: String
        var kind: Int
        var attributes: [String: String]
    }

    let port: Int
    private let process: Process
    private let directory: String
    private var spansPath: String { directory + "/spans.jsonl" }

    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

    static let python: String? = {
        let python = root.appendingPathComponent(".build/venv/bin/python").path
        guard FileManager.default.isExecutableFile(atPath: python) else { return nil }
        let lib = root.appendingPathComponent(".build/venv/lib").path
        let versions = (try? FileManager.default.contentsOfDirectory(atPath: lib)) ?? []
        let installed = versions.contains { FileManager.default.fileExists(atPath: "\(lib)/\($0)/site-packages/opentelemetry/proto") }
        return installed ? python : nil
    }()

    /// Started off the test's pool: its start polls for the bound port.
    static func start(delayMs: Int = 0) async throws -> OTLPReceiver {
        try await offThread { try OTLPReceiver(delayMs: delayMs) }
    }

    private init(delayMs: Int = 0) throws {
        guard let python = Self.python else { throw ServerProcessError.unexpectedOutput("no python with opentelemetry-proto") }
        directory = NSTemporaryDirectory() + "threadwire-otlp-" + UUID().uuidString
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        process = Process()
        process.executableURL = URL(fileURLWithPath: python)
        process.arguments = [Self.root.appendingPathComponent("integration/tracing/otlp_receiver.py").path, directory + "/spans.jsonl",
                             directory + "/port"] + (delayMs > 0 ? ["--delay-ms", "\(delayMs)"] : [])
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        try process.run()
        let deadline = Date().addingTimeInterval(30)
        var bound: Int?
        while bound == nil, Date() < deadline {
            bound = (try? String(contentsOfFile: directory + "/port", encoding: .utf8)).flatMap { Int($0) }
            if bound == nil { Thread.sleep(forTimeInterval: 0.05) }
        }
        guard let bound else {
            kill(process.processIdentifier, SIGKILL)
            throw ServerProcessError.unexpectedOutput("the OTLP receiver did not start")
        }
        port = bound
    }

    func spans() -> [ReceivedSpan] {
        guard let text = try? String(contentsOfFile: spansPath, encoding: .utf8) else { return [] }
        return text.split(separator: "\n").compactMap { line -> ReceivedSpan? in
            guard let object = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any] else { return nil }
            let attributes = object["attributes"] as? [String: String] ?? [:]
            return ReceivedSpan(service: object["service"] as? String ?? "", traceID: object["trace_id"] as? String ?? "",
                                spanID: object["span_id"] as? String ?? "", parentSpanID: object["parent_span_id"] as? String ?? "",
                                name: object["name"] as? String ?? "", kind: object["kind"] as? Int ?? 0, attributes: attributes)
        }
    }

    /// The spans of `trace` once every name in `named` arrived (and at least
    /// `models` model spans and `requests` spans of the request's method).
    func waitForSpans(trace: String, named: Set<String>, models: Int = 0, requests: Int = 0,
                      within limit: Duration = .seconds(30)) async throws -> [ReceivedSpan] {
        let deadline = ContinuousClock.now + limit
        while true {
            let spans = spans().filter { $0.traceID == trace }
            let names = Set(spans.map(\.name))
            let requestSpans = spans.filter { $0.kind == 2 }.count
            if named.isSubset(of: names), spans.filter({ $0.name.hasPrefix("model ") }).count >= models, requestSpans >= requests {
                return spans
            }
            guard ContinuousClock.now < deadline else {
                Issue.record("spans of trace \(trace) named \(named.subtracting(names).sorted()) did not arrive; got \(spans.map(\.name))")
                throw TestTimeout(description: "spans")
            }
            try await Task.sleep(for: .milliseconds(100))
        }
    }

    func waitFor(within limit: Duration = .seconds(30), _ condition: ([ReceivedSpan]) -> Bool) async throws -> Bool {
        let deadline = ContinuousClock.now + limit
        while ContinuousClock.now < deadline {
            if condition(spans()) { return true }
            try await Task.sleep(for: .milliseconds(100))
        }
        return false
    }

    func stop() {
        // SIGKILL: the test process blocks SIGTERM and its children inherit the mask.
        if process.isRunning {
            kill(process.processIdentifier, SIGKILL)
            // Not Process.waitUntilExit: it spins a run loop and has hung the
            // whole suite here. SIGKILL cannot be ignored; the reaping is Foundation's.
            let deadline = Date().addingTimeInterval(5)
            while process.isRunning && Date() < deadline { usleep(5_000) }
        }
        try? FileManager.default.removeItem(atPath: directory)
    }
}
