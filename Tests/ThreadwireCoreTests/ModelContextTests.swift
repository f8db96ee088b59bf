import Foundation
import Testing
@testable import ThreadwireCore

/// What the model is shown of an append-only history (no I/O).
@Suite("model context: summaries and rollback markers")
struct ModelContextTests {
    static func user(_ text: String) -> ContextItem { ContextItem(role: .user, kind: .userInput, text: text) }
    static func answer(_ text: String) -> ContextItem { ContextItem(role: .assistant, kind: .assistantMessage, text: text) }
    static func summary(_ text: String) -> ContextItem { ContextItem(role: .user, kind: .compactionSummary, text: text) }
    static func rollback(from: Int) -> ContextItem { ContextItem(role: .developer, kind: .rollbackMarker, text: "", rollsBackFrom: from) }

    static func texts(_ history: [ContextItem], prefix: Int? = nil) -> [String] {
        ModelContext.visible(history.prefix(prefix ?? history.count)).map(\.text)
    }

    @Test("a plain history is shown whole")
    func plain() {
        #expect(Self.texts([Self.user("a"), Self.answer("A")]) == ["a", "A"])
        #expect(Self.texts([]) == [])
    }

    @Test("a summary hides everything before it; what follows it stays")
    func summaryHidesTheEarlier() {
        let history = [Self.user("a"), Self.answer("A"), Self.summary("S"), Self.user("b")]
        #expect(Self.texts(history) == ["S", "b"])
        #expect(Self.texts(history, prefix: 2) == ["a", "A"], "an earlier request's prefix is shown as it was")
        #expect(Self.texts(history + [Self.summary("S2"), Self.user("c")]) == ["S2", "c"], "the newest summary wins")
    }

    @Test("a rollback marker hides its range and is never shown")
    func rollbackHidesARange() {
        let history = [Self.user("a"), Self.answer("A"), Self.user("b"), Self.answer("B"), Self.rollback(from: 2), Self.user("c")]
        #expect(Self.texts(history) == ["a", "A", "c"])
        #expect(ModelContext.visibleIndices(history[...]) == [0, 1, 5])
    }

    @Test("rolling back past a summary restores the context from before it")
    func rollbackAcrossASummary() {
        let history = [Self.user("a"), Self.answer("A"), Self.summary("S"), Self.user("b"), Self.rollback(from: 2), Self.user("c")]
        #expect(Self.texts(history) == ["a", "A", "c"])
        let nested = [Self.user("a"), Self.user("b"), Self.rollback(from: 1), Self.user("c"), Self.rollback(from: 0), Self.user("d")]
        #expect(Self.texts(nested) == ["d"])
    }
}

@Suite("rollout timestamps")
struct RolloutTimestampTests {
    @Test("codex's UTC timestamps are read as Foundation reads them, by hand; other forms fall back to Foundation")
    func sameAsFoundation() {
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        for text in ["2026-05-01T10:00:00.000Z", "2024-02-29T23:59:59.999Z", "2000-03-01T00:00:00.5Z", "1970-01-01T00:00:00.000Z",
                     "2099-12-31T12:34:56.123Z", "1969-12-31T23:59:59.250Z"] {
            let expected = formatter.date(from: text).map { Millis(($0.timeIntervalSince1970 * 1000).rounded()) }
            #expect(RolloutParser.parseTimestamp(text) == expected, "\(text)")
        }
        #expect(RolloutParser.parseTimestamp("2026-05-01T10:00:00Z") == 1_777_629_600_000)
        #expect(RolloutParser.parseTimestamp("2026-05-01T12:00:00+02:00") == 1_777_629_600_000)
        #expect(RolloutParser.parseTimestamp("yesterday") == nil)
    }
}

@Suite("ids")
struct IDTests {
    @Test("newID is a UUIDv7: 8-4-4-4-12 lowercase hex, version 7, RFC variant, ordered by creation time, unique")
    func uuidV7() async throws {
        var seen = Set<String>()
        var previous = ""
        for round in 0..<2000 {
            let id = newID()
            let parts = id.split(separator: "-").map(String.init)
            #expect(parts.map(\.count) == [8, 4, 4, 4, 12], "\(id)")
            #expect(id.allSatisfy { "0123456789abcdef-".contains($0) })
            #expect(parts[2].first == "7" && "89ab".contains(parts[3].first!))
            #expect(seen.insert(id).inserted)
            if round % 500 == 0 {
                try await Task.sleep(for: .milliseconds(2))
                let later = newID()
                #expect(later.prefix(13) >= id.prefix(13) && later.prefix(13) > previous.prefix(13))
                previous = later
            }
        }
    }
}
