import Foundation
import NIOCore
import Testing
import ThreadwireCore
import ThreadwireStorage
@testable import ThreadwirePostgres

/// The group commit's hand-written JSON against `JSONEncoder` on the same
/// commits: the same document, for every kind of operation and for strings
/// that need escaping.
@Suite struct CommitJSONTests {
    static let awkward = "quote \" backslash \\ slash / newline \n tab \t return \r bell \u{07} nul-free \u{1F} é 漢字 🧵 \u{2028}"

    static func commits() throws -> [CommitFunction.Commit] {
        var record = ThreadRecord(id: "t-1", sessionID: "s-1", source: .threadSpawn, depth: 2, createdAt: 1_700_000_000_123,
                                  model: Self.awkward, cwd: "/w/\"x\"")
        record.parentID = "p-1"
        record.name = Self.awkward
        record.preview = ""
        record.selectedMode = .proactive
        record.runtime = .v2
        record.archived = true
        record.principal = "alice"
        record.version = 42
        record.configOverrides = [KeyValuePair(key: "k\"", value: "v\n")]
        record.clientTools = [ToolSpec(name: "read", namespace: "", description: Self.awkward, parametersSchema: "{\"type\":\"object\"}",
                                       requiresApproval: true)]
        var turn = TurnRecord(id: "turn-1", threadID: "t-1", sequence: 3, startedAt: 5,
                              items: [ItemRecord(type: .userMessage, text: Self.awkward)],
                              context: TurnContext(model: "m", runtime: .v2, effectiveMode: nil, cwd: "/w"))
        turn.status = .inProgress
        let claim = IdempotencyClaim(key: IdempotencyKey(principal: "bob", key: Self.awkward), method: "turn/start", fingerprint: [0, 255, 7],
                                     threadID: "t-1", turnIDs: ["u1", "u2"], createdAtMillis: 9)
        let item = ContextItem(role: .user, kind: .userInput, text: Self.awkward)
        let everyKind: [StoreOperation] = [
            .putThread(record),
            .appendHistory("t-1", firstSequence: 7, items: [item, item]),
            .putTurn(turn),
            .enqueueMailbox(recipient: "t-2", item: item),
            .removeMailbox(recipient: "t-2", throughSequence: -1),
            .claimIdempotencyKey(claim, response: [1, 2, 3]),
            .claimIdempotencyKey(claim, response: nil),
            .recordIdempotentResponse(claim, response: []),
            .recordImport(ImportRecord(threadID: "t-3", principal: "carol", digest: Array(repeating: 0xAB, count: 32), lines: 12, importedAt: 77)),
            .relinkTree(from: "t-3", to: "t-1"),
        ]
        return [
            try CommitFunction.Commit(everyKind, fence: LeaseFence(tree: "s-1", epoch: Int64.max)),
            try CommitFunction.Commit([.putThread(ThreadRecord(id: "bare", sessionID: "bare", source: .appServer, depth: 0, createdAt: 0,
                                                               model: "", cwd: ""))], fence: nil),
            try CommitFunction.Commit([], fence: LeaseFence(tree: "", epoch: 0)),
        ]
    }

    static func parsed(_ json: String) throws -> NSObject {
        try #require(try JSONSerialization.jsonObject(with: Data(json.utf8)) as? NSObject)
    }

    @Test("the hand-written commit JSON is the document JSONEncoder writes, for every operation and escaped strings")
    func sameDocumentAsJSONEncoder() throws {
        let (commits, _) = CommitFunction.based(try Self.commits())
        let written = CommitJSON.encode(commits)
        let reference = String(decoding: try JSONEncoder().encode(commits), as: UTF8.self)
        #expect(try Self.parsed(written) == Self.parsed(reference))
        #expect(written.contains("\\\"") && written.contains("\\n") && written.contains("\\u001f"))
        // Each commit alone, too (a lone commit is a one-element batch).
        for commit in commits {
            let (alone, _) = CommitFunction.based([commit])
            #expect(try Self.parsed(CommitJSON.encode(alone)) == Self.parsed(String(decoding: try JSONEncoder().encode(alone), as: UTF8.self)))
        }
        #expect(CommitJSON.encode([]) == "[]")
    }

    @Test("a call's records travel beside the JSON, each operation naming its own by index from its commit's base")
    func recordsBesideTheJSON() throws {
        let item = ContextItem(role: .user, kind: .userInput, text: "hello")
        let events = (1...3).map { StoredEvent(sequence: Int64(10 + $0), createdAt: 5, bytes: [UInt8(200 + $0)]) }
        let claim = IdempotencyClaim(key: IdempotencyKey(principal: "bob", key: "k"), method: "thread/settings/update", fingerprint: [1],
                                     threadID: "t-2", turnIDs: [], createdAtMillis: 9)
        let first = try CommitFunction.Commit([.appendHistory("t-1", firstSequence: 0, items: [item, item]),
                                              .removeMailbox(recipient: "t-1", throughSequence: 3),
                                              .claimIdempotencyKey(claim, response: nil),
                                              .recordIdempotentResponse(claim, response: [7, 7])], fence: nil)
        let second = try CommitFunction.Commit([.appendEvents("t-2", events), .enqueueMailbox(recipient: "t-3", item: item)], fence: nil)
        let (based, records) = CommitFunction.based([first, second])
        #expect(records.count == 3 + 4)
        #expect(based.map(\.recordBase) == [0, 3])
        // The history's two items, then the answer; no record for the claim without one.
        #expect(based[0].ops.map(\.ri) == [0, nil, nil, 2] && based[0].ops.map(\.n) == [2, nil, nil, nil])
        #expect(based[1].ops.map(\.ri) == [0, 3] && based[1].ops.map(\.n) == [3, nil])
        #expect(Array(records[2].readableBytesView) == [7, 7])
        #expect(records[3...5].map { Array($0.readableBytesView) } == [[201], [202], [203]])
        #expect(Array(records[0].readableBytesView) == StoredRecords.encode(item))
        let json = CommitJSON.encode(based)
        #expect(!json.contains("items") && !json.contains("record"), "no record inside the JSON: \(json)")
    }
}
