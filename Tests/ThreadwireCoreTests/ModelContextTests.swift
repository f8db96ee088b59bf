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
