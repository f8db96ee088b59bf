import Testing
@testable import ThreadwireContract
@testable import ThreadwireCore
import ThreadwireWire

/// The enum tables replace exhaustive switches, so check them exhaustively here.
@Suite("domain <-> wire mapping")
struct MappingTests {
    func roundTrips<D: CaseIterable & Equatable, W: Equatable & WireEnum>(_ mapping: EnumMapping<D, W>, _: D.Type) {
        for value in D.allCases {
            #expect(mapping.domain(mapping.wire(value)) == value, "\(value)")
        }
        #expect(mapping.domain(W(rawValue: 0)) == nil, "UNSPECIFIED has no domain meaning")
        #expect(Set(mapping.pairs.map { $0.1.rawValue }).count == D.allCases.count, "one wire value per case")
    }

    @Test("every domain case maps to a distinct wire value and back")
    func tables() {
        roundTrips(Mappings.runtime, MultiAgentRuntime.self)
        roundTrips(Mappings.mode, MultiAgentMode.self)
        roundTrips(Mappings.role, ContextRole.self)
        roundTrips(Mappings.kind, ContextKind.self)
        roundTrips(Mappings.itemType, ItemType.self)
        roundTrips(Mappings.turnStatus, TurnStatus.self)
        roundTrips(Mappings.source, ThreadSourceKind.self)
    }
}

@Suite("kept events sent as kept")
struct KeptEventMethodTests {
    @Test("the method named for a kept event's encoding is the one its payload has, for every kind of event")
    func methodNames() {
        var record = ThreadRecord(id: "t", sessionID: "t", source: .appServer, createdAt: 1, model: "m", cwd: "/")
        record.eventSequence = 3
        let view = ThreadView(record: record, status: .idle, turns: nil, history: nil)
        let turn = TurnRecord(id: "u", threadID: "t", sequence: 0, startedAt: 1, items: [],
                              context: TurnContext(model: "m", runtime: .v2, effectiveMode: nil, cwd: "/"))
        let item = ItemRecord(type: .agentMessage, text: "x")
        let usage = TokenUsage(inputTokens: 1, outputTokens: 1, totalTokens: 2)
        let events: [ThreadEvent] = [
            .threadStarted(view), .statusChanged("t", .idle), .archived("t"), .unarchived("t"), .closed("t"),
            .settingsUpdated("t", view.settings), .turnStarted("t", turn), .turnCompleted("t", turn),
            .itemStarted("t", "u", item), .itemCompleted("t", "u", item), .agentMessageDelta("t", "u", itemID: "i", delta: "d"),
            .serverRequestResolved("t", requestID: "r", .answered), .tokenUsage("t", "u", TokenUsageReport(last: usage, total: usage)),
            .rolledBack("t", ["u"]), .nameUpdated("t", "n"),
        ]
        for event in events {
            let payload = NotificationMapping.payload(event, baseInstructions: { _ in "" })
            #expect(payload != nil)
            #expect(NotificationMapping.methodName(event) == payload?.methodName, "\(event)")
        }
    }
}
