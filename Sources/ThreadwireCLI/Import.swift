import ArgumentParser
import Foundation
import ThreadwireClient
import ThreadwireContract
import ThreadwireCore
import ThreadwireSQLite
import ThreadwireWire

struct Import: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Import codex rollout files (rollout-*.jsonl) as threads: through a running server (thread/import), or into a SQLite store (--data-dir).",
        discussion: """
            Each file becomes one thread with its turns, messages, tool calls and outputs, reasoning summaries, token \
            usage, compactions and rollbacks. A sub-agent's rollout becomes a child of its parent (imported before or \
            after it). Lines that cannot be read (a torn last line, a malformed one) are skipped and reported; with \
            --strict they fail their file. Importing the same file again changes nothing. Exit status 1 if any file failed.
            """)

    @OptionGroup var options: ServerOptions

    @Option(help: "Import into the SQLite store in this directory, without a server (the server must not be running on it).")
    var dataDir: String?

    @Option(help: "With --data-dir: the principal the threads belong to. Through a server, they belong to the connection's principal (its token).")
    var owner = Principal.standalone

    @Flag(help: "A line that cannot be read fails its file (nothing of it is imported).")
    var strict = false

    /// -o json: one object with every file's report and a summary.
    @OptionGroup var output: ReportOutputOptions
    var json: Bool { output.json }

    @Option(help: "Bytes of lines per request through a server (a larger file goes in several, committed together).")
    var chunkBytes = 1 << 20

    @Argument(help: "Rollout files.")
    var files: [String]

    func validate() throws {
        guard !owner.isEmpty, !owner.contains(where: \.isWhitespace) else {
            throw ValidationError("--owner must be a principal name without spaces, got '\(owner)'")
        }
        guard chunkBytes >= 1024 else { throw ValidationError("--chunk-bytes must be at least 1024") }
    }

    func run() async throws {
        var reports: [Wire.ImportReport] = []
        var failures: [(file: String, error: String)] = []
        let importer: any RolloutImporter = if let dataDir {
            try OfflineImporter(store: SQLiteThreadStore(directory: dataDir), principal: owner)
        } else {
            ServerImporter(client: try options.session(), chunkBytes: chunkBytes)
        }
        for file in files {
            do {
                guard let data = FileManager.default.contents(atPath: file) else { throw ImportFailure("cannot read \(file)") }
                let report = try await importer.importFile(name: file, lines: Self.lines(data), strict: strict)
                reports.append(report)
                if !json { print(Self.describe(report)) }
            } catch {
                let message = (error as? ImportFailure)?.description ?? "\(error)"
                failures.append((file, message))
                if !json { FileHandle.standardError.write(Data("\(file): not imported: \(message)\n".utf8)) }
            }
        }
        await importer.close()
        let summary = Self.summary(reports, failures: failures.count, files: files.count)
        if json {
            let object = JSONValue.object([
                ("files", .array(reports.map { $0.jsonValue() })),
                ("failed", .array(failures.map { .object([("file", .string($0.file)), ("error", .string($0.error))]) })),
                ("summary", .string(summary)),
            ])
            print(object.render(pretty: true))
        } else {
            print(summary)
        }
        if !failures.isEmpty { throw ExitCode(1) }
    }

    /// The file's lines without their ends ("\n", or "\r\n"); no empty last
    /// line when the file ends with a line end.
    static func lines(_ data: Data) -> [[UInt8]] {
        var lines: [[UInt8]] = []
        var start = data.startIndex
        for index in data.indices where data[index] == 0x0A {
            var end = index
            if end > start, data[end - 1] == 0x0D { end -= 1 }
            lines.append(Array(data[start..<end]))
            start = index + 1
        }
        if start < data.endIndex { lines.append(Array(data[start...])) }
        return lines
    }

    static func describe(_ report: Wire.ImportReport) -> String {
        let file = report.fileName ?? "?"
        let tree = report.parentThreadId.map { ", child of \($0) (depth \(report.depth ?? 1))" } ?? ""
        let outcome = report.outcome == .unchanged ? "unchanged (imported before)" : "imported"
        var line = "\(file): thread \(report.threadId ?? "?")\(tree) \(outcome): \(report.turns ?? 0) turns, \(report.lines ?? 0) lines"
        let items = report.items.map { "\($0.count ?? 0) \($0.kind ?? "?")" }
        if !items.isEmpty { line += "; items: " + items.joined(separator: ", ") }
        if let linked = report.linkedChildren, linked > 0 { line += "; linked \(linked) child thread(s) imported before it" }
        if let original = report.rolloutThreadId { line += "; the rollout's id \(original) was taken: imported under a new id" }
        if let runtime = report.multiAgentRuntime {
            line += "; runtime: " + (runtime == .unspecified ? "none recorded (pinned on first resume)" : runtime.protoValueName)
        }
        if !report.unknownRecords.isEmpty {
            line += "; records not imported: " + report.unknownRecords.map { "\($0.kind ?? "?") ×\($0.count ?? 0)" }.joined(separator: ", ")
        }
        for skipped in report.skipped {
            line += "\n  \(file):\(skipped.line ?? 0): skipped: \(skipped.reason ?? "")"
        }
        return line
    }

    static func summary(_ reports: [Wire.ImportReport], failures: Int, files: Int) -> String {
        let imported = reports.filter { $0.outcome == .imported }.count
        let turns = reports.reduce(0) { $0 + Int($1.turns ?? 0) }
        let items = reports.reduce(0) { $0 + $1.items.reduce(0) { $0 + Int($1.count ?? 0) } }
        let skipped = reports.reduce(0) { $0 + $1.skipped.count }
        let unknown = reports.reduce(0) { $0 + $1.unknownRecords.reduce(0) { $0 + Int($1.count ?? 0) } }
        return "\(files) file(s): \(imported) thread(s) imported, \(reports.count - imported) unchanged, \(failures) failed; "
            + "\(turns) turns, \(items) items, \(skipped) line(s) skipped, \(unknown) record(s) not imported"
    }
}

struct ImportFailure: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

protocol RolloutImporter: Sendable {
    func importFile(name: String, lines: [[UInt8]], strict: Bool) async throws -> Wire.ImportReport
    func close() async
}

/// thread/import, in pieces of at most `chunkBytes`; the pieces of a file
/// share an import id, and each carries its first line's number, so a piece
/// resent after a lost answer (the reconnecting client keys every one) is
/// not fed twice.
struct ServerImporter: RolloutImporter {
    let client: ReconnectingClient
    let chunkBytes: Int

    func importFile(name: String, lines: [[UInt8]], strict: Bool) async throws -> Wire.ImportReport {
        let importID = UUID().uuidString
        var start = 0
        repeat {
            var end = start
            var bytes = 0
            while end < lines.count, end == start || bytes + lines[end].count <= chunkBytes {
                bytes += lines[end].count + 1
                end += 1
            }
            let last = end == lines.count
            let params = Wire.ThreadImportParams(fileName: name, lines: Array(lines[start..<end]), importId: importID, last: last,
                                                 strict: strict, firstLine: UInt64(start + 1))
            let response = try await client.call(.threadImport(params))
            guard response.code ?? 0 == 0, case let .threadImport(result)? = response.result else {
                throw ImportFailure("\(response.message ?? "status \(response.code ?? 0)")")
            }
            if last {
                guard let report = result.report else { throw ImportFailure("the server answered the last piece without a report") }
                return report
            }
            start = end
        } while true
    }

    func close() async { await client.close() }
}

/// Straight into a SQLite store, through the same engine the server runs.
struct OfflineImporter: RolloutImporter {
    let engine: ThreadEngine
    let principal: Principal

    init(store: SQLiteThreadStore, principal: Principal) {
        engine = ThreadEngine(store: store, backend: NoModel(), settings: ServerSettings(), sink: Discarded())
        self.principal = principal
    }

    func importFile(name: String, lines: [[UInt8]], strict: Bool) async throws -> Wire.ImportReport {
        var feed = RolloutFeed(defaultModel: ServerSettings().defaultModel)
        feed.feed(lines, last: true)
        if strict, !feed.parser.skipped.isEmpty { throw ImportFailure(Wire.ImportReport.strictRefusal(fileName: name, feed.parser.skipped)) }
        let thread = try feed.parser.finish()
        let imported = try await engine.importThread(thread, principal: principal, digest: feed.digest, lines: feed.lines)
        return Wire.ImportReport(fileName: name, feed: feed, thread: thread, imported: imported)
    }

    func close() async {}

    /// Importing calls no model.
    struct NoModel: ModelBackend {
        func respond(to request: ModelRequest, stream: ModelStream) async throws -> ModelResponse {
            throw ModelCallError(.internalError, "no model while importing")
        }
    }

    struct Discarded: EventSink {
        func deliver(_ deliveries: [Delivery]) {}
    }
}
