import ArgumentParser
import Foundation
import NIOCore
import NIOPosix
import ThreadwireNIO

/// The transport ceiling: a bare SwiftNIO server speaking the same framing,
/// echoing every frame back untouched (no protobuf, no store).
struct EchoServer: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "echo-server")
    @Option var port = 0

    final class Echo: ChannelInboundHandler, Sendable {
        typealias InboundIn = ByteBuffer
        typealias OutboundOut = [UInt8]
        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            var payload = unwrapInboundIn(data)
            context.writeAndFlush(wrapOutboundOut(payload.readBytes(length: payload.readableBytes) ?? []), promise: nil)
        }
    }

    func run() async throws {
        let channel = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelOption(.socketOption(.tcp_nodelay), value: 1)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandlers([
                        ByteToMessageHandler(FrameDecoder()), MessageToByteHandler(FrameEncoder()), Echo(),
                    ])
                }
            }
            .bind(host: "127.0.0.1", port: port).get()
        FileHandle.standardOutput.write(Data("listening on 127.0.0.1:\(channel.localAddress!.port!)\n".utf8))
        try await channel.closeFuture.get()
    }
}
