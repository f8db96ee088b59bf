/// An array stored in fixed-size chunks, each copy-on-write on its own.
///
/// A thread's turns and history only grow, and every change is published as
/// a snapshot that shares them while the engine goes on mutating its copy. A
/// plain Array then copies every element (a 10,000-turn thread copied 10,000
/// turns for each item added). Here a mutation copies the chunk table (one
/// reference per `chunkSize` elements) and the one chunk it touches, so the
/// cost of a change stays flat as the thread grows.
public struct ChunkedArray<Element> {
    @usableFromInline static var chunkSize: Int { 64 }
    @usableFromInline var chunks: [[Element]]
    public private(set) var count: Int

    public init() {
        chunks = []
        count = 0
    }

    public init<S: Sequence>(_ elements: S) where S.Element == Element {
        self.init()
        append(contentsOf: elements)
    }

    /// The elements as a plain Array (a full copy).
    public var array: [Element] { chunks.flatMap { $0 } }
}

extension ChunkedArray: RandomAccessCollection, MutableCollection {
    public var startIndex: Int { 0 }
    public var endIndex: Int { count }

    public subscript(position: Int) -> Element {
        // Read in place: `turns[i].status` does not copy the whole turn.
        _read {
            precondition(position >= 0 && position < count, "ChunkedArray index \(position) out of range 0..<\(count)")
            yield chunks[position / Self.chunkSize][position % Self.chunkSize]
        }
        _modify {
            precondition(position >= 0 && position < count, "ChunkedArray index \(position) out of range 0..<\(count)")
            yield &chunks[position / Self.chunkSize][position % Self.chunkSize]
        }
        set {
            precondition(position >= 0 && position < count, "ChunkedArray index \(position) out of range 0..<\(count)")
            chunks[position / Self.chunkSize][position % Self.chunkSize] = newValue
        }
    }
}

extension ChunkedArray: RangeReplaceableCollection {
    public mutating func append(_ element: Element) {
        if count % Self.chunkSize == 0 {
            var chunk: [Element] = []
            chunk.reserveCapacity(Self.chunkSize)
            chunk.append(element)
            chunks.append(chunk)
        } else {
            chunks[chunks.count - 1].append(element)
        }
        count += 1
    }

    public mutating func append<S: Sequence>(contentsOf elements: S) where S.Element == Element {
        for element in elements { append(element) }
    }

    /// Rare (rewrites are not how threads change): rebuilt through an Array.
    public mutating func replaceSubrange<C: Collection>(_ subrange: Range<Int>, with newElements: C) where C.Element == Element {
        if subrange.lowerBound == count && subrange.isEmpty {
            append(contentsOf: newElements)
            return
        }
        var all = array
        all.replaceSubrange(subrange, with: newElements)
        self = ChunkedArray(all)
    }
}

extension ChunkedArray: ExpressibleByArrayLiteral {
    public init(arrayLiteral elements: Element...) { self.init(elements) }
}

extension ChunkedArray: Equatable where Element: Equatable {
    public static func == (lhs: Self, rhs: Self) -> Bool { lhs.count == rhs.count && lhs.chunks == rhs.chunks }
}

extension ChunkedArray: Sendable where Element: Sendable {}

extension ChunkedArray: CustomStringConvertible {
    public var description: String { array.description }
}
