#if canImport(Glibc)
import Glibc
#endif
public import NIOCore
import NIOPosix
import ThreadwireNIO

/// The client's side of a frame connection made in process
/// (`InProcessTransport.connect`), for transports that carry a whole
/// session in their own messages (a gRPC stream, a WebSocket): envelopes in
/// (frame payloads), envelopes out. Read only as fast as the other transport
/// takes them, so its client's pace pushes back on the server like a socket's.
public enum FrameSession {
    public typealias Channel = NIOAsyncChannel<ByteBuffer, [UInt8]>

    /// Takes ownership of `socket` (closed on failure).
    public static func open(socket: Int32, maxFrameBytes: Int) async throws -> Channel {
        do {
            return try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton).withConnectedSocket(socket) { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandlers([
                        ByteToMessageHandler(FrameDecoder(maxFrameBytes: maxFrameBytes)), MessageToByteHandler(FrameEncoder()),
                    ])
                    return try Channel(wrappingChannelSynchronously: channel)
                }
            }
        } catch {
            close(socket)
            throw error
        }
    }
}
