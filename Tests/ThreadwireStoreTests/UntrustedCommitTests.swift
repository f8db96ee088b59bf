import Foundation
import Logging
import Testing
import ThreadwireCore
import ThreadwireModels
import ThreadwirePostgres
import ThreadwireTesting

/// What an instance serves after a commit it cannot trust, on real
/// PostgreSQL with real leases (one instance, driven without sockets).
@Suite("commits whose outcome is unknown (PostgreSQL)")
struct UntrustedCommitTests {
    /// Found by the chaos suite ("PostgreSQL fsync slowed", a stale read):
    /// a commit timed out, its thread was unloaded and loaded again under
    /// the same lease (another thread of the tree kept it held) before the
    /// commit landed, and the stale state was then served under a valid lease.
    @Test("an update whose outcome is unknown lands later: the thread, loaded again meanwhile while another thread of its tree stays loaded, shows it and takes the next update")
    func unconfirmedUpdateLandsLater() async throws {
        let url = try await PostgresCluster.database()
        // 5 s: short enough to wait out once, long enough that the loads and
        // commits meant to succeed do so in a full run on 2 cores (at 1 s, a
        // load timed out there: CI of bb2ab2d).
        let store = try await PostgresThreadStore.connect(url: url, logger: Logger(label: "untrusted"), operationTimeout: .seconds(5))
        defer { store.close() }
        let coordinator = PostgresLeaseCoordinator(store: store, address: "127.0.0.1:9", leaseDuration: .seconds(30))
        let engine = ThreadEngine(store: store, backend: ScriptedEchoBackend(), settings: ServerSettings(), sink: RecordingSink(),
                                  coordinator: coordinator)
        let root = try await engine.startThread(.init(), connection: 1).value.record.id
        // A turn resolves the runtime, which a spawn needs.
        try await engine.startTurn(root, .init(input: ["hi"]), connection: 1).publish()
        let giveUp = ContinuousClock.now + .seconds(30)
        while try await engine.readThread(root, includeTurns: true, includeModelRequests: false).turns?.last?.status == .inProgress,
              ContinuousClock.now < giveUp {
            try await Task.sleep(for: .milliseconds(10))
        }
        // A child keeps the tree held here whatever becomes of the root.
        let child = try await engine.spawnAgent(parentID: root, .init(), connection: 1).value.record.id
        #expect(engine.published(child) != nil)

        let locker = try await RowLocker.lock(root, url: url)

        var late = ThreadEngine.SettingsUpdate()
        late.model = "landed late"
        do {
            _ = try await engine.updateSettings(root, late)
            Issue.record("the update completed while its row was locked")
        } catch let DomainError.unavailable(message) {
            #expect(message.contains("may or may not"), "\(message)")
        }
        // The statement still waits in PostgreSQL. A command loads the root
        // again meanwhile; then the row is released and the update lands.
        let reload = Task { try await engine.resumeThread(root, model: nil, excludeTurns: true, connection: 2) }
        try await Task.sleep(for: .milliseconds(500))
        try await locker.release()
        _ = try await reload.value
        #expect(try await store.threadRecord(root)?.model == "landed late", "the abandoned update landed")

        let read = try await engine.readThread(root, includeTurns: false, includeModelRequests: false)
        #expect(read.record.model == "landed late", "the thread is served as stored, not as loaded before the update landed")
        var next = ThreadEngine.SettingsUpdate()
        next.cwd = "/after"
        _ = try await engine.updateSettings(root, next)
        #expect(try await store.threadRecord(root)?.cwd == "/after")
        #expect(try await store.threadRecord(root)?.model == "landed late")
    }
}
