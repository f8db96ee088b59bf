import Foundation
import Testing
import ThreadwireContract
import ThreadwireCore
import ThreadwireStorage
import ThreadwireWire

/// What every store writes: the thread row's columns and the record format.
@Suite("storage format")
struct StorageFormatTests {
    func sampleTurn() -> TurnRecord {
        var turn = TurnRecord(id: "t1", threadID: "th", sequence: 3, startedAt: 1_700_000_000_000,
                              items: [ItemRecord(id: "i1", type: .agentMessage, text: "héllo")],
                              context: TurnContext(model: "m", runtime: .v2, effectiveMode: .proactive, cwd: "/repo"))
        turn.modelRequests = [ModelRequestRecord(model: "m", contextCount: 2, tools: [ToolSpec(name: "spawn_agent", namespace: "collaboration", description: "d")])]
        return turn
    }

    @Test("a thread row's JSON columns: the empty cases are the bytes JSONEncoder writes, and every column reads back")
    func threadRowJSONColumns() throws {
        let bare = ThreadRecord(id: "a", sessionID: "a", source: .appServer, depth: 0, createdAt: 1, model: "m", cwd: "/w")
        let row = try ThreadRow(bare)
        #expect(row.config_overrides == String(decoding: try JSONEncoder().encode([KeyValuePair]()), as: UTF8.self))
        let sorted = JSONEncoder()
        sorted.outputFormatting = .sortedKeys
        struct NoTools: Encodable { var client_tools: [String]? }
        #expect(row.tool_settings == String(decoding: try sorted.encode(NoTools()), as: UTF8.self))
        #expect(try row.record() == bare)
        var full = bare
        full.configOverrides = [KeyValuePair(key: "k", value: "v")]
        full.clientTools = [ToolSpec(name: "t", namespace: "", description: "d", parametersSchema: "{}", requiresApproval: true)]
        full.userInputEnabled = true
        full.mcpServers = ["time"]
        full.pauseAfterTools = true
        full.forkedFromID = "src"
        full.forkedAtTurnID = "t3"
        #expect(try ThreadRow(full).record() == full)
    }

    @Test("history items and turns round-trip through the versioned record format")
    func roundTrip() throws {
        let item = ContextItem(role: .tool, kind: .toolOutput, text: "{\"ok\":true}", toolName: "wait_agent", callID: "c1")
        let bytes = StoredRecords.encode(item)
        #expect(Array(bytes.prefix(2)) == [0x00, 0x01], "a zero byte and format 1 lead every record")
        #expect(try StoredRecords.decodeContextItem(bytes) == item)
        var turn = sampleTurn()
        #expect(try StoredRecords.decodeTurn(StoredRecords.encode(turn), threadID: "th", sequence: 3) == turn)
        turn.pausedAfterTools = true
        #expect(try StoredRecords.decodeTurn(StoredRecords.encode(turn), threadID: "th", sequence: 3) == turn)
    }

    @Test("a record written before the format version existed is read as the same encoding")
    func readsUnversionedRecords() throws {
        let item = ContextItem(role: .user, kind: .userInput, text: "fix the bug")
        let legacy = item.wire.serializedBytes()
        #expect(try StoredRecords.decodeContextItem(legacy) == item)
        let turn = sampleTurn()
        #expect(try StoredRecords.decodeTurn(turn.storedWire.serializedBytes(), threadID: "th", sequence: 3) == turn)
    }

    @Test("a record of a newer format is refused with a message naming both formats")
    func refusesNewerFormat() throws {
        do {
            _ = try StoredRecords.decodeContextItem([0x00, 0x07, 0x08, 0x01])
            Issue.record("format 7 was read")
        } catch let error as StoreError {
            #expect("\(error)".contains("format 7") && "\(error)".contains("format 1"), "\(error)")
        }
    }

    @Test("a thread row maps every field of the record and back, the columns and values in step")
    func threadRowRoundTrip() throws {
        var record = ThreadRecord(id: "th", sessionID: "root", source: .threadSpawn, depth: 2, createdAt: 5, model: "m", cwd: "/w")
        record.parentID = "p"
        record.forkedFromID = "f"
        record.taskName = "/root/a"
        record.nickname = "Ada"
        record.preview = "pre"
        record.name = "named"
        record.updatedAt = 9
        record.archived = true
        record.runtime = .v1
        record.legacy = true
        record.selectedMode = .explicitRequestOnly
        record.baseInstructions = "be brief"
        record.configOverrides = [KeyValuePair(key: "features.multi_agent_v2", value: "true")]
        record.version = 4
        record.agentStatus = .completed
        record.agentFinalMessage = "done"
        record.agentClosed = true
        record.principal = "alice"
        let row = try ThreadRow(record)
        #expect(try row.record() == record)
        #expect(ThreadRow.changeableColumns.count == row.changeableValues.count)
        // Read back by column name, as a store reads it.
        struct Columns: ColumnReader {
            let values: [String: ColumnValue]
            func text(_ column: String) throws -> String { guard case let .text(value?) = values[column] else { throw StoreError.unavailable(column) }; return value }
            func optionalText(_ column: String) throws -> String? { guard case let .text(value) = values[column] else { throw StoreError.unavailable(column) }; return value }
            func integer(_ column: String) throws -> Int64 { guard case let .integer(value) = values[column] else { throw StoreError.unavailable(column) }; return value }
            func boolean(_ column: String) throws -> Bool { guard case let .boolean(value) = values[column] else { throw StoreError.unavailable(column) }; return value }
        }
        var columns = Dictionary(uniqueKeysWithValues: zip(ThreadRow.changeableColumns, row.changeableValues))
        columns["id"] = .text(record.id)
        columns["owner"] = .text(record.principal)
        #expect(try ThreadRow(reading: Columns(values: columns)) == row)
    }

    @Test("store errors map to the client's status once: conflicts, lost leases, outages, bad configuration")
    func errorMapping() {
        #expect(StoreError.conflict(threadID: "t", expectedVersion: 0).domainError == .alreadyExists("thread t already exists"))
        guard case .aborted = StoreError.conflict(threadID: "t", expectedVersion: 3).domainError else { Issue.record("stale write"); return }
        guard case let .unavailable(lost) = StoreError.leaseLost(LeaseFence(tree: "t", epoch: 2)).domainError else { Issue.record("lease"); return }
        #expect(lost.contains("agent tree t") && lost.contains("retry"))
        #expect(StoreError.unavailable("disk full").domainError == .unavailable("disk full"))
        #expect(StoreError.misconfigured("--store bad").domainError == .invalidArgument("--store bad"))
        guard case .unavailable = StoreError.wrapping(CocoaError(.fileWriteOutOfSpace)) else { Issue.record("a driver error is an outage"); return }
        #expect(StoreError.wrapping(StoreError.leaseLost(LeaseFence(tree: "t", epoch: 1))) == .leaseLost(LeaseFence(tree: "t", epoch: 1)))
    }
}
