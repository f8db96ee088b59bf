import Testing
@testable import ThreadwireContract
import ThreadwireCore
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
