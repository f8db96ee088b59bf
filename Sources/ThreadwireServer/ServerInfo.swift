public import ThreadwireCore
import ThreadwireWire

/// Facts about the server that initialize and health/check report.
public struct ServerInfo: Sendable {
    public var name = "threadwire"
    public var version = ThreadwireRelease.version
    public var protocolVersion: UInt32 = 1
    public var limits: ServerLimits
    public var draining: @Sendable () -> Bool
    public var storeHealthy: @Sendable () -> Bool
    public var settings = ServerSettings()
    public var authenticator: Authenticator = .disabled
    /// Mutual TLS: a verified client certificate names the principal.
    public var clientCertificatesName = false
    /// Until initialize succeeds on a server that authenticates, frames are
    /// capped at this size, so an unauthenticated client cannot make the
    /// server buffer much.
    public var unauthenticatedMaxFrameBytes = 65_536
    /// The cluster's shared secrets other instances may present when they
    /// relay requests (several instances on one store); empty: none.
    public var peerTokens: [[UInt8]] = []
    /// Relays come on a listener of their own (`--peer-listen`).
    public var hasPeerListener = false
    /// Several instances share the store: requests for threads another
    /// instance owns are relayed there.
    public var relays = false
    /// This instance's requests by method (cluster/status).
    public var requestLoad: @Sendable () -> [RequestLoad] = { [] }
    /// Files being imported in several requests (thread/import).
    let imports: ImportSessions

    /// Whether connections act as distinct principals (tokens or client
    /// certificates); otherwise everything belongs to one principal.
    public var authenticates: Bool { authenticator.isEnabled || clientCertificatesName }

    public init(limits: ServerLimits, draining: @escaping @Sendable () -> Bool, storeHealthy: @escaping @Sendable () -> Bool = { true },
                defaultModel: String = ServerSettings().defaultModel) {
        imports = ImportSessions(defaultModel: defaultModel)
        self.limits = limits
        self.draining = draining
        self.storeHealthy = storeHealthy
    }
}
