import ArgumentParser
import Foundation
import ThreadwireCore
import ThreadwireSQLite

struct Import: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Load codex rollout JSONL files into a store as threads (legacy ones are pinned to v1 on first resume).")

    @Option(help: "The server's data directory.")
    var dataDir = "./data"

    @Option(help: "The principal the imported threads belong to (an --auth-tokens principal); only it sees them when the server authenticates.")
    var owner = Principal.standalone

    @Argument(help: "Rollout files (rollout-*.jsonl).")
    var files: [String]

    func validate() throws {
        guard !owner.isEmpty, !owner.contains(where: \.isWhitespace) else {
            throw ValidationError("--owner must be a principal name without spaces, got '\(owner)'")
        }
    }

    func run() async throws {
        let store = try SQLiteThreadStore(directory: dataDir)
        for file in files {
            guard let data = FileManager.default.contents(atPath: file) else { throw ValidationError("cannot read \(file)") }
            var thread = try RolloutImport.parse(data, defaultModel: ServerSettings().defaultModel)
            thread.record.principal = owner
            if try await store.threadRecord(thread.record.id) != nil {
                throw ValidationError("\(file): thread \(thread.record.id) is already in the store")
            }
            var operations: [StoreOperation] = [
                .putThread(thread.record), .appendHistory(thread.record.id, firstSequence: 0, items: Array(thread.history)),
            ]
            operations += thread.turns.map { .putTurn($0) }
            try await store.commit(operations)
            let runtime = thread.record.runtime?.rawValue ?? "none recorded (legacy: pinned to v1 on first resume)"
            print("\(thread.record.id)\t\(thread.turns.count) turns\truntime: \(runtime)\towner: \(owner)")
        }
    }
}
