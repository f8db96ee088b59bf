import ArgumentParser
import Foundation
import NIOCore
import NIOPosix
import ThreadwireNIO

/// The transport ceiling: a bare SwiftNIO server speaking the same framing,
/// echoing every frame back untouched (no protobuf, no store).
/// `--raw` is SwiftNIO's floor: no decoder at all, each read's bytes written
/// back as they came and flushed once per read batch, which a closed-loop
/// generator (one frame in flight per connection) cannot tell from an echo.
struct EchoServer: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "echo-server")
    @Option var port = 0
    @Flag(help: "Echo each read's bytes without decoding frames (SwiftNIO's floor).") var raw = false
    @Option(help: "Event loops (default: one per core NIO counts, which ignores a taskset).") var eventLoops: Int?

    final class Echo: ChannelInboundHandler, Sendable {
        typealias InboundIn = ByteBuffer
        typealias OutboundOut = [UInt8]
        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            var payload = unwrapInboundIn(data)
            context.writeAndFlush(wrapOutboundOut(payload.readBytes(length: payload.readableBytes) ?? []), promise: nil)
        }
    }

    final class RawEcho: ChannelInboundHandler, Sendable {
        typealias InboundIn = ByteBuffer
        typealias OutboundOut = ByteBuffer
        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            context.write(data, promise: nil)
        }
        func channelReadComplete(context: ChannelHandlerContext) {
            context.flush()
        }
    }

    func run() async throws {
        let raw = raw
        let group = eventLoops.map { MultiThreadedEventLoopGroup(numberOfThreads: $0) } ?? MultiThreadedEventLoopGroup.singleton
        let channel = try await ServerBootstrap(group: group)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelOption(.socketOption(.tcp_nodelay), value: 1)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    if raw {
                        try channel.pipeline.syncOperations.addHandler(RawEcho())
                    } else {
                        try channel.pipeline.syncOperations.addHandlers([
                            ByteToMessageHandler(FrameDecoder()), MessageToByteHandler(FrameEncoder()), Echo(),
                        ])
                    }
                }
            }
            .bind(host: "127.0.0.1", port: port).get()
        FileHandle.standardOutput.write(Data("listening on 127.0.0.1:\(channel.localAddress!.port!)\n".utf8))
        try await channel.closeFuture.get()
    }
}
