import Foundation
public import ThreadwireCore

/// How both stores keep an `IdempotencyClaim`'s turn ids: one text column,
/// a JSON array (ids are opaque strings).
public enum IdempotencyRows {
    public static func turnIDs(_ ids: [TurnID]) -> String {
        String(decoding: (try? JSONEncoder().encode(ids)) ?? Data("[]".utf8), as: UTF8.self)
    }

    public static func turnIDs(_ column: String) -> [TurnID] {
        (try? JSONDecoder().decode([TurnID].self, from: Data(column.utf8))) ?? []
    }
}
