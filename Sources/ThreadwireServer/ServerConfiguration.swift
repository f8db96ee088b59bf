import Foundation
public import Logging
import Metrics
import Synchronization
import NIOConcurrencyHelpers
public import NIOCore
public import ServiceLifecycle
public import ThreadwireCore
import ThreadwireNIO
public import ThreadwireTransport
import ThreadwireWire

public struct ServerConfiguration: Sendable {
    public var host = "127.0.0.1"
    public var port = 7420
    public var limits = ServerLimits()
    public var idleUnloadSeconds = 1800.0
    /// How long connections get for a last flush after in-flight requests end.
    public var finalFlush: Duration = .milliseconds(500)
    /// Write every inbound frame to this capture file.
    public var recordPath: String?
    /// Bearer tokens (see `Authenticator`); disabled by default.
    public var authenticator: Authenticator = .disabled
    /// Serve a non-loopback address without authentication anyway.
    public var allowUnauthenticated = false
    /// The operator's MCP tool servers (nil: none).
    public var toolServers: (any ToolServerHost)?
    /// This instance's requests by method for cluster/status, read from the
    /// process's metrics (the registry belongs to the executable) and the
    /// request latency histograms the server keeps itself, given as text.
    public var requestLoad: @Sendable (_ requestLatencies: String) -> [RequestLoad] = { _ in [] }
    /// TLS (and mutual TLS) for every connection; plain TCP when nil.
    public var tls: ServerTLS?
    /// How clients reach the server; nil: TCP on `host`:`port` (with `tls`).
    /// An `InProcessTransport` serves connections made inside the process.
    public var transport: (any ServerTransport)?
    /// Several instances on one store: who owns which agent tree (nil: this
    /// process owns everything), and how requests reach the owner.
    public var coordinator: (any OwnershipCoordinator)?
    public var peers = PeerSettings()
    /// A listener of the instances' own (`--peer-listen`): relays come only
    /// there, and the client listener refuses a peer hello as it refuses a
    /// bad token, so the cluster's secret never works where clients connect.
    public var peerListen: (host: String, port: Int)?
    /// How long idempotency keys (and the answers stored with them) are kept at least.
    public var idempotencyRetention: Duration = .seconds(24 * 3600)
    public init() {}

    /// A server reachable from other machines must authenticate, unless the
    /// operator says otherwise on purpose.
    public func validateExposure() throws {
        guard !Self.isLoopback(host), !authenticator.isEnabled, tls?.clientCAFile == nil, !allowUnauthenticated else { return }
        throw ExposureError(description: """
            refusing to listen on \(host):\(port) without authentication: any client that reaches it could read and change every thread. \
            Configure tokens (--auth-tokens FILE or THREADWIRE_AUTH_TOKEN) or client certificates (--tls-client-ca), or pass --allow-unauthenticated if the network is trusted \
            (for example inside a service mesh that authenticates).
            """)
    }

    public static func isLoopback(_ host: String) -> Bool {
        host == "localhost" || host == "::1" || host == "[::1]" || host.hasPrefix("127.")
    }
}

public struct ExposureError: Error, CustomStringConvertible {
    public let description: String
}
