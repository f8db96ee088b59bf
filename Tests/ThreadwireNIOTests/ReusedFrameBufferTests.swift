import NIOCore
import Testing
import ThreadwireNIO

@Suite("answers framed in a reused buffer")
struct ReusedFrameBufferTests {
    let allocator = ByteBufferAllocator()

    /// A frame of `payload`, packed as the codec packs (size, then a writer).
    func frame(_ frames: inout ReusedFrameBuffer, _ payload: [UInt8], maxPayload: Int = 1 << 20) -> FrameResult {
        frames.frame(allocator: allocator, maxPayload: maxPayload) { body in
            body(payload.count) { pointer in pointer.copyMemory(from: payload, byteCount: payload.count) }
        }
    }

    func framed(_ result: FrameResult) throws -> ByteBuffer {
        guard case let .framed(buffer) = result else { throw FrameTestError.notFramed }
        return buffer
    }

    enum FrameTestError: Error { case notFramed }

    func address(_ buffer: ByteBuffer) -> UnsafeRawPointer? {
        buffer.withUnsafeReadableBytes { UnsafeRawPointer($0.baseAddress) }
    }

    func bytes(_ buffer: ByteBuffer) -> [UInt8] { Array(buffer.readableBytesView) }

    @Test("once the last frame is let go, the next is written in the same storage; while it is held, in storage of its own")
    func reusesOnlyWhatNobodyHolds() throws {
        var frames = ReusedFrameBuffer(reusableBytes: 64)
        var first: ByteBuffer? = try framed(frame(&frames, [1, 2, 3]))
        #expect(bytes(first!) == [0, 0, 0, 0, 3, 1, 2, 3])
        let firstAddress = address(first!)
        // Still held (a write not yet taken by the socket): the next frame may not touch it.
        let second = try framed(frame(&frames, [4, 5]))
        #expect(bytes(first!) == [0, 0, 0, 0, 3, 1, 2, 3])
        #expect(bytes(second) == [0, 0, 0, 0, 2, 4, 5])
        #expect(address(second) != firstAddress)
        #expect(second.capacity == allocator.buffer(capacity: 7).capacity, "unsent bytes held in an allocation of their size, as before")
        first = nil
        let secondAddress = address(second)
        _ = consume second
        // Nothing holds the last frame: the next one is written over it.
        let third = try framed(frame(&frames, [6, 7, 8, 9]))
        #expect(bytes(third) == [0, 0, 0, 0, 4, 6, 7, 8, 9])
        #expect(address(third) == secondAddress)
    }

    @Test("a frame over the reusable size gets its own storage and is not kept; the limit still refuses before any is made")
    func largeFramesAreNotKept() throws {
        var frames = ReusedFrameBuffer(reusableBytes: 16)
        var small: ByteBuffer? = try framed(frame(&frames, [1]))
        let smallAddress = address(small!)
        small = nil
        let large = try framed(frame(&frames, [UInt8](repeating: 7, count: 40)))
        #expect(large.readableBytes == 45)
        #expect(address(large) != smallAddress)
        _ = consume large
        // The spare is still the small frame's storage.
        let next = try framed(frame(&frames, [2]))
        #expect(address(next) == smallAddress)
        guard case let .tooLarge(size) = frame(&frames, [UInt8](repeating: 1, count: 10), maxPayload: 9) else {
            Issue.record("a payload over the limit was framed")
            return
        }
        #expect(size == 10)
    }
}
