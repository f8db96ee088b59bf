import NIOCore
import NIOEmbedded
import Testing
import ThreadwireNIO
import ThreadwireWire

@Suite("frame decoder (EmbeddedChannel)")
struct FrameDecoderTests {
    func channel(max: Int = 1024) throws -> EmbeddedChannel {
        let channel = EmbeddedChannel()
        try channel.pipeline.syncOperations.addHandler(ByteToMessageHandler(FrameDecoder(maxFrameBytes: max)))
        return channel
    }

    func payloads(_ count: Int) -> [[UInt8]] {
        (0..<count).map { i in Wire.Envelope(kind: .request(Wire.Request(id: UInt64(i + 1), params: .healthCheck(.init())))).serializedBytes() }
    }

    @Test("frames split and coalesced at random points decode to the same payloads")
    func randomSplits() throws {
        var generator = SystemRandomNumberGenerator()
        for _ in 0..<50 {
            let frames = payloads(Int.random(in: 1...8, using: &generator))
            let stream = frames.flatMap(Framing.frame)
            let channel = try channel()
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

    @Test("an empty payload is a valid frame")
    func emptyFrame() throws {
        let channel = try channel()
        try channel.writeInbound(ByteBuffer(bytes: [0, 0, 0, 0, 0]))
        let buffer = try #require(try channel.readInbound(as: ByteBuffer.self))
        #expect(buffer.readableBytes == 0)
    }

    @Test("an oversized length is refused from the header alone, before any payload")
    func oversizeBeforePayload() throws {
        let channel = try channel(max: 1024)
        #expect(throws: FrameError.frameTooLarge(length: 4097, limit: 1024)) {
            try channel.writeInbound(ByteBuffer(bytes: [0, 0, 0, 0x10, 0x01]))
        }
    }

    @Test("undefined flag bits, including the reserved compressed bit, are refused")
    func flags() throws {
        for flags: UInt8 in [1, 0x80, 0x02] {
            let channel = try channel()
            #expect(throws: FrameError.undefinedFlags(flags)) { try channel.writeInbound(ByteBuffer(bytes: [flags, 0, 0, 0, 1, 0])) }
        }
    }

    @Test("random garbage never crashes: it decodes, waits or fails with a FrameError")
    func garbage() throws {
        var generator = SystemRandomNumberGenerator()
        for _ in 0..<200 {
            let channel = try channel()
            let bytes = (0..<Int.random(in: 1...64, using: &generator)).map { _ in UInt8.random(in: 0...255, using: &generator) }
            do {
                try channel.writeInbound(ByteBuffer(bytes: bytes))
            } catch {
                #expect(error is FrameError)
            }
            _ = try? channel.finish()
        }
    }

    @Test("a connection closed mid-frame reports a truncated frame")
    func truncated() throws {
        let channel = try channel()
        try channel.writeInbound(ByteBuffer(bytes: [0, 0, 0, 0, 9, 1, 2]))
        #expect(throws: FrameError.truncated(bufferedBytes: 7)) { try channel.finish() }
    }

    @Test("the encoder writes header + payload")
    func encoder() throws {
        let channel = EmbeddedChannel(handler: MessageToByteHandler(FrameEncoder()))
        try channel.writeOutbound([UInt8]([7, 8, 9]))
        var out = try #require(try channel.readOutbound(as: ByteBuffer.self))
        #expect(out.readBytes(length: out.readableBytes) == [0, 0, 0, 0, 3, 7, 8, 9])
    }
}
