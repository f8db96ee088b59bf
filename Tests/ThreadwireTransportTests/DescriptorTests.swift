import Foundation
#if canImport(Glibc)
import Glibc
#endif
import NIOCore
import NIOEmbedded
import ThreadwireNIO
import Testing
import ThreadwireServerTesting
@testable import ThreadwireTransport
import ThreadwireWire

/// File descriptors as a budget: connections refused before the process runs
/// out (libdispatch kills a process that cannot open one), and the spare
/// that refuses pending connections when something else used them up.
@Suite("file descriptors: the connections' budget and the spare (in process)", .timeLimit(.minutes(2)))
struct DescriptorTests {
    static let refusal = Framing.frame(Wire.Envelope(kind: .response(Wire.Response(
        code: 14, message: "the server is out of file descriptors; try again later"))).serializedBytes())

    static func settings(_ budget: DescriptorBudget) -> ConnectionSettings {
        ConnectionSettings(initialMaxFrameBytes: 1024, maxPartialFrameBytes: 4096, outboundHighWaterBytes: 4096,
                           outOfDescriptorsRefusal: refusal, descriptors: budget)
    }

    @Test("concurrent takers never get past the budget's capacity, and what they give back can be taken again")
    func budgetHoldsUnderConcurrency() async {
        let budget = DescriptorBudget(capacity: 100, reserved: 8, fileLimit: 1024)
        let granted = await withTaskGroup(of: Int.self) { group in
            for _ in 0..<8 {
                group.addTask { (0..<200).reduce(0) { count, _ in count + (budget.take(1) ? 1 : 0) } }
            }
            return await group.reduce(0, +)
        }
        #expect(granted == 100)
        #expect(budget.inUse == 100)
        #expect(!budget.take(1))
        budget.give(2)
        #expect(!budget.take(3), "a take that does not fit takes nothing")
        #expect(budget.take(2))
        #expect(budget.inUse == 100)
        #expect("\(budget.exhausted)".contains("file limit (1024)"))
    }

    @Test("the reserve is a sixteenth of the file limit, from 16 to 64; the measured budget leaves it and what is open now")
    func reserveAndMeasure() {
        #expect(DescriptorBudget.reserve(forLimit: 64) == 16)
        #expect(DescriptorBudget.reserve(forLimit: 1024) == 64)
        #expect(DescriptorBudget.reserve(forLimit: 1 << 20) == 64)
        // Other tests open and close descriptors meanwhile: only bounds hold.
        let measured = DescriptorBudget.measure()
        #expect(DescriptorBudget.openDescriptors() >= 3)
        #expect(measured.fileLimit == DescriptorBudget.softLimit())
        #expect(measured.capacity > 0 && measured.capacity <= measured.fileLimit - measured.reserved - 3, "capacity \(measured.capacity)")
    }

    @Test("the listener's reads are held while its accepted connections fill the budget and the refusals' slack, and resume as they close")
    func acceptGateHoldsReads() throws {
        let budget = DescriptorBudget(capacity: 1, reserved: 8, fileLimit: 64)
        #expect(budget.refusalSlack == 2)
        let listener = EmbeddedChannel()
        let counter = ReadCounter()
        try listener.pipeline.syncOperations.addHandlers([counter, AcceptGate(budget: budget)])
        var children: [EmbeddedChannel] = []
        // What a read of the listener brings: one accepted connection.
        func accept() throws {
            let child = EmbeddedChannel(loop: listener.embeddedEventLoop)
            children.append(child)
            try listener.writeInbound(child as any Channel)
            _ = try listener.readInbound(as: (any Channel).self)
        }
        for accepted in 1...3 {
            listener.read()
            #expect(counter.reads == accepted, "read \(accepted) passes")
            try accept()
        }
        // One served and two being refused: the listener waits.
        listener.read()
        #expect(counter.reads == 3, "held")
        _ = try children[0].finish()
        listener.embeddedEventLoop.run()
        #expect(counter.reads == 4, "resumed once one closed")
        // The resumed read accepts one more: full again.
        try accept()
        listener.read()
        #expect(counter.reads == 4, "held again")
        for child in children.dropFirst() { _ = try child.finish() }
        _ = try listener.finish()
    }

    @Test("over TCP a connection past the budget gets the refusal frame and the end at once; one is served again once a served one closed")
    func tcpRefusesPastTheBudget() async throws {
        let budget = DescriptorBudget(capacity: 1, reserved: 8, fileLimit: 1024)
        let transport = TCPServerTransport(host: "127.0.0.1", port: 0)
        let address = try await transport.listen(Self.settings(budget)) { _ in }
        defer { transport.stopAccepting() }
        let port = try #require(address?.port)
        let served = try RawSocket(port: port)
        try await waitUntil { budget.inUse == 1 }
        let refused = try RawSocket(port: port)
        let (frames, closed) = await refused.readUntilClosed(seconds: 5)
        #expect(closed)
        let response = try #require(frames.last?.response)
        #expect(response.code == 14 && response.message?.contains("out of file descriptors") == true)
        refused.close()
        // The served one is neither refused nor closed.
        #expect(await served.readFrames(1, seconds: 0.3).isEmpty)
        served.close()
        try await waitUntil { budget.inUse == 0 }
        let again = try RawSocket(port: port)
        defer { again.close() }
        try await waitUntil { budget.inUse == 1 }
        let (none, againClosed) = await again.readUntilClosed(seconds: 0.3)
        #expect(none.isEmpty && !againClosed)
    }

    @Test("in process a session past the budget is refused with outOfDescriptors (two descriptors each), and taken again once one closed")
    func inProcessRefusesPastTheBudget() async throws {
        let budget = DescriptorBudget(capacity: 4, reserved: 8, fileLimit: 1024)
        let transport = InProcessTransport()
        _ = try await transport.listen(Self.settings(budget)) { _ in }
        defer { transport.stopAccepting() }
        let first = try await transport.connect()
        let second = try await transport.connect()
        #expect(budget.inUse == 4)
        do {
            _ = try await transport.connect()
            Issue.record("a session past the budget was taken")
        } catch let error as InProcessTransportError {
            #expect(error == .outOfDescriptors(budget.exhausted))
            #expect("\(error)".contains("out of file descriptors"))
        }
        #expect(budget.inUse == 4, "a refused session takes nothing")
        close(first)
        try await waitUntil { budget.inUse == 2 }
        let third = try await transport.connect()
        close(second)
        close(third)
        try await waitUntil { budget.inUse == 0 }
    }

    @Test("the spare refuses one pending connection with the frame and takes itself back: no descriptor is lost; nothing pending, it says so")
    func spareRefusesPending() async throws {
        let listener = try ListeningSocket.open(host: "127.0.0.1", port: 0, backlog: 8)
        defer { close(listener) }
        _ = fcntl(listener, F_SETFL, fcntl(listener, F_GETFL) | O_NONBLOCK)
        var address = sockaddr_in()
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(listener, $0, &length) } }
        let port = Int(UInt16(bigEndian: address.sin_port))
        let reserve = DescriptorReserve(refusal: Self.refusal)
        #expect(reserve.holdsSpare)
        #expect(!reserve.refusePending(listener: listener), "nothing pending")
        let client = try RawSocket(port: port)
        defer { client.close() }
        #expect(reserve.refusePending(listener: listener))
        #expect(reserve.holdsSpare, "the spare is back")
        let (frames, closed) = await client.readUntilClosed(seconds: 5)
        #expect(closed)
        #expect(frames.last?.response?.code == 14)
    }

    private func waitUntil(_ condition: @escaping () -> Bool) async throws {
        let deadline = ContinuousClock.now + .seconds(5)
        while !condition() {
            guard ContinuousClock.now < deadline else { Issue.record("condition not met within 5 s"); return }
            try await Task.sleep(for: .milliseconds(10))
        }
    }
}
