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

/// Renews the leases this instance holds and sweeps for turns a dead
/// instance left running, until graceful shutdown.
public final class LeaseMaintenance: Service, Sendable {
    private let engine: ThreadEngine
    private let listening: AsyncStream<Void>
    private let logger: Logger

    init(engine: ThreadEngine, listening: AsyncStream<Void>, logger: Logger) {
        self.engine = engine
        self.listening = listening
        self.logger = logger
    }

    public func run() async throws {
        let logger = self.logger
        // Not before the frame server listens: its sweep may take leases,
        // and a lease names the address bound (a port 0 resolved). Ends at
        // once if the group is cancelled first.
        for await _ in listening {}
        await cancelWhenGracefulShutdown {
            await self.engine.maintainLeases { logger.notice("\($0)") }
            // One instance alone holds no leases: nothing to do until the end.
            try? await gracefulShutdown()
        }
    }
}

/// Forgets idempotency keys older than the retention window until shutdown.
public final class IdempotencyKeeper: Service, Sendable {
    private let calls: IdempotentCalls
    init(calls: IdempotentCalls) { self.calls = calls }

    public func run() async throws {
        await cancelWhenGracefulShutdown { await self.calls.purgeOldKeys() }
    }
}

/// Forgets what threads keep of their events beyond the retention
/// (`EventRetention`) every `trimEvery`, until shutdown. Every instance
/// may do it: what it deletes is the same whoever does.
public final class EventKeeper: Service, Sendable {
    private let engine: ThreadEngine
    private let period: Duration
    private let logger: Logger
    init(engine: ThreadEngine, period: Duration, logger: Logger) {
        self.engine = engine
        self.period = period
        self.logger = logger
    }

    public func run() async throws {
        await cancelWhenGracefulShutdown {
            let period = self.period
            while !Task.isCancelled {
                try? await Task.sleep(for: period)
                do {
                    let started = ContinuousClock.now
                    let forgotten = try await self.engine.trimEvents()
                    let took = ContinuousClock.now - started
                    // The pass holds the store's writer: its length is what commits waited.
                    self.logger.debug("trimmed old thread events", metadata: [
                        "tw.events": "\(forgotten)",
                        "tw.duration_ms": "\(took.components.seconds * 1000 + took.components.attoseconds / 1_000_000_000_000_000)",
                    ])
                } catch where !Task.isCancelled {
                    self.logger.warning("old thread events not trimmed", metadata: ["tw.error": "\(error)"])
                } catch {}
            }
        }
    }
}

/// A flag set once (the drain began), read from any thread.
final class OnceFlag: Sendable {
    private let flag = Atomic<Bool>(false)
    var value: Bool { flag.load(ordering: .acquiring) }
    func set() { flag.store(true, ordering: .releasing) }
}

/// Something that happens once, awaited by whoever needs it to have happened.
final class OnceEvent: Sendable {
    private let state = NIOLockedValueBox<(happened: Bool, waiters: [CheckedContinuation<Void, Never>])>((false, []))

    func happen() {
        let waiters = state.withLockedValue { state -> [CheckedContinuation<Void, Never>] in
            state.happened = true
            defer { state.waiters.removeAll() }
            return state.waiters
        }
        for waiter in waiters { waiter.resume() }
    }

    func wait() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let happened = state.withLockedValue { state -> Bool in
                if state.happened { return true }
                state.waiters.append(continuation)
                return false
            }
            if happened { continuation.resume() }
        }
    }
}

/// Connection ids, 1, 2, 3, … for the process's life.
final class ConnectionIDs: Sendable {
    private let last = Atomic<UInt64>(0)
    func next() -> UInt64 { last.wrappingAdd(1, ordering: .relaxed).newValue }
}

/// Writes inbound frames to a capture file (format: docs/protocol.md "Capture files").
/// Event loops only append to a memory buffer; a background thread writes it
/// out, so recording adds no file I/O to request handling.
final class FrameRecorder: Service, Sendable {
    static let magic = Array("TWCAP1\n".utf8)
    private struct State {
        var pending: [UInt8] = []
        var closed = false
    }
    private let state = NIOLockedValueBox(State())
    private let wake = ConditionLock(value: 0)
    private let handle: FileHandle
    private let finished = ConditionLock(value: 0)

    init(path: String) throws {
        guard FileManager.default.createFile(atPath: path, contents: Data(Self.magic)),
              let handle = FileHandle(forWritingAtPath: path) else {
            throw DomainError.invalidArgument("cannot create capture file \(path)")
        }
        handle.seekToEndOfFile()
        self.handle = handle
        Thread.detachNewThread { [self] in self.writerLoop() }
    }

    private func writerLoop() {
        while true {
            // Wake when a buffer fills or every 20 ms; the lock is held only on success.
            if wake.lock(whenValue: 1, timeoutSeconds: 0.02) { wake.unlock(withValue: 0) }
            let (bytes, closed) = state.withLockedValue { state -> ([UInt8], Bool) in
                defer { state.pending.removeAll(keepingCapacity: true) }
                return (state.pending, state.closed)
            }
            if !bytes.isEmpty { handle.write(Data(bytes)) }
            if closed {
                handle.closeFile()
                finished.lock()
                finished.unlock(withValue: 1)
                return
            }
        }
    }

    /// Kind 1: an inbound frame exactly as received (header + payload).
    func record(connection: UInt64, payload: [UInt8]) {
        write(kind: 1, connection: connection, body: Framing.frame(payload))
    }

    /// Kind 3: a frame of `length` payload bytes whose content is withheld
    /// (it did not decode before initialize, so it may hold a token).
    func recordWithheld(connection: UInt64, length: Int) {
        write(kind: 3, connection: connection, body: [UInt8(truncatingIfNeeded: length >> 24), UInt8(truncatingIfNeeded: length >> 16),
                                                       UInt8(truncatingIfNeeded: length >> 8), UInt8(truncatingIfNeeded: length)])
    }

    /// Kind 2: request `requestID` of this connection created `createdID` (a
    /// thread or turn id), so a replay can map later references to its own.
    func recordCreated(connection: UInt64, requestID: UInt64, createdID: String) {
        var body: [UInt8] = []
        Self.append(requestID, to: &body)
        let id = Array(createdID.utf8)
        body += [UInt8(id.count >> 8), UInt8(id.count & 0xff)] + id
        write(kind: 2, connection: connection, body: body)
    }

    private func write(kind: UInt8, connection: UInt64, body: [UInt8]) {
        var bytes: [UInt8] = [kind]
        Self.append(UInt64(Date().timeIntervalSince1970 * 1_000_000), to: &bytes)
        Self.append(connection, to: &bytes)
        bytes += body
        let full = state.withLockedValue { state -> Bool in
            state.pending += bytes
            return state.pending.count >= 256 * 1024
        }
        if full {
            wake.lock()
            wake.unlock(withValue: 1)
        }
    }

    static func append(_ value: UInt64, to bytes: inout [UInt8]) {
        for shift in stride(from: 56, through: 0, by: -8) { bytes.append(UInt8((value >> UInt64(shift)) & 0xff)) }
    }

    /// Records until graceful shutdown (the frame server, registered after
    /// it, has drained by then), then writes what is buffered and closes.
    func run() async throws {
        try? await gracefulShutdown()
        // Closing waits for the writer thread: not on the concurrency pool.
        await withCheckedContinuation { (done: CheckedContinuation<Void, Never>) in
            Thread.detachNewThread {
                self.close()
                done.resume()
            }
        }
    }

    /// Writes what is buffered and closes the file.
    func close() {
        state.withLockedValue { $0.closed = true }
        wake.lock()
        wake.unlock(withValue: 1)
        if finished.lock(whenValue: 1, timeoutSeconds: 5) { finished.unlock() }
    }
}
