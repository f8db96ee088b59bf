public import Crypto
public import ThreadwireCore
public import ThreadwireWire

/// A rollout file as it is read, line by line (in one piece or several):
/// its parser and the digest of its lines (which content a thread came from,
/// so importing it again changes nothing).
public struct RolloutFeed: Sendable {
    public private(set) var parser: RolloutParser
    private var hasher = SHA256()
    public private(set) var lines = 0
    public private(set) var bytes = 0

    public init(defaultModel: String) { parser = RolloutParser(defaultModel: defaultModel) }

    /// The next lines of the file, without their line ends; `last`: the file ends with them.
    public mutating func feed(_ chunk: [[UInt8]], last: Bool) {
        for (index, line) in chunk.enumerated() {
            lines += 1
            bytes += line.count + 1
            hasher.update(data: line)
            hasher.update(data: [0x0A])
            parser.feed(line, number: lines, last: last && index == chunk.count - 1)
        }
    }

    public var digest: [UInt8] { Array(hasher.finalize()) }
}

extension Wire.ImportReport {
    /// What `file` became.
    public init(fileName: String, feed: RolloutFeed, thread: StoredThread, imported: ThreadEngine.Imported) {
        let parser = feed.parser
        func counts(_ table: [String: Int]) -> [Wire.ImportCount] {
            table.sorted { $0.key < $1.key }.map { Wire.ImportCount(kind: $0.key, count: UInt64($0.value)) }
        }
        self.init(
            fileName: fileName, threadId: imported.record.id, parentThreadId: imported.record.parentID,
            outcome: imported.outcome == .imported ? .imported : .unchanged, lines: UInt64(feed.lines),
            turns: UInt32(thread.turns.count), items: counts(parser.counts),
            skipped: parser.skipped.map { Wire.SkippedLine(line: UInt64($0.line), reason: $0.reason) },
            unknownRecords: counts(parser.unknown), linkedChildren: UInt32(imported.linkedChildren),
            multiAgentRuntime: imported.record.runtime?.wire ?? .unspecified, depth: UInt32(imported.record.depth))
        rolloutThreadId = imported.rolloutThreadID
    }

    /// The refusal of a strict import that met lines it could not read.
    public static func strictRefusal(fileName: String, _ skipped: [RolloutParser.Skipped]) -> String {
        let shown = skipped.prefix(5).map { "line \($0.line): \($0.reason)" }.joined(separator: "; ")
        return "\(fileName): \(skipped.count) line(s) could not be read (\(shown)); nothing was imported (strict)"
    }
}
