import Foundation
public import Logging
import PostgresNIO
import Synchronization
public import ThreadwireCore

/// Agent-tree leases in PostgreSQL's `thread_leases` (owner instance,
/// advertised address, epoch, expiry). The database's clock decides expiry,
/// so instances need no synchronised clocks; every grant raises the epoch,
/// which fenced commits check (`PostgresThreadStore.commit(_:fence:)`).
public final class PostgresLeaseCoordinator: OwnershipCoordinator {
    private let store: PostgresThreadStore
    /// Unique per process: a restarted instance never mistakes its former
    /// self's leases for its own.
    public let instanceID: String
    /// HOST:PORT where other instances reach this one (a port 0 is filled
    /// in once the listener is bound).
    public var address: String { advertised.withLock { $0 } }
    private let advertised: Mutex<String>
    public let leaseDuration: Duration
    /// The budgets every instance on this store shares.
    public let sharedQuotas: (any SharedQuotaLedger)?

    public init(store: PostgresThreadStore, address: String, leaseDuration: Duration) {
        self.store = store
        advertised = Mutex(address)
        self.leaseDuration = leaseDuration
        instanceID = UUID().uuidString.lowercased()
        sharedQuotas = PostgresQuotaLedger(store: store)
    }

    public func bound(port: Int) {
        advertised.withLock { address in
            guard address.hasSuffix(":0"), let colon = address.lastIndex(of: ":") else { return }
            address = address[..<colon] + ":\(port)"
        }
    }

    private var seconds: Double {
        let (whole, fraction) = leaseDuration.components
        return Double(whole) + Double(fraction) / 1e18
    }

    /// The previous process at this address is gone (this one bound its
    /// port): its leases are expired now instead of after their duration.
    public func start() async throws -> Int {
        var expired = 0
        for try await _ in try await store.client.query("""
            UPDATE thread_leases SET expires_at = now() WHERE address = \(address) AND instance_id <> \(instanceID)
                AND expires_at > now() RETURNING tree
            """, logger: store.logger) {
            expired += 1
        }
        return expired
    }

    public func acquire(_ tree: ThreadID) async throws -> LeaseClaim {
        // A lease seen live may expire before the second read: look again.
        for _ in 0..<3 {
            for try await epoch in try await store.client.query("""
                INSERT INTO thread_leases AS l (tree, instance_id, address, epoch, expires_at)
                VALUES (\(tree), \(instanceID), \(address), 1, now() + make_interval(secs => \(seconds)))
                ON CONFLICT (tree) DO UPDATE SET instance_id = EXCLUDED.instance_id, address = EXCLUDED.address,
                    epoch = l.epoch + 1, expires_at = EXCLUDED.expires_at
                WHERE l.expires_at <= now() OR l.instance_id = EXCLUDED.instance_id
                RETURNING epoch
                """, logger: store.logger).decode(Int64.self) {
                return .held(LeaseFence(tree: tree, epoch: epoch))
            }
            for try await holder in try await store.client.query(
                "SELECT address FROM thread_leases WHERE tree = \(tree) AND expires_at > now()", logger: store.logger
            ).decode(String.self) {
                return .elsewhere(address: holder)
            }
        }
        throw StoreError.unavailable("the lease of agent tree \(tree) changed hands three times while being claimed")
    }

    public func renew(_ fences: [LeaseFence]) async throws -> Set<LeaseFence> {
        guard !fences.isEmpty else { return [] }
        var renewed: Set<LeaseFence> = []
        for try await (tree, epoch) in try await store.client.query("""
            WITH locked AS (
                SELECT tree FROM thread_leases
                WHERE instance_id = \(instanceID) AND expires_at > now() AND tree = ANY(\(fences.map(\.tree)))
                ORDER BY tree FOR NO KEY UPDATE)
            UPDATE thread_leases l SET expires_at = now() + make_interval(secs => \(seconds))
            FROM locked WHERE l.tree = locked.tree
            RETURNING l.tree, l.epoch
            """, logger: store.logger).decode((String, Int64).self) {
            renewed.insert(LeaseFence(tree: tree, epoch: epoch))
        }
        return renewed
    }

    public func release(_ fences: [LeaseFence]) async {
        guard !fences.isEmpty else { return }
        do {
            try await store.client.query("""
                WITH locked AS (
                    SELECT l.tree FROM thread_leases l
                    JOIN unnest(\(fences.map(\.tree))::text[], \(fences.map(\.epoch))::bigint[]) AS r(tree, epoch)
                        ON l.tree = r.tree AND l.epoch = r.epoch
                    WHERE l.instance_id = \(instanceID)
                    ORDER BY l.tree FOR NO KEY UPDATE OF l)
                UPDATE thread_leases AS l SET expires_at = now() FROM locked WHERE l.tree = locked.tree
                """, logger: store.logger)
        } catch {
            // Unreleased, a lease simply expires.
            store.logger.warning("could not release leases", metadata: ["tw.error": "\(String(reflecting: error))"])
        }
    }

    public func holder(_ tree: ThreadID) async throws -> String? {
        for try await address in try await store.client.query(
            "SELECT address FROM thread_leases WHERE tree = \(tree) AND expires_at > now() AND instance_id <> \(instanceID)",
            logger: store.logger
        ).decode(String.self) {
            return address
        }
        return nil
    }

    public func liveLeases(limit: Int) async throws -> LeaseTable {
        var leases: [LeaseTable.Lease] = []
        for try await (tree, instance, address, epoch, expiresInMs) in try await store.client.query("""
            SELECT tree, instance_id, address, epoch, (extract(epoch FROM expires_at - now()) * 1000)::bigint
            FROM thread_leases WHERE expires_at > now() ORDER BY tree LIMIT \(limit)
            """, logger: store.logger).decode((String, String, String, Int64, Int64).self) {
            leases.append(LeaseTable.Lease(tree: tree, instanceID: instance, address: address, epoch: epoch, expiresInMs: max(0, expiresInMs)))
        }
        var holders: [LeaseTable.Holder] = []
        for try await (instance, address, count) in try await store.client.query("""
            SELECT instance_id, min(address), count(*) FROM thread_leases WHERE expires_at > now()
            GROUP BY instance_id ORDER BY min(address), instance_id
            """, logger: store.logger).decode((String, String, Int64).self) {
            holders.append(LeaseTable.Holder(instanceID: instance, address: address, liveLeases: Int(count)))
        }
        return LeaseTable(leases: leases, holders: holders)
    }

    public func probe() async throws {
        try await store.client.query("SELECT 1", logger: store.logger)
    }

    public func orphanedRunningThreads() async throws -> [ThreadID] {
        var ids: [ThreadID] = []
        for try await id in try await store.client.query("""
            SELECT DISTINCT t.thread_id FROM turns t JOIN threads th ON th.id = t.thread_id
            LEFT JOIN thread_leases l ON l.tree = th.session_id
            WHERE t.status = 'inProgress' AND (l.tree IS NULL OR l.expires_at <= now())
            ORDER BY t.thread_id
            """, logger: store.logger).decode(String.self) {
            ids.append(id)
        }
        return ids
    }
}
