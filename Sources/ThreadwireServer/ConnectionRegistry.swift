import NIOCore
import NIOConcurrencyHelpers
import ThreadwireContract
import ThreadwireCore
import ThreadwireWire

/// Live connections by id; the engine's notification sink.
final class ConnectionRegistry: EventSink, Sendable {
    private let connections = NIOLockedValueBox([ConnectionID: Connection]())
    private let baseInstructions: @Sendable (ThreadRecord) -> String

    init(baseInstructions: @escaping @Sendable (ThreadRecord) -> String) {
        self.baseInstructions = baseInstructions
    }

    /// Adds the connection unless `limit` are open; the count after.
    func add(_ connection: Connection, limit: Int) -> Bool {
        connections.withLockedValue { table in
            guard table.count < limit else { return false }
            table[connection.id] = connection
            return true
        }
    }

    func remove(_ id: ConnectionID) { connections.withLockedValue { $0[id] = nil } }
    var all: [Connection] { connections.withLockedValue { Array($0.values) } }
    var count: Int { connections.withLockedValue { $0.count } }

    func deliver(_ deliveries: [Delivery]) {
        for delivery in deliveries where !delivery.recipients.isEmpty {
            let targets = connections.withLockedValue { table in delivery.recipients.compactMap { table[$0] } }
            switch delivery.event {
            case let .serverRequest(request):
                // Each connection decides whether it is eligible (its capabilities).
                for connection in targets { connection.offer(request) }
            case let .serverRequestResolved(threadID, requestID, outcome):
                // Each connection that was sent the request forgets it.
                for connection in targets {
                    connection.resolved(threadID, requestID: requestID, outcome, threadSequence: delivery.threadSequence.map(UInt64.init))
                }
            case let .replayed(_, event):
                // A kept event as stored: it carries its thread number already.
                enqueue(Wire.EncodedNotification(storedBody: event.bytes), to: targets)
            default:
                // Kept already encoded, and no trace context to add: sent as kept.
                if let body = delivery.encoded, delivery.trace == nil, let method = NotificationMapping.methodName(delivery.event) {
                    enqueue(Wire.EncodedNotification(body: body, methodName: method), to: targets)
                    continue
                }
                guard let payload = NotificationMapping.payload(delivery.event, baseInstructions: baseInstructions) else { continue }
                let metadata = delivery.trace.map { $0.metadata.map { Wire.KeyValue(key: $0.key, value: $0.value) } } ?? []
                enqueue(Wire.EncodedNotification(payload, metadata: metadata, threadSequence: delivery.threadSequence.map(UInt64.init)),
                        to: targets)
            }
        }
    }

    /// Encoded once for all the event's subscribers, queued in their
    /// outboxes, and one task per event loop drains the outboxes of that
    /// loop's subscribers.
    private func enqueue(_ encoded: Wire.EncodedNotification, to targets: [Connection]) {
        let toDrain = targets.filter { $0.enqueueNotification(encoded) }
        for (loop, group) in Self.byEventLoop(toDrain) {
            loop.execute { for connection in group { connection.drainOutbox() } }
        }
    }

    func waitForReplayRoom(_ connection: ConnectionID, bytes: Int) async -> Bool {
        guard let target = connections.withLockedValue({ $0[connection] }) else { return false }
        return await target.waitForReplayRoom(bytes)
    }

    /// The notification without its per-connection fields (sequence, trace
    /// metadata): what a replay sends again.
    func keptEncoding(_ event: ThreadEvent, threadSequence: Int64) -> [UInt8] {
        guard let payload = NotificationMapping.payload(event, baseInstructions: baseInstructions) else { return [] }
        return Wire.EncodedNotification(payload, threadSequence: UInt64(threadSequence)).body
    }

    private static func byEventLoop(_ connections: [Connection]) -> [(any EventLoop, [Connection])] {
        var groups: [(any EventLoop, [Connection])] = []
        for connection in connections {
            let loop = connection.eventLoop
            if let index = groups.firstIndex(where: { $0.0 === loop }) {
                groups[index].1.append(connection)
            } else {
                groups.append((loop, [connection]))
            }
        }
        return groups
    }
}
