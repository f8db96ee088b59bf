import Foundation

/// Named points where a test can make the process die as kill -9 would
/// (`THREADWIRE_FAULT_POINTS=name[,name…]`, read once at startup). It
/// proves what survives a crash at a moment no signal could hit reliably,
/// such as between a change's commit and the recording of its answer.
/// Unset, a point costs one load of a constant set.
public enum FaultInjection {
    private static let armed: Set<String> = Set(
        (ProcessInfo.processInfo.environment["THREADWIRE_FAULT_POINTS"] ?? "").split(separator: ",").map(String.init))

    public static func point(_ name: String) {
        guard !armed.isEmpty, armed.contains(name) else { return }
        FileHandle.standardError.write(Data("threadwire: fault point \(name) reached; killing this process (SIGKILL)\n".utf8))
        kill(getpid(), SIGKILL)
    }
}
