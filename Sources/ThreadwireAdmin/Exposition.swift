import Foundation

/// What /metrics adds to the registry's text: a `# HELP` line for every
/// metric (swift-metrics, through which the server records them, carries no
/// help text), the `process_*` metrics Prometheus' client libraries export,
/// and the build.
enum Exposition {
    /// Each metric's help, by name: the one list of what the server exports.
    static let help: [String: String] = [
        "threadwire_connections_open": "Frame connections open now (TCP, and the sessions of gRPC streams and WebSockets).",
        "threadwire_frames_in_total": "Frames read from clients.",
        "threadwire_bytes_in_total": "Bytes of frames read from clients.",
        "threadwire_frames_out_total": "Frames written to clients.",
        "threadwire_bytes_out_total": "Bytes of frames written to clients.",
        "threadwire_backpressure_pauses_total": "Times a connection's reads were paused because its client did not take what was written.",
        "threadwire_slow_subscriber_disconnects_total": "Connections cut off for falling max_notification_backlog_bytes behind.",
        "threadwire_server_request_answers_total": "Answers of server requests (client tools, approvals, user input) that counted.",
        "threadwire_idempotent_replays_total": "Repeats of keyed requests answered with the first attempt's answer.",
        "threadwire_accept_backoffs_total": "Times accepting connections paused for want of file descriptors.",
        "threadwire_connection_descriptors_capacity": "File descriptors the file limit leaves connections once a reserve is kept free; connections past it are refused.",
        "threadwire_running_turns": "Turns running on this instance now.",
        "threadwire_loaded_threads": "Threads loaded on this instance now.",
        "threadwire_store_healthy": "1 while the store commits, 0 while it cannot.",
        "threadwire_request_duration_seconds": "Time from reading a request to writing its response, by method.",
        "threadwire_requests_total": "Requests answered, by method and status name.",
        "threadwire_forwarded_requests_total": "Requests relayed to the instance that owns their thread, by method and the owner's status name.",
        "threadwire_connections_closed_by_server_total": "Connections the server closed, by reason.",
        "threadwire_mcp_server_restarts_total": "Restarts of MCP tool server processes, by server.",
        "threadwire_mcp_server_up": "1 while an MCP tool server answers, by server.",
        "threadwire_mcp_tool_calls_total": "MCP tool calls, by server and outcome.",
        "threadwire_store_commit_batch_size": "Changes committed together in one store transaction.",
        "threadwire_store_commit_seconds": "Time of one store commit (a group of changes).",
        "threadwire_trace_spans_dropped_total": "Trace spans dropped because the export queue was full.",
        "threadwire_trace_exports_failed_total": "Trace exports the collector did not take.",
        "threadwire_build_info": "The running build: 1, labelled with its version.",
        "process_cpu_seconds_total": "Total user and system CPU time spent in seconds.",
        "process_open_fds": "Number of open file descriptors.",
        "process_max_fds": "Maximum number of open file descriptors.",
        "process_resident_memory_bytes": "Resident memory size in bytes.",
        "process_virtual_memory_bytes": "Virtual memory size in bytes.",
        "process_start_time_seconds": "Start time of the process since unix epoch in seconds.",
    ]

    /// `text` with a HELP line before each TYPE line.
    static func withHelp(_ text: String) -> String {
        var out = ""
        out.reserveCapacity(text.utf8.count + 4096)
        for line in text.split(separator: "\n", omittingEmptySubsequences: false) {
            if line.hasPrefix("# TYPE ") {
                let name = line.dropFirst("# TYPE ".count).split(separator: " ").first.map(String.init) ?? ""
                out += "# HELP \(name) \(help[name] ?? "(no description)")\n"
            }
            out += line
            out += "\n"
        }
        while out.hasSuffix("\n\n") { out.removeLast() }
        return out
    }

    /// The process_* metrics, read from /proc/self at scrape time.
    static func process() -> String {
        var lines: [String] = []
        func metric(_ name: String, _ type: String, _ value: Double) {
            lines += ["# HELP \(name) \(help[name] ?? "")", "# TYPE \(name) \(type)", "\(name) \(format(value))"]
        }
        let ticks = Double(sysconf(Int32(_SC_CLK_TCK)))
        let page = Double(sysconf(Int32(_SC_PAGESIZE)))
        // /proc/self/stat: fields after the command's closing parenthesis.
        if let stat = try? String(contentsOfFile: "/proc/self/stat", encoding: .utf8), let close = stat.lastIndex(of: ")") {
            let fields = stat[stat.index(after: close)...].split(separator: " ")
            // fields[0] is the state (field 3): utime is field 14, stime 15, starttime 22.
            if fields.count > 19, let user = Double(fields[11]), let system = Double(fields[12]), let start = Double(fields[19]) {
                metric("process_cpu_seconds_total", "counter", (user + system) / ticks)
                if let boot = bootTime() { metric("process_start_time_seconds", "gauge", boot + start / ticks) }
            }
        }
        if let statm = try? String(contentsOfFile: "/proc/self/statm", encoding: .utf8) {
            let fields = statm.split(separator: " ")
            if fields.count > 1, let size = Double(fields[0]), let resident = Double(fields[1]) {
                metric("process_virtual_memory_bytes", "gauge", size * page)
                metric("process_resident_memory_bytes", "gauge", resident * page)
            }
        }
        if let open = try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd") {
            metric("process_open_fds", "gauge", Double(open.count))
        }
        var limit = rlimit()
        if getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 {
            metric("process_max_fds", "gauge", Double(limit.rlim_cur))
        }
        return lines.joined(separator: "\n") + "\n"
    }

    static func build(version: String) -> String {
        "# HELP threadwire_build_info \(help["threadwire_build_info"]!)\n# TYPE threadwire_build_info gauge\n"
            + "threadwire_build_info{version=\"\(version)\"} 1\n"
    }

    private static func bootTime() -> Double? {
        guard let stat = try? String(contentsOfFile: "/proc/stat", encoding: .utf8) else { return nil }
        for line in stat.split(separator: "\n") where line.hasPrefix("btime ") {
            return Double(line.dropFirst("btime ".count))
        }
        return nil
    }

    private static func format(_ value: Double) -> String {
        value == value.rounded() && abs(value) < 1e15 ? String(Int64(value)) : String(value)
    }
}
