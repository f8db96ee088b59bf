import Dispatch
import Foundation
import Synchronization
import ThreadwireContract
import ThreadwireCore
import ThreadwireWire

/// thread/import: a codex rollout file, in one request or several.
enum ImportHandlers {
    @Sendable static func importRollout(_ p: Wire.ThreadImportParams, _ call: Call) async throws -> Outcome<Wire.Response.Result> {
        let imports = call.server.imports
        let key = ImportSessions.Key(principal: call.principal, importID: p.importId ?? UUID().uuidString)
        let session = try imports.take(key, fileName: p.fileName, firstLine: Int(p.firstLine ?? 1))
        do {
            let last = p.importId == nil || p.last == true
            // Parsing is CPU work of up to seconds: not on an event loop.
            try await offLoop { try session.feed(p.lines, last: last, limits: imports.limits) }
            guard last else {
                let received = session.lines
                imports.put(key, session)
                return Outcome(.threadImport(Wire.ThreadImportResult(linesReceived: UInt64(received))))
            }
            imports.done(key, session)
            return Outcome(.threadImport(Wire.ThreadImportResult(
                report: try await finish(session, strict: p.strict ?? false, call: call), linesReceived: UInt64(session.lines))))
        } catch {
            imports.done(key, session)
            throw error
        }
    }

    private static func finish(_ session: ImportSessions.Session, strict: Bool, call: Call) async throws -> Wire.ImportReport {
        let parser = session.feed.parser
        if strict, !parser.skipped.isEmpty {
            throw RequestError(.invalidArgument, Wire.ImportReport.strictRefusal(fileName: session.fileName, parser.skipped))
        }
        let thread = try parser.finish()
        let imported = try await call.engine.importThread(thread, principal: call.principal, digest: session.feed.digest,
                                                          lines: session.feed.lines)
        return Wire.ImportReport(fileName: session.fileName, feed: session.feed, thread: thread, imported: imported)
    }

    private static func offLoop<T: Sendable>(_ work: @escaping @Sendable () throws -> T) async throws -> T {
        try await withCheckedThrowingContinuation { continuation in
            DispatchQueue.global(qos: .userInitiated).async { continuation.resume(with: Result { try work() }) }
        }
    }
}

/// Files being imported in several requests, by principal and import id:
/// parsed as they arrive (nothing is stored before the last request), bounded
/// in size and number, forgotten when idle.
final class ImportSessions: Sendable {
    struct Limits: Sendable {
        /// Bytes of one file's lines.
        var bytesPerImport = 256 << 20
        /// Bytes of all files in progress on this instance.
        var totalBytes = 512 << 20
        var idle: Duration = .seconds(600)
    }

    struct Key: Hashable, Sendable {
        var principal: Principal
        var importID: String
    }

    /// One file's import. A class, fed in place (a copy per piece would copy
    /// everything parsed so far); only the request holding it (`take`) touches it.
    final class Session: @unchecked Sendable {
        let fileName: String
        private(set) var feed: RolloutFeed
        var touched = ContinuousClock.now

        init(fileName: String, feed: RolloutFeed) {
            self.fileName = fileName
            self.feed = feed
        }

        var lines: Int { feed.lines }

        /// Feeds lines, numbered on from the last request's.
        func feed(_ chunk: [[UInt8]], last: Bool, limits: Limits) throws {
            let added = chunk.reduce(0) { $0 + $1.count + 1 }
            guard feed.bytes + added <= limits.bytesPerImport else {
                throw RequestError(.resourceExhausted, "\(fileName): over \(limits.bytesPerImport) bytes, the most one import may hold")
            }
            feed.feed(chunk, last: last)
        }
    }

    let limits: Limits
    private let state = Mutex<(sessions: [Key: Session], busy: Set<Key>)>(([:], []))

    init(limits: Limits = Limits(), defaultModel: String) {
        self.limits = limits
        self.defaultModel = defaultModel
    }
    private let defaultModel: String

    /// The session to feed (a new one when the piece starts at line 1),
    /// held by this request until `put` or `done`.
    func take(_ key: Key, fileName: String?, firstLine: Int) throws -> Session {
        try state.withLock { state in
            let now = ContinuousClock.now
            state.sessions = state.sessions.filter { now - $0.value.touched < limits.idle }
            guard !state.busy.contains(key) else {
                throw RequestError(.failedPrecondition, "import \(key.importID) is busy with another request; send its pieces one at a time")
            }
            let used = state.sessions.values.reduce(0) { $0 + $1.feed.bytes }
            guard used < limits.totalBytes else {
                throw RequestError(.resourceExhausted, "imports in progress hold \(used) bytes on this instance (at most \(limits.totalBytes)); retry later")
            }
            if firstLine <= 1 {
                state.sessions[key] = nil
                state.busy.insert(key)
                return Session(fileName: fileName ?? "rollout", feed: RolloutFeed(defaultModel: defaultModel))
            }
            guard let session = state.sessions[key] else {
                throw RequestError(.notFound, "no import \(key.importID) is in progress on this instance (idle for 10 minutes, "
                    + "or begun on another instance): send the file again from its first line")
            }
            guard session.lines + 1 == firstLine else {
                throw RequestError(.failedPrecondition, "import \(key.importID) holds \(session.lines) lines; this piece starts at line "
                    + "\(firstLine), not \(session.lines + 1)")
            }
            state.sessions[key] = nil
            state.busy.insert(key)
            return session
        }
    }

    func put(_ key: Key, _ session: Session) {
        state.withLock { state in
            session.touched = .now
            state.sessions[key] = session
            state.busy.remove(key)
        }
    }

    func done(_ key: Key, _ session: Session) {
        _ = state.withLock { state in state.busy.remove(key) }
    }
}
