import Foundation
import Testing
@testable import ThreadwireServerCommand

/// Every flag of threadwire-server as a THREADWIRE_* variable: one case per
/// flag, read from the command's own declarations.
@Suite("environment variables for every flag")
struct EnvironmentFlagsTests {
    @Test("the list covers the command's flags, each named after its long name")
    func covers() {
        let flags = EnvironmentFlags.entries.map(\.flag)
        #expect(flags.count >= 40)
        for expected in ["--listen", "--data-dir", "--config", "--grpc-listen", "--web-allowed-origin", "--allow-unauthenticated", "--log-level"] {
            #expect(flags.contains(expected), "\(expected)")
        }
        #expect(EnvironmentFlags.entries.first { $0.flag == "--data-dir" }?.variable == "THREADWIRE_DATA_DIR")
        #expect(EnvironmentFlags.entries.first { $0.flag == "--web-allowed-origin" }?.kind == .repeated)
        #expect(EnvironmentFlags.entries.first { $0.flag == "--allow-unauthenticated" }?.kind == .flag)
    }

    @Test("each variable stands for its flag when the flag is not given, and the flag wins when it is",
          arguments: EnvironmentFlags.entries)
    func eachVariable(_ entry: EnvironmentFlags.Entry) throws {
        switch entry.kind {
        case .value:
            #expect(try EnvironmentFlags.arguments([], environment: [entry.variable: "v1"]) == [entry.flag, "v1"])
            #expect(try EnvironmentFlags.arguments([entry.flag, "given"], environment: [entry.variable: "v1"]) == [entry.flag, "given"])
            #expect(try EnvironmentFlags.arguments(["\(entry.flag)=given"], environment: [entry.variable: "v1"]) == ["\(entry.flag)=given"])
        case .repeated:
            #expect(try EnvironmentFlags.arguments([], environment: [entry.variable: "a, b"]) == [entry.flag, "a", entry.flag, "b"])
            #expect(try EnvironmentFlags.arguments([entry.flag, "c"], environment: [entry.variable: "a"]) == [entry.flag, "c"])
        case .flag:
            #expect(try EnvironmentFlags.arguments([], environment: [entry.variable: "true"]) == [entry.flag])
            #expect(try EnvironmentFlags.arguments([], environment: [entry.variable: "0"]) == [])
            #expect(throws: (any Error).self) { try EnvironmentFlags.arguments([], environment: [entry.variable: "maybe"]) }
        }
        // Parsed by the command itself: the variable reaches the option.
        if entry.kind != .flag, entry.flag != "--log-format" {
            let sample = ["--listen", "--peer-listen", "--advertise", "--admin-listen", "--grpc-listen", "--web-listen"].contains(entry.flag) ? "127.0.0.1:9"
                : entry.flag == "--log-level" ? "debug" : entry.flag == "--tls-client-principal" ? "cn" : "7"
            let parsed = try ServerCommand.parse(try EnvironmentFlags.arguments([], environment: [entry.variable: sample]))
            let mirrored = Mirror(reflecting: parsed).children.first { $0.label == "_" + entry.flag.dropFirst(2).split(separator: "-").enumerated()
                .map { $0.offset == 0 ? String($0.element) : $0.element.capitalized }.joined() }
            #expect(mirrored.map { "\($0.value)".contains(sample) } == true, "\(entry.variable)=\(sample) parsed into \(entry.flag)")
        }
    }

    @Test("the documentation lists every variable (docs/configuration.md)")
    func documented() throws {
        let docs = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("docs/configuration.md")
        let text = try String(contentsOf: docs, encoding: .utf8)
        for entry in EnvironmentFlags.entries {
            #expect(text.contains("`\(entry.variable)`"), "\(entry.variable) is not in docs/configuration.md")
        }
        #expect(text.contains(EnvironmentFlags.markdownTable()), "the table is as `threadwire-server --print-environment` prints it now")
    }
}
