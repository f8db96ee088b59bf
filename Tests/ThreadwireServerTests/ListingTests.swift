import Foundation
import Testing
import ThreadwireServerTesting
import ThreadwireClient
import ThreadwireWire

/// thread/items/list and thread/loaded/list, over the real protocol against
/// the in-process server and its SQLite store.
@Suite("items across turns, loaded threads (real server)", .timeLimit(.minutes(3)))
struct ListingTests {
    func items(_ client: ThreadwireClient, _ params: Wire.ThreadItemsListParams) async throws -> Wire.ThreadItemsListResult {
        guard case let .threadItemsList(result) = try await client.result(.threadItemsList(params)) else {
            throw UnexpectedResult(expected: "thread/items/list")
        }
        return result
    }

    /// Every page, following next_cursor.
    func allItems(_ client: ThreadwireClient, _ id: String, limit: UInt32, direction: Wire.SortDirection? = nil,
                  rolledBack: Bool? = nil) async throws -> [Wire.TurnItem] {
        var all: [Wire.TurnItem] = []
        var cursor: String?
        repeat {
            let page = try await items(client, Wire.ThreadItemsListParams(threadId: id, cursor: cursor, limit: limit, sortDirection: direction,
                                                                           includeRolledBack: rolledBack))
            #expect(page.data.count <= Int(limit))
            all += page.data
            cursor = page.nextCursor
        } while cursor != nil
        return all
    }

    @Test("items of every turn in order at any page size, each with its turn, newest first on request, rolled-back turns only when asked")
    func itemsAcrossTurns() async throws {
        let server = try await InProcessServer.launch()
        let client = try await server.client()
        let id = try #require(try await client.startThread().thread?.id)
        var expected: [(turn: String, text: String?)] = []
        for n in 1...7 {
            let turn = try await client.runTurn(id, "message \(n)")
            expected += turn.items.map { (try! #require(turn.id), $0.text) }
        }
        #expect(expected.count == 14, "a user message and an answer per turn")
        for limit: UInt32 in [1, 2, 3, 5, 14, 50] {
            let all = try await allItems(client, id, limit: limit)
            #expect(all.map(\.turnId) == expected.map(\.turn), "limit \(limit)")
            #expect(all.map { $0.item?.text } == expected.map(\.text), "limit \(limit)")
            let newestFirst = try await allItems(client, id, limit: limit, direction: .descending)
            #expect(newestFirst.map { $0.item?.text } == expected.reversed().map(\.text), "descending, limit \(limit)")
        }
        // The last two turns rolled back: left out unless asked for.
        _ = try await client.result(.threadRollback(Wire.ThreadRollbackParams(threadId: id, numTurns: 2)))
        #expect(try await allItems(client, id, limit: 4).count == 10)
        #expect(try await allItems(client, id, limit: 4, rolledBack: true).count == 14)
        await expectStatus(3, mentioning: "not an item cursor") {
            _ = try await items(client, Wire.ThreadItemsListParams(threadId: id, cursor: "turn:3"))
        }
        await expectStatus(5, mentioning: "not found") { _ = try await items(client, Wire.ThreadItemsListParams(threadId: "nope")) }
    }

    @Test("loaded threads: those in memory here, in id order, paged; an unloaded one leaves the list")
    func loadedThreads() async throws {
        let server = try await InProcessServer.launch(arguments: ["--idle-unload-seconds", "0.2"])
        let client = try await server.client()
        var ids: [String] = []
        for _ in 0..<5 { ids.append(try #require(try await client.startThread().thread?.id)) }
        func loaded(_ cursor: String? = nil, limit: UInt32? = nil) async throws -> Wire.ThreadLoadedListResult {
            guard case let .threadLoadedList(result) = try await client.result(.threadLoadedList(Wire.ThreadLoadedListParams(cursor: cursor, limit: limit))) else {
                throw UnexpectedResult(expected: "thread/loaded/list")
            }
            return result
        }
        #expect(try await loaded().data == ids.sorted())
        let first = try await loaded(limit: 2)
        #expect(first.data == Array(ids.sorted().prefix(2)))
        let rest = try await loaded(first.nextCursor, limit: 10)
        #expect(rest.data == Array(ids.sorted().dropFirst(2)) && rest.nextCursor == nil)

        // Unsubscribed and idle, a thread unloads and leaves the list.
        _ = try await client.result(.threadUnsubscribe(Wire.ThreadUnsubscribeParams(threadId: ids[0])))
        _ = try await waitUntil("thread \(ids[0]) unloaded", timeout: .seconds(20)) {
            try await loaded().data.contains(ids[0]) ? nil : true
        }
        await expectStatus(3, mentioning: "not a cursor") { _ = try await loaded("junk") }
    }
}
