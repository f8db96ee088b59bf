import Foundation
import Logging
import PostgresNIO
public import ThreadwireCore

/// Per-principal budgets that every instance on the store shares, so N
/// instances give a principal one budget, not N. Token buckets are rows
/// (`quota_buckets`) whose refill the database's clock measures; running
/// turns are counted from the turns themselves (status inProgress, under a
/// live lease) plus reservations of turns being started
/// (`turn_reservations`), under a per-principal advisory lock so two
/// instances starting turns at once cannot both take the last slot.
public final class PostgresQuotaLedger: SharedQuotaLedger {
    private let store: PostgresThreadStore
    /// A reservation outlives its instance by at most this long.
    private let reservationSeconds: Double = 60

    public init(store: PostgresThreadStore) {
        self.store = store
    }

    static let schema: [String] = [
        """
        CREATE TABLE quota_buckets (principal TEXT NOT NULL, bucket TEXT NOT NULL, tokens DOUBLE PRECISION NOT NULL,
            refreshed_at TIMESTAMPTZ NOT NULL, PRIMARY KEY (principal, bucket))
        """,
        """
        CREATE TABLE turn_reservations (id TEXT PRIMARY KEY, principal TEXT NOT NULL, thread_id TEXT NOT NULL,
            expires_at TIMESTAMPTZ NOT NULL)
        """,
        "CREATE INDEX turn_reservations_principal ON turn_reservations (principal)",
        // The row lock orders takers; the time is read once the lock is
        // held, so no refill is counted twice.
        """
        CREATE FUNCTION threadwire_take_tokens(p_principal TEXT, p_bucket TEXT, p_capacity DOUBLE PRECISION,
            p_rate DOUBLE PRECISION, p_count BIGINT) RETURNS TABLE (given BIGINT, left_over DOUBLE PRECISION)
        LANGUAGE plpgsql AS $$
        DECLARE
            v_now TIMESTAMPTZ;
            v_level DOUBLE PRECISION;
            v_given BIGINT;
        BEGIN
            INSERT INTO quota_buckets (principal, bucket, tokens, refreshed_at)
                VALUES (p_principal, p_bucket, p_capacity, clock_timestamp())
                ON CONFLICT (principal, bucket) DO NOTHING;
            PERFORM 1 FROM quota_buckets q WHERE q.principal = p_principal AND q.bucket = p_bucket FOR UPDATE;
            v_now := clock_timestamp();
            SELECT LEAST(p_capacity, q.tokens + GREATEST(0, EXTRACT(EPOCH FROM (v_now - q.refreshed_at))::DOUBLE PRECISION) * p_rate)
                INTO v_level FROM quota_buckets q WHERE q.principal = p_principal AND q.bucket = p_bucket;
            v_given := GREATEST(0, LEAST(p_count, floor(v_level)::BIGINT));
            UPDATE quota_buckets SET tokens = v_level - v_given, refreshed_at = v_now
                WHERE principal = p_principal AND bucket = p_bucket;
            RETURN QUERY SELECT v_given, v_level - v_given;
        END
        $$
        """,
    ]

    public func take(_ count: Int, from bucket: QuotaBucket, of principal: Principal) async throws -> QuotaGrant {
        try await store.bounded("a quota's tokens") { [store] in
            var grant = QuotaGrant(granted: 0, available: 0)
            for try await (given, left) in try await store.client.query("""
                SELECT given, left_over FROM threadwire_take_tokens(\(principal), \(bucket.name), \(bucket.capacity), \
                \(bucket.perSecond), \(count))
                """, logger: store.logger).decode((Int64, Double).self) {
                grant = QuotaGrant(granted: Int(given), available: left)
            }
            return grant
        }
    }

    public func giveBack(_ count: Int, to bucket: QuotaBucket, of principal: Principal) async {
        _ = try? await store.bounded("a quota's refund") { [store] in
            try await store.client.query("""
                UPDATE quota_buckets SET tokens = LEAST(\(bucket.capacity), tokens + \(Double(count)))
                WHERE principal = \(principal) AND bucket = \(bucket.name)
                """, logger: store.logger)
        }
    }

    public func reserveTurn(on thread: ThreadID, of principal: Principal, limit: Int) async throws -> TurnReservation {
        let seconds = reservationSeconds
        return try await store.bounded("a running turn's reservation") { [store] in
            try await store.client.withTransaction(logger: store.logger) { connection in
                try await connection.query("SELECT pg_advisory_xact_lock(hashtextextended(\("tw-turns:" + principal), 0))",
                                           logger: store.logger)
                try await connection.query("DELETE FROM turn_reservations WHERE principal = \(principal) AND expires_at <= now()",
                                           logger: store.logger)
                var running = 0
                for try await count in try await connection.query("""
                    SELECT ((SELECT count(*) FROM turns t JOIN threads h ON h.id = t.thread_id
                                JOIN thread_leases l ON l.tree = h.session_id
                             WHERE t.status = 'inProgress' AND h.owner = \(principal) AND l.expires_at > now()
                                AND t.thread_id <> \(thread))
                          + (SELECT count(*) FROM turn_reservations r WHERE r.principal = \(principal) AND r.thread_id <> \(thread)
                             AND NOT EXISTS (SELECT 1 FROM turns t WHERE t.thread_id = r.thread_id AND t.status = 'inProgress')))::BIGINT
                    """, logger: store.logger).decode(Int64.self) {
                    running = Int(count)
                }
                guard running < limit else { return .refused(running: running) }
                let id = UUID().uuidString.lowercased()
                try await connection.query("""
                    INSERT INTO turn_reservations (id, principal, thread_id, expires_at)
                    VALUES (\(id), \(principal), \(thread), now() + make_interval(secs => \(seconds)))
                    """, logger: store.logger)
                return .held(id: id)
            }
        }
    }

    public func end(_ reservation: TurnReservation) async {
        guard case let .held(id) = reservation else { return }
        // Not deleted (the store is away): it expires, counted until then.
        _ = try? await store.bounded("a running turn's reservation") { [store] in
            try await store.client.query("DELETE FROM turn_reservations WHERE id = \(id)", logger: store.logger)
        }
    }
}
