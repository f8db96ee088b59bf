import Foundation
import NIOCore
import NIOPosix
import Testing
import ThreadwireServerTesting
import ThreadwireCore
import ThreadwireTransport

/// Tasks that prefer an event loop's executor (the requests' tasks) run on
/// that loop, whoever resumes them, and so do the tasks they spawn.
@Suite("event loop as task executor", .timeLimit(.minutes(1)))
struct EventLoopTaskExecutorTests {
    /// Runs `body` with a group of its own, shut down after.
    static func withGroup(threads: Int, _ body: (MultiThreadedEventLoopGroup) async throws -> Void) async throws {
        let group = MultiThreadedEventLoopGroup(numberOfThreads: threads)
        do { try await body(group) } catch {
            try? await group.shutdownGracefully()
            throw error
        }
        try await group.shutdownGracefully()
    }

    /// Two loops of a group of their own, and the first one's executor.
    static func withTwoLoops(_ body: (_ loop: any EventLoop, _ other: any EventLoop, _ executor: EventLoopTaskExecutor) async throws -> Void) async throws {
        try await withGroup(threads: 2) { group in
            let loop = group.next()
            let other = group.makeIterator().first { $0 !== loop }!
            let executor = try #require(try await loop.submit { EventLoopTaskExecutor.current() }.get())
            try await body(loop, other, executor)
        }
    }

    @Test("a task preferring a loop's executor runs on that loop: at its start, after a yield, and when another loop or a plain thread resumes it")
    func staysOnItsLoop() async throws {
        try await Self.withTwoLoops { loop, other, executor in
            #expect(executor.eventLoop === loop)

            let onLoop = await Task(executorPreference: executor) { () -> [Bool] in
                var seen = [loop.inEventLoop]
                await Task.yield()
                seen.append(loop.inEventLoop)
                // Resumed by a future completed on the other loop's thread.
                _ = try? await other.submit { 1 }.get()
                seen.append(loop.inEventLoop)
                // Resumed from a thread that is no event loop at all.
                await withCheckedContinuation { (resumed: CheckedContinuation<Void, Never>) in
                    Thread { resumed.resume() }.start()
                }
                seen.append(loop.inEventLoop)
                return seen
            }.value
            #expect(onLoop == [true, true, true, true])
        }
    }

    @Test("off an event loop there is no executor to prefer (an EmbeddedChannel's connection keeps the global one)")
    func noneOffALoop() async throws {
        #expect(EventLoopTaskExecutor.current() == nil)
        try await Self.withGroup(threads: 1) { group in
            let loop = group.next()
            let first = try await loop.submit { EventLoopTaskExecutor.current() }.get()
            let second = try await loop.submit { EventLoopTaskExecutor.current() }.get()
            #expect(first != nil && first === second, "one executor per loop")
        }
    }

    @Test("tasks spawned from a task given a loop's executor prefer it too, and run there")
    func spawnedTasksInheritTheExecutor() async throws {
        try await Self.withTwoLoops { loop, other, executor in
            let tracker = TaskTracker()
            let (results, report) = AsyncStream<[Bool]>.makeStream()
            tracker.spawn(on: executor) {
                // As a request spawns a turn's runner.
                tracker.spawn {
                    var seen = [loop.inEventLoop]
                    _ = try? await other.submit { 1 }.get()
                    seen.append(loop.inEventLoop)
                    report.yield(seen)
                    report.finish()
                }
            }
            var iterator = results.makeAsyncIterator()
            #expect(await iterator.next() == [true, true])
            #expect(await tracker.waitForAll(timeout: .seconds(10)))
            // Without a preference anywhere up the line, none is passed on.
            let (plain, reportPlain) = AsyncStream<Bool>.makeStream()
            tracker.spawn { reportPlain.yield(TaskTracker.inheritedExecutor == nil); reportPlain.finish() }
            var plainIterator = plain.makeAsyncIterator()
            #expect(await plainIterator.next() == true)
        }
    }
}
