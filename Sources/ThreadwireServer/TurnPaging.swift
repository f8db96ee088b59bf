import ThreadwireContract
import ThreadwireCore
import ThreadwireWire

/// Pages of turns that never make a frame larger than max_frame_bytes.
enum TurnPaging {
    /// Room kept for the envelope fields around the turns (id, code, tags).
    static let slack = 64
    /// Stands in for a cursor while sizing a page (cursors are far shorter).
    static let cursorRoom = String(repeating: "0", count: 256)

    static func limit(_ value: UInt32?, field: String, default fallback: Int) throws -> Int {
        guard let value else { return fallback }
        guard (1...1000).contains(value) else { throw RequestError(.invalidArgument, "\(field) must be from 1 to 1000, got \(value)") }
        return Int(value)
    }

    /// Bytes a message adds to a repeated field: tag, length, message.
    static func encodedSize(_ message: some WireMessage) -> Int {
        let size = message.serializedBytes().count
        return size + 1 + (size < 128 ? 1 : size < 16_384 ? 2 : size < 2_097_152 ? 3 : 5)
    }

    /// How many of `messages`, from the first, fit in `room` bytes.
    static func prefixThatFits(_ messages: [some WireMessage], room: Int) -> Int {
        var left = room
        for (index, message) in messages.enumerated() {
            left -= encodedSize(message)
            if left < 0 { return index }
        }
        return messages.count
    }

    static func budget(around result: Wire.Response.Result, limits: ServerLimits) -> Int {
        let empty = Wire.Envelope(kind: .response(Wire.Response(id: .max, code: 0, result: result))).serializedBytes().count
        return limits.maxFrameBytes - empty - slack
    }

    /// The newest of `turns` (oldest first, `records` alongside) that fit
    /// in one frame with `result`, and the cursor to the older ones.
    static func newestThatFit(_ turns: [Wire.Turn], records: [TurnRecord], olderLeftOut: Bool,
                              around result: Wire.Response.Result, limits: ServerLimits) -> (turns: [Wire.Turn], nextCursor: String?) {
        var room = budget(around: result, limits: limits)
        var first = turns.count
        while first > 0 {
            let size = encodedSize(turns[first - 1])
            guard size <= room else { break }
            room -= size
            first -= 1
        }
        if first == 0, !olderLeftOut { return (turns, nil) }
        // Descending pages continue strictly before the oldest turn kept
        // (before "one past the newest" when not even that one fit).
        let boundary = first < records.count ? records[first].sequence : (records.last?.sequence ?? -1) + 1
        return (Array(turns[first...]), TurnCursor.encode(sequence: boundary))
    }

    static func fitLifecycle(_ view: ThreadView, baseInstructions: String, limits: ServerLimits,
                             wrap: (Wire.ThreadLifecycleResult) -> Wire.Response.Result) -> Wire.Response.Result {
        var result = view.lifecycleResult(baseInstructions: baseInstructions)
        let turns = result.thread?.turns ?? []
        guard !turns.isEmpty else { return wrap(result) }
        result.thread?.turns = []
        let page = newestThatFit(turns, records: view.turns ?? [], olderLeftOut: view.hasOlderTurns,
                                 around: wrap(result), limits: limits)
        result.thread?.turns = page.turns
        result.turnsNextCursor = page.nextCursor
        return wrap(result)
    }

    /// A page in the order asked for, cut where the frame would overflow.
    static func inOrderThatFit(_ records: [TurnRecord], more: Bool, limits: ServerLimits) throws -> (turns: [Wire.Turn], nextCursor: String?) {
        var room = budget(around: .threadTurnsList(Wire.ThreadTurnsListResult(nextCursor: cursorRoom)), limits: limits)
        var kept: [Wire.Turn] = []
        for record in records {
            let turn = record.wire()
            let size = encodedSize(turn)
            guard size <= room else {
                if kept.isEmpty {
                    throw RequestError(.resourceExhausted,
                        "turn \(record.id) is \(size) bytes, over max_frame_bytes (\(limits.maxFrameBytes)); it cannot be sent in any frame")
                }
                return (kept, TurnCursor.encode(sequence: records[kept.count - 1].sequence))
            }
            room -= size
            kept.append(turn)
        }
        return (kept, more ? records.last.map { TurnCursor.encode(sequence: $0.sequence) } : nil)
    }
}
