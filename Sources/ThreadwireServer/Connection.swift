import NIOConcurrencyHelpers
import NIOCore
import ThreadwireCore
import ThreadwireWire

/// One client connection's shared state. Writes go through the channel (which
/// is safe from any thread); the lock keeps notification sequence numbers in
/// the order the frames are written.
final class Connection: Sendable {
    let id: ConnectionID
    let channel: any Channel

    private struct State {
        var initialized = false
        var optOut: Set<String> = []
        var nextSequence: UInt64 = 1
        var queued = 0
    }
    private let state = NIOLockedValueBox(State())

    init(id: ConnectionID, channel: any Channel) {
        self.id = id
        self.channel = channel
    }

    var isInitialized: Bool { state.withLockedValue { $0.initialized } }

    func markInitialized(optOut: [String]) -> Bool {
        state.withLockedValue { state in
            if state.initialized { return false }
            state.initialized = true
            state.optOut = Set(optOut)
            return true
        }
    }

    /// Counts a request in; false when the queue is full.
    func admit(limit: Int) -> Bool {
        state.withLockedValue { state in
            if state.queued >= limit { return false }
            state.queued += 1
            return true
        }
    }

    func finished() { state.withLockedValue { $0.queued -= 1 } }

    func send(_ response: Wire.Response) {
        channel.writeAndFlush(Wire.Envelope(kind: .response(response)).serializedBytes(), promise: nil)
    }

    func notify(_ payload: Wire.Notification.Payload) {
        let method = payload.methodName
        state.withLockedValue { state in
            guard state.initialized, !state.optOut.contains(method) else { return }
            let notification = Wire.Notification(sequence: state.nextSequence, payload: payload)
            state.nextSequence += 1
            channel.writeAndFlush(Wire.Envelope(kind: .notification(notification)).serializedBytes(), promise: nil)
        }
    }
}

/// Live connections by id; the engine's notification sink.
final class ConnectionRegistry: EventSink, Sendable {
    private let connections = NIOLockedValueBox([ConnectionID: Connection]())
    private let baseInstructions: @Sendable (ThreadRecord) -> String

    init(baseInstructions: @escaping @Sendable (ThreadRecord) -> String) {
        self.baseInstructions = baseInstructions
    }

    func add(_ connection: Connection) { connections.withLockedValue { $0[connection.id] = connection } }
    func remove(_ id: ConnectionID) { connections.withLockedValue { $0[id] = nil } }
    var all: [Connection] { connections.withLockedValue { Array($0.values) } }

    func deliver(_ deliveries: [Delivery]) {
        for delivery in deliveries where !delivery.recipients.isEmpty {
            let payload = NotificationMapping.payload(delivery.event, baseInstructions: baseInstructions)
            let targets = connections.withLockedValue { table in delivery.recipients.compactMap { table[$0] } }
            for connection in targets { connection.notify(payload) }
        }
    }
}
