import Foundation
import Testing
import ThreadwireServerTesting
import ThreadwireClient
import ThreadwireNIO
import ThreadwireWire

/// The wire protocol against the real server binary over TCP.
@Suite("protocol (real server)", .timeLimit(.minutes(2)))
struct ProtocolTests {
    @Test("initialize reports the server and its limits; health/check answers SERVING")
    func initializeAndHealth() async throws {
        let server = try await InProcessServer.launch()
        let client = try await server.client(initialize: false)
        guard case let .healthCheck(health) = try await client.result(.healthCheck(.init())) else { throw TestTimeout(description: "no health") }
        #expect(health.status == .serving)
        let info = try await client.initialize()
        #expect(info.serverInfo?.name == "threadwire")
        #expect(info.protocolVersion == 1)
        #expect(info.limits?.maxFrameBytes == UInt32(4_194_304))
        await client.close()
    }

    @Test("reflection/descriptors before initialize returns the compiled contract and every wire name")
    func reflection() async throws {
        let server = try await InProcessServer.launch()
        let client = try await server.client(initialize: false)
        guard case let .reflectionDescriptors(schema) = try await client.result(.reflectionDescriptors(.init())) else {
            throw TestTimeout(description: "no reflection result")
        }
        #expect(schema.fileDescriptorSet == WireSchema.fileDescriptorSet)
        // A FileDescriptorSet opens with its first `file` (field 1, length-delimited).
        #expect(schema.fileDescriptorSet?.first == 0x0A)
        #expect(schema.envelopeType == "threadwire.v1.Envelope")
        #expect(schema.protocolVersion == 1)
        let methods = Dictionary(uniqueKeysWithValues: schema.methods.map { ($0.field ?? "", $0) })
        #expect(Set(methods.keys) == Set(Wire.Request.Params.fieldNames))
        #expect(methods["thread_settings_update"]?.name == "thread/settings/update")
        #expect(methods["mcp_server_list"]?.name == "mcp_server/list")
        #expect(methods["turn_start"]?.paramsType == "threadwire.v1.TurnStartParams")
        #expect(methods["turn_start"]?.resultType == "threadwire.v1.TurnStartResult")
        #expect(Set(schema.notifications.compactMap(\.field)) == Set(Wire.Notification.Payload.fieldNames))
        #expect(schema.notifications.allSatisfy { $0.resultType == nil })
        #expect(schema.serverRequests.map(\.name) == ["item/tool/call", "item/tool/request_approval", "item/tool/request_user_input"])
        // Every reflected method is one the server dispatches: none is UNIMPLEMENTED.
        let fresh = try await server.client()
        for method in schema.methods {
            guard let field = method.field, let params = try Wire.Request.Params.fromJSON(fieldName: field, .object([]), path: "") else {
                Issue.record("\(method.field ?? "?") has no params case"); continue
            }
            let response = try await fresh.call(params)
            #expect(response.code != 12, "\(method.name ?? "?") is not served: \(response.message ?? "")")
        }
        await client.close()
        await fresh.close()
    }

    @Test("threadwire call --reflect builds requests and reads results from the server's schema alone")
    func callThroughReflection() async throws {
        let server = try await ServerProcess.launch()
        defer { server.stopInBackground() }
        let address = "127.0.0.1:\(server.port)"
        let (status, started) = try await runCLI(["call", "--reflect", "--server", address, "thread/start",
                                                  "--json", #"{"multi_agent_mode": "MULTI_AGENT_MODE_PROACTIVE", "name": "reflected"}"#])
        #expect(status == 0)
        let result = try JSONValue.parse(started)
        #expect(result["multi_agent_mode"] == .string("MULTI_AGENT_MODE_PROACTIVE"))
        guard case let .string(threadID)? = result["thread"]?["id"] else { Issue.record("no thread id in \(started)"); return }
        // The same read through the compiled contract and through reflection.
        let (_, compiled) = try await runCLI(["call", "--server", address, "thread/read", "--json", #"{"thread_id": "\#(threadID)"}"#])
        let (readStatus, reflected) = try await runCLI(["call", "--reflect", "--server", address, "thread/read", "--json", #"{"thread_id": "\#(threadID)"}"#])
        #expect(readStatus == 0)
        #expect(try JSONValue.parse(reflected)["thread"]?["name"] == .string("reflected"))
        #expect(try JSONValue.parse(reflected)["thread"]?["id"] == JSONValue.parse(compiled)["thread"]?["id"])
        // Errors keep their status code; a method the server lacks names what it has.
        let (missing, _) = try await runCLI(["call", "--reflect", "--server", address, "thread/read", "--json", #"{"thread_id": "nope"}"#])
        #expect(missing == 1)
        let (unknown, _) = try await runCLI(["call", "--server", address, "thread/explode"])
        #expect(unknown != 0)
        // Before initialize too.
        let (healthStatus, health) = try await runCLI(["call", "--reflect", "--server", address, "health/check"])
        #expect(healthStatus == 0 && health.contains("SERVING_STATUS_SERVING"))
    }

    @Test("any method but health/check before initialize is FAILED_PRECONDITION; a second initialize too")
    func handshakeFirst() async throws {
        let server = try await InProcessServer.launch()
        let client = try await server.client(initialize: false)
        await expectStatus(9, mentioning: "initialize") { _ = try await client.startThread() }
        try await client.initialize()
        await expectStatus(9, mentioning: "already") { try await client.initialize() }
        _ = try await client.startThread()
    }

    @Test("initialize needs a client name and a supported protocol version")
    func initializeValidation() async throws {
        let server = try await InProcessServer.launch()
        let client = try await server.client(initialize: false)
        await expectStatus(3, mentioning: "client_info.name") {
            _ = try await client.result(.initialize(Wire.InitializeParams(protocolVersion: 1)))
        }
        await expectStatus(9, mentioning: "protocol_version 7") {
            _ = try await client.result(.initialize(Wire.InitializeParams(clientInfo: .init(name: "x"), protocolVersion: 7)))
        }
    }

    @Test("a method this server does not know gets UNIMPLEMENTED with its id")
    func unknownMethod() async throws {
        let server = try await InProcessServer.launch()
        let client = try await server.client()
        // Envelope{request{id: 7, field 99: {}}}: a newer client's method.
        try await client.sendRaw(Framing.frame([0x0A, 0x05, 0x08, 0x07, 0x9A, 0x06, 0x00]))
        var unmatched = client.unmatchedResponses.makeAsyncIterator()
        let response = try #require(await unmatched.next())
        #expect(response.id == 7)
        #expect(response.code == 12)
        #expect(response.message?.contains("no method") == true)
    }

    @Test("an undecodable payload gets INVALID_ARGUMENT and the connection stays usable")
    func malformedPayload() async throws {
        let server = try await InProcessServer.launch()
        let client = try await server.client()
        try await client.sendRaw(Framing.frame([0x0A, 0xFF, 0xFF, 0x01]))
        var unmatched = client.unmatchedResponses.makeAsyncIterator()
        let response = try #require(await unmatched.next())
        #expect(response.code == 3)
        #expect(response.message?.contains("could not decode threadwire.v1.Envelope") == true)
        _ = try await client.startThread()  // same connection, still fine
    }

    @Test("invalid UTF-8 in a string field is INVALID_ARGUMENT naming the field")
    func invalidUTF8() async throws {
        let server = try await InProcessServer.launch()
        let client = try await server.client()
        // Envelope{request{id:3, thread_start{model: FF FE}}}
        let params: [UInt8] = [0x0A, 0x02, 0xFF, 0xFE]
        let request: [UInt8] = [0x08, 0x03, 0xA2, 0x01, UInt8(params.count)] + params
        try await client.sendRaw(Framing.frame([0x0A, UInt8(request.count)] + request))
        var unmatched = client.unmatchedResponses.makeAsyncIterator()
        let response = try #require(await unmatched.next())
        #expect(response.code == 3)
        #expect(response.message?.contains("thread_start.model") == true)
    }

    @Test("undefined flag bits get an error frame, then the connection closes; other clients are unaffected")
    func badFlags() async throws {
        let server = try await InProcessServer.launch()
        let bystander = try await server.client()
        let client = try await server.client()
        try await client.sendRaw([0x01, 0, 0, 0, 2, 0x08, 0x01])
        var unmatched = client.unmatchedResponses.makeAsyncIterator()
        let response = try #require(await unmatched.next())
        #expect(response.code == 3)
        #expect(response.message?.contains("flags") == true)
        await client.waitUntilClosed()
        #expect(!client.isActive)
        _ = try await bystander.startThread()
    }

    @Test("a length over the limit gets RESOURCE_EXHAUSTED from the header alone, then a close")
    func oversize() async throws {
        let server = try await InProcessServer.launch(arguments: ["--max-frame-bytes", "1024"])
        let client = try await server.client()
        try await client.sendRaw([0x00, 0x7F, 0xFF, 0xFF, 0xFF])  // no payload follows
        var unmatched = client.unmatchedResponses.makeAsyncIterator()
        let response = try #require(await unmatched.next())
        #expect(response.code == 8)
        #expect(response.message?.contains("exceeds the maximum of 1024") == true)
        await client.waitUntilClosed()
    }

    @Test("a client that never initializes is closed after the handshake timeout")
    func handshakeTimeout() async throws {
        let server = try await InProcessServer.launch(arguments: ["--handshake-timeout-ms", "4000"])
        // Before the connection is opened: under load, opening it took over
        // a second of the server's 4 s once.
        let opened = ContinuousClock.now
        let idle = try await server.client(initialize: false)
        await idle.waitUntilClosed()
        #expect(!idle.isActive)
        #expect(ContinuousClock.now - opened > .seconds(3), "closed by the handshake timeout, not earlier")
        // An initialized connection outlives its own handshake deadline. It is
        // opened only now, so its 4 s fall after the busiest first seconds of a
        // full test run (opened at the start, it was once closed there).
        let ready = try await server.client()
        try await Task.sleep(for: .seconds(4.5))
        _ = try await ready.startThread()
    }

    @Test("pipelined requests each get exactly one response with their id")
    func pipelining() async throws {
        let server = try await InProcessServer.launch()
        let client = try await server.client()
        let responses = try await withThrowingTaskGroup(of: Wire.Response.self) { group in
            for _ in 0..<64 { group.addTask { try await client.call(.healthCheck(.init())) } }
            var all: [Wire.Response] = []
            for try await response in group { all.append(response) }
            return all
        }
        #expect(responses.count == 64)
        #expect(Set(responses.compactMap(\.id)).count == 64)
        #expect(responses.allSatisfy { $0.code == 0 })
    }

    @Test("random and mutated frames never crash the server or disturb other connections")
    func randomFrames() async throws {
        let server = try await InProcessServer.launch()
        let bystander = try await server.client()
        let thread = try #require(try await bystander.startThread().thread?.id)
        var generator = SystemRandomNumberGenerator()
        let seeds: [[UInt8]] = [
            Wire.Envelope(kind: .request(Wire.Request(id: 5, params: .turnStart(Wire.TurnStartParams(threadId: thread, input: [Wire.UserInput(content: .text("x"))]))))).serializedBytes(),
            Wire.Envelope(kind: .request(Wire.Request(id: 6, params: .threadSettingsUpdate(Wire.ThreadSettingsUpdateParams(threadId: thread, multiAgentModeUpdate: .multiAgentMode(.proactive)))))).serializedBytes(),
        ]
        for round in 0..<4 {
            let attacker = try await server.client(initialize: round % 2 == 0)
            var stream: [UInt8] = []
            for n in 0..<150 {
                var payload: [UInt8]
                if n % 2 == 0 {
                    payload = (0..<Int.random(in: 0...40, using: &generator)).map { _ in UInt8.random(in: 0...255, using: &generator) }
                } else {
                    payload = seeds[n % seeds.count]
                    for _ in 0..<3 { payload[Int.random(in: 0..<payload.count, using: &generator)] = UInt8.random(in: 0...255, using: &generator) }
                }
                stream += Framing.frame(payload)
            }
            try await attacker.sendRaw(stream)
            // Every frame was well framed, so the connection survives and still answers
            // (a mutated frame may carry the same id, so only liveness is checked here).
            _ = try await attacker.call(.healthCheck(.init()))
            #expect(attacker.isActive)
            await attacker.close()
            let fresh = try await server.client(initialize: false)
            #expect(try await fresh.call(.healthCheck(.init())).code == 0)
            await fresh.close()
        }
        #expect(try await bystander.read(thread).thread?.id == thread)
        _ = try await bystander.startThread()
    }

    @Test("SIGTERM stops the server cleanly")
    func sigterm() async throws {
        let server = try await ServerProcess.launch()
        let client = try await server.client()
        _ = try await client.startThread()
        #expect(await server.stop() == 0, "exit status 0 after SIGTERM")
        #expect(server.process == nil)
    }
}
