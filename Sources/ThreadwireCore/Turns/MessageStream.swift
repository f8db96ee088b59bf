import Foundation
import Synchronization

/// One model call's streamed message: item/started for the message item at
/// its first piece of text, then item/agent_message/delta per piece. The
/// thread's next commit closes it (with the gate held) before it takes its
/// own publication ticket, so no delta follows the item's item/completed or
/// the turn's end, even when an interrupt races the stream.
final class MessageStream: Sendable {
    let itemID = newID()
    private let owner: ThreadOwner
    private let turnID: TurnID
    private let state = Mutex<(open: Bool, started: Bool, text: String)>((true, false, ""))

    init(owner: ThreadOwner, turnID: TurnID) {
        self.owner = owner
        self.turnID = turnID
    }

    func text(_ delta: String) {
        state.withLock { state in
            guard state.open else { return }
            let recipients = owner.subscribers
            var deliveries: [Delivery] = []
            if !state.started {
                state.started = true
                deliveries.append(Delivery(
                    event: .itemStarted(owner.id, turnID, ItemRecord(id: itemID, type: .agentMessage, text: "")), recipients: recipients))
            }
            deliveries.append(Delivery(event: .agentMessageDelta(owner.id, turnID, itemID: itemID, delta: delta), recipients: recipients))
            state.text += delta
            owner.publisher.ticket(deliveries).publish()
        }
    }

    /// Subscribes a connection that joins mid-stream (a resume) under the
    /// stream's lock, so each piece of text is either in what it is sent now
    /// or sent to it live: the item's item/started again with its text so
    /// far as one delta (a client that had part of it replaces that part),
    /// then the live deltas. Ticketed here, before any later piece.
    func join(_ connection: ConnectionID, watching: Bool = false) -> Publication {
        state.withLock { state in
            if watching { owner.watch(connection) } else { owner.subscribe(connection) }
            guard state.open, state.started else { return owner.publisher.ticket([]) }
            return owner.publisher.ticket([
                Delivery(event: .itemStarted(owner.id, turnID, ItemRecord(id: itemID, type: .agentMessage, text: "")), recipients: Subscriber.only(connection)),
                Delivery(event: .agentMessageDelta(owner.id, turnID, itemID: itemID, delta: state.text), recipients: Subscriber.only(connection)),
            ])
        }
    }

    /// Ends the stream; true if its item/started went out.
    func close() -> Bool {
        state.withLock { state in
            state.open = false
            return state.started
        }
    }
}
