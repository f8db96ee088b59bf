import NIOCore
import NIOEmbedded
import Testing
import ThreadwireNIO
import ThreadwireWire

/// The two ways frames are split: the server's `FrameSplitter` and the
/// generic `ByteToMessageHandler(FrameDecoder())` the clients use. Every
/// test runs on both: they must not differ.
enum Splitting: String, CaseIterable, CustomTestStringConvertible {
    case server = "FrameSplitter"
    case generic = "ByteToMessageHandler(FrameDecoder)"

    var testDescription: String { rawValue }

    func handler(max: Int, budget: PartialFrameBudget? = nil) -> any ChannelHandler {
        switch self {
        case .server: FrameSplitter(maxFrameBytes: max, budget: budget)
        case .generic: ByteToMessageHandler(FrameDecoder(maxFrameBytes: max, budget: budget))
        }
    }
}

@Suite("frame decoder (EmbeddedChannel)")
struct FrameDecoderTests {
    func channel(_ splitting: Splitting, max: Int = 1024) throws -> EmbeddedChannel {
        let channel = EmbeddedChannel()
        try channel.pipeline.syncOperations.addHandler(splitting.handler(max: max))
        return channel
    }

    func payloads(_ count: Int) -> [[UInt8]] {
        (0..<count).map { i in Wire.Envelope(kind: .request(Wire.Request(id: UInt64(i + 1), params: .healthCheck(.init())))).serializedBytes() }
    }

    @Test("frames split and coalesced at random points decode to the same payloads", arguments: Splitting.allCases)
    func randomSplits(_ splitting: Splitting) throws {
        var generator = SystemRandomNumberGenerator()
        for _ in 0..<50 {
            let frames = payloads(Int.random(in: 1...8, using: &generator))
            let stream = frames.flatMap(Framing.frame)
            let channel = try channel(splitting)
            var offset = 0
            while offset < stream.count {
                let take = min(stream.count - offset, Int.random(in: 1...12, using: &generator))
                try channel.writeInbound(ByteBuffer(bytes: stream[offset..<offset + take]))
                offset += take
            }
            var seen: [[UInt8]] = []
            while var buffer = try channel.readInbound(as: ByteBuffer.self) { seen.append(buffer.readBytes(length: buffer.readableBytes)!) }
            #expect(seen == frames)
            #expect(try channel.finish().isClean)
        }
    }

    @Test("an empty payload is a valid frame", arguments: Splitting.allCases)
    func emptyFrame(_ splitting: Splitting) throws {
        let channel = try channel(splitting)
        try channel.writeInbound(ByteBuffer(bytes: [0, 0, 0, 0, 0]))
        let buffer = try #require(try channel.readInbound(as: ByteBuffer.self))
        #expect(buffer.readableBytes == 0)
    }

    @Test("an oversized length is refused from the header alone, before any payload", arguments: Splitting.allCases)
    func oversizeBeforePayload(_ splitting: Splitting) throws {
        let channel = try channel(splitting, max: 1024)
        #expect(throws: FrameError.frameTooLarge(length: 4097, limit: 1024)) {
            try channel.writeInbound(ByteBuffer(bytes: [0, 0, 0, 0x10, 0x01]))
        }
    }

    @Test("undefined flag bits, including the reserved compressed bit, are refused", arguments: Splitting.allCases)
    func flags(_ splitting: Splitting) throws {
        for flags: UInt8 in [1, 0x80, 0x02] {
            let channel = try channel(splitting)
            #expect(throws: FrameError.undefinedFlags(flags)) { try channel.writeInbound(ByteBuffer(bytes: [flags, 0, 0, 0, 1, 0])) }
        }
    }

    @Test("random garbage never crashes: it decodes, waits or fails with a FrameError", arguments: Splitting.allCases)
    func garbage(_ splitting: Splitting) throws {
        var generator = SystemRandomNumberGenerator()
        for _ in 0..<200 {
            let channel = try channel(splitting)
            let bytes = (0..<Int.random(in: 1...64, using: &generator)).map { _ in UInt8.random(in: 0...255, using: &generator) }
            do {
                try channel.writeInbound(ByteBuffer(bytes: bytes))
            } catch {
                #expect(error is FrameError)
            }
            _ = try? channel.finish()
        }
    }

    @Test("a connection closed mid-frame reports a truncated frame", arguments: Splitting.allCases)
    func truncated(_ splitting: Splitting) throws {
        let channel = try channel(splitting)
        try channel.writeInbound(ByteBuffer(bytes: [0, 0, 0, 0, 9, 1, 2]))
        #expect(throws: FrameError.truncated(bufferedBytes: 7)) { try channel.finish() }
    }

    @Test("after a protocol violation nothing read is passed on", arguments: Splitting.allCases)
    func nothingAfterViolation(_ splitting: Splitting) throws {
        let channel = try channel(splitting)
        let good = Framing.frame(payloads(1)[0])
        #expect(throws: FrameError.undefinedFlags(0x02)) { try channel.writeInbound(ByteBuffer(bytes: [0x02, 0, 0, 0, 1, 0] + good)) }
        try? channel.writeInbound(ByteBuffer(bytes: good))
        #expect(try channel.readInbound(as: ByteBuffer.self) == nil)
        _ = try? channel.finish()
    }

    @Test("a frame's start left at the end of a large read is completed by the next read", arguments: Splitting.allCases)
    func restOfLargeRead(_ splitting: Splitting) throws {
        let budget = PartialFrameBudget(limit: 1 << 20)
        let channel = EmbeddedChannel()
        try channel.pipeline.syncOperations.addHandler(splitting.handler(max: 1 << 16, budget: budget))
        let whole = Framing.frame([UInt8](repeating: 1, count: 8000))
        let split = Framing.frame([UInt8](repeating: 2, count: 300))
        try channel.writeInbound(ByteBuffer(bytes: whole + split.prefix(10)))
        #expect(budget.heldBytes == 10)
        try channel.writeInbound(ByteBuffer(bytes: split.dropFirst(10)))
        #expect(budget.heldBytes == 0)
        var first = try #require(try channel.readInbound(as: ByteBuffer.self))
        var second = try #require(try channel.readInbound(as: ByteBuffer.self))
        #expect(first.readBytes(length: first.readableBytes) == [UInt8](repeating: 1, count: 8000))
        #expect(second.readBytes(length: second.readableBytes) == [UInt8](repeating: 2, count: 300))
        #expect(try channel.finish().isClean)
    }

    /// Closes the channel on the first payload it is passed.
    final class CloseOnFirst: ChannelInboundHandler {
        typealias InboundIn = ByteBuffer
        var seen = 0
        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            seen += 1
            if seen == 1 { context.close(promise: nil) }
        }
    }

    @Test("frames of one read after the handlers closed the channel are not passed on; the budget share is given back")
    func closedWhileSplitting() throws {
        let budget = PartialFrameBudget(limit: 1 << 20)
        let channel = EmbeddedChannel()
        let closer = CloseOnFirst()
        try channel.pipeline.syncOperations.addHandlers([FrameSplitter(maxFrameBytes: 1024, budget: budget), closer])
        try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
        let frames = payloads(3).flatMap(Framing.frame)
        try channel.writeInbound(ByteBuffer(bytes: frames + [0, 0, 0, 0, 50, 1]))
        #expect(closer.seen == 1)
        #expect(!channel.isActive)
        #expect(budget.heldBytes == 0)
    }

    @Test("the encoder writes header + payload")
    func encoder() throws {
        let channel = EmbeddedChannel(handler: MessageToByteHandler(FrameEncoder()))
        try channel.writeOutbound([UInt8]([7, 8, 9]))
        var out = try #require(try channel.readOutbound(as: ByteBuffer.self))
        #expect(out.readBytes(length: out.readableBytes) == [0, 0, 0, 0, 3, 7, 8, 9])
    }
}
