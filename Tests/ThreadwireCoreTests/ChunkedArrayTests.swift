import Testing
@testable import ThreadwireCore

@Suite("ChunkedArray")
struct ChunkedArrayTests {
    @Test("behaves as an Array under random appends, writes, replacements and copies")
    func matchesArray() {
        var generator = SystemRandomNumberGenerator()
        var chunked = ChunkedArray<Int>()
        var plain: [Int] = []
        var snapshots: [(ChunkedArray<Int>, [Int])] = []
        for step in 0..<5_000 {
            switch Int.random(in: 0..<10, using: &generator) {
            case 0..<5:
                chunked.append(step); plain.append(step)
            case 5..<7 where !plain.isEmpty:
                let index = Int.random(in: 0..<plain.count, using: &generator)
                chunked[index] += 1; plain[index] += 1
            case 7:
                let more = (0..<Int.random(in: 0..<150, using: &generator)).map { $0 * 3 }
                chunked.append(contentsOf: more); plain.append(contentsOf: more)
            case 8 where plain.count > 10:
                let lower = Int.random(in: 0..<plain.count - 5, using: &generator)
                chunked.replaceSubrange(lower..<lower + 3, with: [-1]); plain.replaceSubrange(lower..<lower + 3, with: [-1])
            default:
                snapshots.append((chunked, plain))
            }
            #expect(chunked.count == plain.count)
        }
        #expect(Array(chunked) == plain)
        #expect(chunked.array == plain)
        #expect(chunked == ChunkedArray(plain))
        #expect(Array(chunked.suffix(70)) == Array(plain.suffix(70)))
        #expect(chunked.lastIndex(of: -1) == plain.lastIndex(of: -1))
        // A copy never sees later changes to the original (copy-on-write per chunk).
        for (copy, expected) in snapshots { #expect(copy.array == expected) }
    }
}
