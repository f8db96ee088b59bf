import Foundation
#if canImport(Glibc)
import Glibc
#endif
import Testing
import ThreadwireServerTesting
import ThreadwireClient
import ThreadwireTransport
import ThreadwireWire

/// The in-process transport and the server's life as services, on the real
/// server composed from its flags (`InProcessServer`).
@Suite("transport and services (in process)", .timeLimit(.minutes(2)))
struct TransportTests {
    @Test("an in-process transport takes no connection before it listens or after it stops, and says why")
    func refusesOutsideItsLife() async throws {
        let transport = InProcessTransport()
        await #expect(throws: InProcessTransportError.notAccepting) { _ = try await transport.connect() }
        let settings = ConnectionSettings(initialMaxFrameBytes: 1024, maxPartialFrameBytes: 4096, outboundHighWaterBytes: 4096)
        _ = try await transport.listen(settings) { _ in }
        await #expect(throws: InProcessTransportError.alreadyListening) { _ = try await transport.listen(settings) { _ in } }
        #expect(transport.isAccepting)
        let socket = try await transport.connect()
        close(socket)
        transport.stopAccepting()
        await transport.waitUntilStopped()
        #expect(!transport.isAccepting)
        do {
            _ = try await transport.connect()
            Issue.record("connected after stopAccepting")
        } catch let error as InProcessTransportError {
            #expect(error == .notAccepting)
            #expect("\(error)".contains("not accepting"))
        }
    }

    @Test("graceful stop drains: a change acknowledged just before it is there after the services start again")
    func stopDrainsAndRestartKeepsChanges() async throws {
        let server = try await InProcessServer.launch()
        let client = try await server.client()
        let id = try #require(try await client.startThread().thread?.id)
        _ = try await client.updateSettings(Wire.ThreadSettingsUpdateParams(threadId: id, model: "kept"))
        #expect(await server.stop() == 0, "every service ended without an error")
        // Stopped: the old connection is closed and no new one is taken.
        await #expect(throws: (any Error).self) { _ = try await client.read(id) }
        await #expect(throws: (any Error).self) { _ = try await server.client() }
        try await server.start()
        let again = try await server.client()
        #expect(try await again.read(id).thread?.model == "kept")
    }

    @Test("in-process and TCP connections get the same frame limits: an oversize length is refused from the header")
    func sameFrameLimits() async throws {
        let server = try await InProcessServer.launch(arguments: ["--max-frame-bytes", "1024"])
        let socket = RawSocket(connected: try await server.connectSocket())
        defer { socket.close() }
        try socket.send(RawSocket.initialize)
        try socket.send([0, 0, 0, 0x10, 0])  // a 1 MiB frame announced
        let (frames, closed) = await socket.readUntilClosed(seconds: 10)
        #expect(closed)
        let refusal = try #require(frames.compactMap(\.response).last)
        #expect(refusal.code == 8, "RESOURCE_EXHAUSTED")
        #expect(refusal.message?.contains("1024") == true, "\(refusal.message ?? "")")
    }
}

