import NIOCore

/// Holds the listener's reads while the connections it accepted fill what
/// the descriptor budget allows plus the slack for refusing a few
/// (`DescriptorBudget.acceptsMore`). Refusing happens after accept, so
/// without the gate a flood of connections faster than they are refused (a
/// busy machine) would take every descriptor of the reserve. Held, the rest
/// wait in the kernel's backlog and are accepted, then served or refused, as
/// earlier ones close.
final class AcceptGate: ChannelDuplexHandler {
    typealias InboundIn = any Channel
    typealias InboundOut = any Channel
    typealias OutboundIn = Never

    private let budget: DescriptorBudget
    private var readHeld = false

    init(budget: DescriptorBudget) {
        self.budget = budget
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let child = unwrapInboundIn(data)
        budget.acceptedOpened()
        let loopBound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        let budget = self.budget
        child.closeFuture.whenComplete { _ in
            budget.acceptedClosed()
            loopBound.eventLoop.execute {
                let (gate, context) = loopBound.value
                gate.readIfHeld(context: context)
            }
        }
        context.fireChannelRead(data)
    }

    func read(context: ChannelHandlerContext) {
        guard budget.acceptsMore else {
            readHeld = true
            return
        }
        context.read()
    }

    private func readIfHeld(context: ChannelHandlerContext) {
        guard readHeld, budget.acceptsMore else { return }
        readHeld = false
        context.read()
    }
}
