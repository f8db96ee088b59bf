import Foundation
public import ThreadwireWire

/// Subscribes to threads over a connection made again whenever one ends
/// (a restart, a failover, a proxy cutting it, the server cutting a reader
/// that fell behind), each time resuming every thread after the last
/// numbered event it handed on (`thread/resume` with
/// `after_thread_sequence`). The handler gets each kept event once, in
/// order; notifications that are not kept (deltas) pass through as they
/// come, and those of a connection's lifetime only (thread/closed) are left
/// out, since the subscription goes on. Child agents a subscribed root
/// spawns are resumed too, each after its own last number, and those
/// spawned while the connection was down from their first event (found
/// with `thread/list` by parent after each resume).
public struct ResumingSubscription: Sendable {
    public var threads: [String]
    /// Makes and initializes a connection (with whatever server-request
    /// handlers the application serves).
    public var connect: @Sendable () async throws -> ThreadwireClient
    /// Backoff between failed connections: doubling, random up to the ceiling.
    public var retry = RetryPolicy()
    /// Called when a thread's next event is no longer kept (the client was
    /// away longer than the server keeps events): the application re-reads
    /// the thread; the subscription goes on from the thread's newest event.
    public var onGap: @Sendable (_ threadID: String, _ message: String) async -> Void = { _, _ in }

    public init(threads: [String], connect: @escaping @Sendable () async throws -> ThreadwireClient) {
        self.threads = threads
        self.connect = connect
    }

    /// Runs until the task is cancelled. `after` gives the positions to
    /// start from (a thread not in it starts from its newest event).
    public func run(after: [String: UInt64] = [:], _ handle: @Sendable (Wire.Notification) async -> Void) async {
        var last = after
        var attempt = 1
        while !Task.isCancelled {
            if attempt > 1 { try? await Task.sleep(for: retry.pause(before: min(attempt, 32))) }
            attempt += 1
            guard let client = try? await connect() else { continue }
            var subscribed = true
            // The threads asked for, and those heard of since: a root's
            // subscriber hears its child agents, each with its own numbers.
            for id in threads + last.keys.filter({ !threads.contains($0) }).sorted() where subscribed {
                subscribed = await resume(id, on: client, last: &last)
            }
            guard subscribed else {
                await client.close()
                continue
            }
            attempt = 1
            for await notification in client.notifications {
                if case .threadClosed = notification.payload { continue }
                if let number = notification.threadSequence, let id = notification.payload?.threadID {
                    guard number > last[id] ?? 0 else { continue }  // heard before the cut
                    last[id] = number
                }
                await handle(notification)
            }
            await client.close()
        }
    }

    /// Resumes `id`, then its child agents not heard of yet: from their
    /// first event when `id` resumed from a position (they were spawned
    /// while this subscription was away), else from their newest. False
    /// when the connection failed.
    private func resume(_ id: String, on client: ThreadwireClient, last: inout [String: UInt64]) async -> Bool {
        let following = last[id] != nil
        guard await resumeOne(id, on: client, last: &last) else { return false }
        var cursor: String?
        repeat {
            guard case let .threadList(page)? = try? await client.result(.threadList(Wire.ThreadListParams(
                cursor: cursor, limit: 100, parentThreadId: id))) else { return false }
            for child in page.data.compactMap(\.id) where last[child] == nil {
                if following { last[child] = 0 }
                guard await resume(child, on: client, last: &last) else { return false }
            }
            cursor = page.nextCursor.flatMap { $0.isEmpty ? nil : $0 }
        } while cursor != nil
        return true
    }

    /// Resumes `id` after its last number; false when the connection failed.
    private func resumeOne(_ id: String, on client: ThreadwireClient, last: inout [String: UInt64]) async -> Bool {
        do {
            let result = try await client.result(.threadResume(Wire.ThreadResumeParams(
                threadId: id, excludeTurns: true, afterThreadSequence: last[id])))
            if last[id] == nil, case let .threadResume(resumed) = result { last[id] = resumed.thread?.threadSequence ?? 0 }
            return true
        } catch let ClientError.status(code, message) where code == 11 {
            // OUT_OF_RANGE: from the thread's newest event on.
            await onGap(id, message)
            last[id] = nil
            return await resumeOne(id, on: client, last: &last)
        } catch {
            return false
        }
    }
}

extension Wire.Notification.Payload {
    /// The thread a notification is about.
    public var threadID: String? {
        switch self {
        case let .threadStarted(n): n.thread?.id
        case let .threadStatusChanged(n): n.threadId
        case let .threadArchived(n): n.threadId
        case let .threadUnarchived(n): n.threadId
        case let .threadClosed(n): n.threadId
        case let .threadSettingsUpdated(n): n.threadId
        case let .turnStarted(n): n.threadId
        case let .turnCompleted(n): n.threadId
        case let .itemStarted(n): n.threadId
        case let .itemCompleted(n): n.threadId
        case let .itemAgentMessageDelta(n): n.threadId
        case let .serverRequestResolved(n): n.threadId
        case let .threadTokenUsageUpdated(n): n.threadId
        case let .threadRolledBack(n): n.threadId
        case let .threadReverted(n): n.threadId
        case let .threadQueueUpdated(n): n.threadId
        case let .threadDeleted(n): n.threadId
        case let .threadNameUpdated(n): n.threadId
        }
    }
}
