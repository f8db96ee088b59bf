/// A request-scoped failure whose message reaches the client. The server maps
/// each case to one status code, in one place.
public enum DomainError: Error, Equatable, CustomStringConvertible {
    case invalidArgument(String)
    case notFound(String)
    case failedPrecondition(String)
    case resourceExhausted(String)
    case alreadyExists(String)
    /// A concurrency conflict the caller may retry (e.g. a refused stale write).
    case aborted(String)
    /// A position outside what is kept (a resume after a trimmed event).
    case outOfRange(String)
    case unavailable(String)
    case `internal`(String)

    public var description: String {
        switch self {
        case let .invalidArgument(m), let .notFound(m), let .failedPrecondition(m),
             let .resourceExhausted(m), let .alreadyExists(m), let .aborted(m), let .outOfRange(m), let .unavailable(m), let .internal(m):
            return m
        }
    }
}
