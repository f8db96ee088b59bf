import Logging
import Testing
@testable import ThreadwireServerCommand

/// The live level is read on every inline answer, through a switch of its
/// own rather than `Logger.Level.allCases`: each level set must read back.
@Suite struct LiveLogLevelTests {
    @Test func everyLevelReadsBackAsSet() {
        defer { LiveLogLevel.set(.info) }
        for level in Logger.Level.allCases {
            LiveLogLevel.set(level)
            #expect(LiveLogLevel.current == level)
            #expect(LiveLevelHandler(inner: SwiftLogNoOpLogHandler()).logLevel == level)
        }
    }
}
