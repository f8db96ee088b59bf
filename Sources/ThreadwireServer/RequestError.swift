import ThreadwireCore
import ThreadwireWire

/// gRPC status codes carried in Response.code.
public enum StatusCode: UInt32, Sendable {
    case ok = 0, cancelled = 1, unknown = 2, invalidArgument = 3, deadlineExceeded = 4, notFound = 5
    case alreadyExists = 6, permissionDenied = 7, resourceExhausted = 8, failedPrecondition = 9, aborted = 10
    case outOfRange = 11, unimplemented = 12, `internal` = 13, unavailable = 14, dataLoss = 15, unauthenticated = 16

    /// The code's name as gRPC spells it (NOT_FOUND): the label metrics use.
    public var name: String {
        switch self {
        case .ok: "OK"
        case .cancelled: "CANCELLED"
        case .unknown: "UNKNOWN"
        case .invalidArgument: "INVALID_ARGUMENT"
        case .deadlineExceeded: "DEADLINE_EXCEEDED"
        case .notFound: "NOT_FOUND"
        case .alreadyExists: "ALREADY_EXISTS"
        case .permissionDenied: "PERMISSION_DENIED"
        case .resourceExhausted: "RESOURCE_EXHAUSTED"
        case .failedPrecondition: "FAILED_PRECONDITION"
        case .aborted: "ABORTED"
        case .outOfRange: "OUT_OF_RANGE"
        case .unimplemented: "UNIMPLEMENTED"
        case .internal: "INTERNAL"
        case .unavailable: "UNAVAILABLE"
        case .dataLoss: "DATA_LOSS"
        case .unauthenticated: "UNAUTHENTICATED"
        }
    }
}

/// A request's failure as the client sees it.
public struct RequestError: Error, Sendable, Equatable {
    public var code: StatusCode
    public var message: String

    public init(_ code: StatusCode, _ message: String) {
        self.code = code
        self.message = message
    }

    /// The one place errors become status codes. Anything unexpected is
    /// INTERNAL with a generic message; the caller logs the full error.
    public init(_ error: any Error) {
        switch error {
        case let error as RequestError:
            self = error
        case let error as DomainError:
            switch error {
            case let .invalidArgument(m): self.init(.invalidArgument, m)
            case let .notFound(m): self.init(.notFound, m)
            case let .failedPrecondition(m): self.init(.failedPrecondition, m)
            case let .resourceExhausted(m): self.init(.resourceExhausted, m)
            case let .alreadyExists(m): self.init(.alreadyExists, m)
            case let .aborted(m): self.init(.aborted, m)
            case let .outOfRange(m): self.init(.outOfRange, m)
            case let .unavailable(m): self.init(.unavailable, m)
            case let .internal(m): self.init(.internal, m)
            }
        case let error as StoreError:
            self.init(error.domainError)
        case let error as IdempotencyKeyTaken:
            self.init(.aborted, error.description + "; repeat the request to get the first one's answer")
        case let error as WireError:
            self.init(.invalidArgument, error.description)
        default:
            self.init(.internal, "internal error")
        }
    }
}
