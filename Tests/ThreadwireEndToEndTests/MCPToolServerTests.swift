import Foundation
import Synchronization
import Testing
import ThreadwireServerTesting
import ThreadwireClient
import ThreadwireWire

/// MCP tool servers from PyPI (mcp-server-time, mcp-server-git; `make
/// py-deps` installs them into .build/venv), run by the real server binary.
@Suite("MCP tool servers", .serialized, .timeLimit(.minutes(5)),
       .enabled(if: MCPPeers.installed, "mcp-server-time and mcp-server-git are not in .build/venv: run make py-deps"))
struct MCPToolServerTests {
    static var venv: String { MCPPeers.venv }

    /// A throwaway git repository with one commit, made off the test's pool.
    static func repository() async throws -> String {
        try await offThread { try repositoryBlocking() }
    }

    private static func repositoryBlocking() throws -> String {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("tw-mcp-git-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        try "hello\n".write(toFile: path + "/README", atomically: true, encoding: .utf8)
        for arguments in [["init", "-q", "-b", "main"], ["add", "README"],
                          ["-c", "user.email=t@example.com", "-c", "user.name=t", "commit", "-q", "-m", "first"]] {
            let git = Process()
            git.executableURL = URL(fileURLWithPath: "/usr/bin/git")
            git.arguments = ["-C", path] + arguments
            try git.run()
            git.waitForExit()
            guard git.terminationStatus == 0 else { throw TestTimeout(description: "git \(arguments) failed") }
        }
        return path
    }

    static func config(repository: String, extra: String = "") -> String {
        """
        {"mcp_servers": {
          "time": {"command": "\(venv)/mcp-server-time", "args": ["--local-timezone", "UTC"], "tool_timeout_ms": 20000,
                   "startup_timeout_ms": 120000},
          "git": {"command": "\(venv)/mcp-server-git", "args": ["--repository", "\(repository)"], "startup_timeout_ms": 120000}\(extra)
        }}
        """
    }

    static func servers(_ client: ThreadwireClient) async throws -> [Wire.McpServer] {
        guard case let .mcpServerList(result) = try await client.result(.mcpServerList(Wire.McpServerListParams())) else {
            throw TestTimeout(description: "bad result")
        }
        return result.servers
    }

    /// Until every server is READY (`after`: with a pid other than that).
    static func ready(_ client: ThreadwireClient, _ name: String? = nil, otherThan pid: Int32? = nil) async throws -> [Wire.McpServer] {
        // Python's first start under the whole suite's load can take a while.
        try await waitUntil("MCP servers ready", timeout: .seconds(120)) {
            let servers = try await servers(client)
            let waited = servers.filter { name == nil || $0.name == name }
            return waited.allSatisfy({ $0.state == .ready && $0.pid != pid }) ? servers : nil
        }
    }

    static func mcpItem(_ turn: Wire.Turn) throws -> Wire.ThreadItem {
        try #require(turn.items.first { $0.type == .toolCall && $0.toolSource == .mcp })
    }

    @Test("mcp-server-time and mcp-server-git: listed by mcp_server/list, offered as mcp__SERVER__TOOL, called through tools/call")
    func toolsListedOfferedAndCalled() async throws {
        let repository = try await Self.repository()
        defer { try? FileManager.default.removeItem(atPath: repository) }
        let server = try await ServerProcess.launch(config: Self.config(repository: repository), arguments: ["--admin-listen", "127.0.0.1:0"])
        let client = try await server.client()
        let servers = try await Self.ready(client)
        #expect(servers.map(\.name) == ["git", "time"])
        let time = try #require(servers.first { $0.name == "time" })
        #expect(time.tools.contains { $0.name == "mcp__time__get_current_time" }, "\(time.tools.map(\.name))")
        #expect((time.pid ?? 0) > 0 && time.restarts == 0)
        #expect(servers.first { $0.name == "git" }?.tools.contains { $0.name == "mcp__git__git_status" } == true)

        let started = try await client.startThread(Wire.ThreadStartParams())
        #expect(started.settings?.mcpServers == ["git", "time"], "the configured defaults")
        let id = try #require(started.thread?.id)
        let turn = try await client.runTurn(id, #"#tool mcp__time__get_current_time {"timezone":"Europe/Paris"}"#, timeout: .seconds(30))
        #expect(turn.status == .completed)
        let item = try Self.mcpItem(turn)
        #expect(item.toolServer == "time" && item.toolName == "mcp__time__get_current_time")
        #expect(item.status == .completed, "\(item.toolOutput ?? "")")
        #expect(item.toolOutput?.contains("Europe/Paris") == true && item.toolOutput?.contains("datetime") == true, "\(item.toolOutput ?? "")")
        #expect(turn.lastContext.contains { $0.kind == .toolOutput && ($0.text ?? "").contains("Europe/Paris") }, "the model reads the output")
        #expect(turn.modelRequests.first?.tools.first { $0.name == "mcp__time__get_current_time" }?.parametersJsonSchema?.contains("timezone") == true,
                "the model is offered the server's schema")

        let status = try await client.runTurn(id, "#tool mcp__git__git_status {\"repo_path\":\"\(repository)\"}", timeout: .seconds(30))
        let gitItem = try Self.mcpItem(status)
        #expect(gitItem.status == .completed && gitItem.toolOutput?.contains("main") == true, "\(gitItem.toolOutput ?? "")")

        // A thread chooses its servers; an unknown one is refused by name.
        await expectStatus(3, mentioning: "mcp_servers[0] 'nope' is not a configured MCP server") {
            _ = try await client.startThread(Wire.ThreadStartParams(mcpServers: ["nope"]))
        }
        let onlyTime = try #require(try await client.startThread(Wire.ThreadStartParams(mcpServers: ["time"])).thread?.id)
        let tools = try await client.runTurn(onlyTime, "hi").lastTools
        #expect(tools.contains("mcp__time__get_current_time") && !tools.contains { $0.hasPrefix("mcp__git__") })

        let metrics = try await httpGet(port: server.adminPort, path: "/metrics").body
        #expect(metrics.contains(#"threadwire_mcp_server_up{server="time"} 1"#), "server state in /metrics")
        #expect(metrics.contains(#"threadwire_mcp_tool_calls_total{outcome="ok",server="time"}"#)
                || metrics.contains(#"threadwire_mcp_tool_calls_total{server="time",outcome="ok"}"#))
    }

    @Test("principals: a server listed for alice only is neither listed, defaulted, chosen nor offered for bob; alice gets it")
    func serverForSomePrincipals() async throws {
        let repository = try await Self.repository()
        defer { try? FileManager.default.removeItem(atPath: repository) }
        let (server, tokens) = try await authenticatingServer(config: Self.config(repository: repository, extra: "")
            .replacingOccurrences(of: #""startup_timeout_ms": 120000},"#, with: #""startup_timeout_ms": 120000, "principals": ["alice"]},"#))
        defer { server.stopInBackground(); try? FileManager.default.removeItem(atPath: tokens) }
        let alice = try await connect(server, token: aliceToken)
        let bob = try await connect(server, token: bobToken)
        #expect(try await Self.ready(alice).map(\.name) == ["git", "time"])
        #expect(try await Self.servers(bob).map(\.name) == ["git"], "bob is shown a server that is not his")
        #expect(try await alice.startThread(Wire.ThreadStartParams()).settings?.mcpServers == ["git", "time"])
        let bobs = try await bob.startThread(Wire.ThreadStartParams())
        #expect(bobs.settings?.mcpServers == ["git"], "bob's defaults hold alice's server")
        await expectStatus(3, mentioning: "mcp_servers[0] 'time' is not available to this principal") {
            _ = try await bob.startThread(Wire.ThreadStartParams(mcpServers: ["time"]))
        }
        let tools = try await bob.runTurn(try #require(bobs.thread?.id), "hi").lastTools
        #expect(!tools.contains { $0.hasPrefix("mcp__time__") } && tools.contains { $0.hasPrefix("mcp__git__") }, "\(tools)")
    }

    @Test("per_principal: alice and bob each get a process of their own, started on first use with {principal} in its args, each confined to its own repository; an unused one stops after idle_stop_ms and starts again when used")
    func serverPerPrincipal() async throws {
        let base = FileManager.default.temporaryDirectory.appendingPathComponent("tw-mcp-principals-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: base) }
        for principal in ["alice", "bob"] {
            let repository = try await Self.repository()
            try FileManager.default.createDirectory(atPath: base, withIntermediateDirectories: true)
            try FileManager.default.moveItem(atPath: repository, toPath: "\(base)/\(principal)")
        }
        let config = """
            {"mcp_servers": {"git": {"command": "\(Self.venv)/mcp-server-git", "args": ["--repository", "\(base)/{principal}"],
                                     "startup_timeout_ms": 120000, "per_principal": true, "idle_stop_ms": 3000}}}
            """
        let (server, tokens) = try await authenticatingServer(config: config)
        defer { server.stopInBackground(); try? FileManager.default.removeItem(atPath: tokens) }
        let alice = try await connect(server, token: aliceToken)
        let bob = try await connect(server, token: bobToken)
        // Nobody used it yet: no process.
        let before = try await Self.servers(alice)
        #expect(before.map(\.name) == ["git"] && before.first?.state == .stopped && before.first?.pid == nil, "\(before)")

        func gitStatus(_ client: ThreadwireClient, _ thread: String, of principal: String) async throws -> Wire.ThreadItem {
            let turn = try await client.runTurn(thread, "#tool mcp__git__git_status {\"repo_path\":\"\(base)/\(principal)\"}", timeout: .seconds(120))
            return try Self.mcpItem(turn)
        }
        let aliceThread = try #require(try await alice.startThread().thread?.id)
        let bobThread = try #require(try await bob.startThread().thread?.id)
        let own = try await gitStatus(alice, aliceThread, of: "alice")
        #expect(own.status == .completed && own.toolOutput?.contains("main") == true, "\(own.toolOutput ?? "")")
        let others = try await gitStatus(alice, aliceThread, of: "bob")
        #expect(others.toolOutput?.contains("outside") == true, "alice's process reached bob's repository: \(others.toolOutput ?? "")")
        // Each pid read right after its principal's call, well inside idle_stop_ms.
        let alicePid = try #require(try await Self.servers(alice).first?.pid)
        let bobs = try await gitStatus(bob, bobThread, of: "bob")
        #expect(bobs.status == .completed && bobs.toolOutput?.contains("main") == true, "\(bobs.toolOutput ?? "")")
        let bobPid = try #require(try await Self.servers(bob).first?.pid)
        #expect(alicePid != bobPid, "one process for both principals")

        // Unused for idle_stop_ms (checked every 5 s): stopped, then started again by the next call.
        try await waitUntil("alice's git server stopped", timeout: .seconds(30)) {
            try await Self.servers(alice).first?.state == .stopped ? true : nil
        }
        let again = try await gitStatus(alice, aliceThread, of: "alice")
        #expect(again.status == .completed && again.toolOutput?.contains("main") == true, "\(again.toolOutput ?? "")")
        let restartedPid = try #require(try await Self.servers(alice).first?.pid)
        #expect(restartedPid != alicePid)
    }

    @Test("50 threads share one MCP server process: every call answered, one process, never restarted")
    func fiftyThreadsShareOneProcess() async throws {
        let repository = try await Self.repository()
        defer { try? FileManager.default.removeItem(atPath: repository) }
        let server = try await ServerProcess.launch(config: Self.config(repository: repository))
        let client = try await server.client()
        let before = try #require(try await Self.ready(client).first { $0.name == "time" })
        let clients = try await (0..<5).asyncMap { _ in try await server.client() }
        let outputs = try await withThrowingTaskGroup(of: String?.self) { group in
            for index in 0..<50 {
                let client = clients[index % clients.count]
                group.addTask {
                    let id = try #require(try await client.startThread(Wire.ThreadStartParams(mcpServers: ["time"])).thread?.id)
                    let turn = try await client.runTurn(id, #"#tool mcp__time__get_current_time {"timezone":"UTC"}"#, timeout: .seconds(60))
                    return try Self.mcpItem(turn).toolOutput
                }
            }
            var all: [String?] = []
            for try await output in group { all.append(output) }
            return all
        }
        #expect(outputs.count == 50)
        #expect(outputs.allSatisfy { $0?.contains("\"timezone\": \"UTC\"") == true || $0?.contains("\"timezone\":\"UTC\"") == true },
                "\(outputs.first { $0?.contains("UTC") != true } ?? "all answered")")
        let after = try #require(try await Self.servers(client).first { $0.name == "time" })
        #expect(after.pid == before.pid && after.restarts == 0, "the same process served every thread")
        #expect(Self.children(of: server.pid, named: "mcp-server-time") == 1, "one mcp-server-time process for the whole instance")
    }

    @Test("an MCP server killed: calls fail into the model's output, the turn goes on, and the server is started again")
    func killedServerRestarts() async throws {
        let repository = try await Self.repository()
        defer { try? FileManager.default.removeItem(atPath: repository) }
        let server = try await ServerProcess.launch(config: Self.config(repository: repository), arguments: ["--admin-listen", "127.0.0.1:0"])
        let client = try await server.client()
        let time = try #require(try await Self.ready(client).first { $0.name == "time" })
        let pid = try #require(time.pid)
        let id = try #require(try await client.startThread(Wire.ThreadStartParams()).thread?.id)

        kill(pid, SIGKILL)
        let turn = try await client.runTurn(id, #"#tool mcp__time__get_current_time {"timezone":"UTC"}"# + "\nafter", timeout: .seconds(30))
        #expect(turn.status == .completed, "the turn goes on")
        let item = try Self.mcpItem(turn)
        #expect(item.status == .failed, "\(item.toolOutput ?? "")")
        #expect(item.toolOutput?.contains("MCP server time") == true, "the model reads which server failed: \(item.toolOutput ?? "")")

        let restarted = try #require(try await Self.ready(client, "time", otherThan: pid).first { $0.name == "time" })
        #expect((restarted.restarts ?? 0) >= 1 && restarted.pid != pid)
        #expect(restarted.lastError == nil)
        let again = try await client.runTurn(id, #"#tool mcp__time__get_current_time {"timezone":"UTC"}"#, timeout: .seconds(30))
        #expect(try Self.mcpItem(again).status == .completed, "calls work again after the restart")
        let metrics = try await httpGet(port: server.adminPort, path: "/metrics").body
        #expect(metrics.contains(#"threadwire_mcp_server_restarts_total{server="time"}"#))
    }

    @Test("an MCP server that hangs or crashes during a call: the call fails into the model's output (a hang at tool_timeout_ms), the turn goes on, other threads' calls on the same server are answered meanwhile, a crashed server is started again")
    func faultsDuringACall() async throws {
        let script = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().appendingPathComponent("integration/mcp/faulty_server.py").path
        let config = """
            {"mcp_servers": {"faulty": {"command": "\(Self.venv)/python", "args": ["\(script)"], "tool_timeout_ms": 6000,
                                        "startup_timeout_ms": 120000}}}
            """
        let server = try await ServerProcess.launch(config: config)
        let client = try await server.client()
        let before = try #require(try await Self.ready(client).first { $0.name == "faulty" })
        let hanging = try #require(try await client.startThread().thread?.id)
        let other = try #require(try await client.startThread().thread?.id)

        // A call that is never answered: another thread's call to the same
        // server is answered while it waits.
        let hangingTurn = try await client.startTurn(hanging, "#tool mcp__faulty__hang {}\nafter the hang")
        _ = try await waitUntil("the hanging call is under way") { () -> Bool? in
            let turn = try await client.read(hanging).thread?.turns.first { $0.id == hangingTurn }
            return turn?.items.contains { $0.type == .toolCall && $0.status == .inProgress } == true ? true : nil
        }
        let echoed = try await client.runTurn(other, #"#tool mcp__faulty__echo {"text":"answered meanwhile"}"#, timeout: .seconds(30))
        #expect(try Self.mcpItem(echoed).status == .completed)
        #expect(try Self.mcpItem(echoed).toolOutput == "answered meanwhile")
        #expect(try await client.read(hanging).thread?.turns.first { $0.id == hangingTurn }?.status == .inProgress,
                "the other thread's call was answered while the hanging one still waited")
        let timedOut = try await client.waitForTurn(hanging, hangingTurn, timeout: .seconds(60))
        #expect(timedOut.status == .completed, "the turn goes on after the failed call")
        let hung = try Self.mcpItem(timedOut)
        #expect(hung.status == .failed)
        #expect(hung.toolOutput?.contains("did not finish within 6000 ms") == true, "\(hung.toolOutput ?? "")")
        #expect(timedOut.items.last?.text?.contains("after the hang") == true, "the model went on: \(timedOut.items.last?.text ?? "")")

        // The process ends in the middle of a call.
        let crashing = try #require(try await client.startThread().thread?.id)
        let crashed = try await client.runTurn(crashing, "#tool mcp__faulty__crash {}\nafter the crash", timeout: .seconds(60))
        #expect(crashed.status == .completed, "the turn goes on")
        let failed = try Self.mcpItem(crashed)
        #expect(failed.status == .failed)
        #expect(failed.toolOutput?.contains("MCP server faulty") == true, "the model reads which server failed: \(failed.toolOutput ?? "")")
        let restarted = try #require(try await Self.ready(client, "faulty", otherThan: before.pid).first { $0.name == "faulty" })
        #expect((restarted.restarts ?? 0) >= 1)
        let again = try await client.runTurn(other, #"#tool mcp__faulty__echo {"text":"again"}"#, timeout: .seconds(30))
        #expect(try Self.mcpItem(again).toolOutput == "again", "calls work again after the restart")
    }

    @Test("require_approval: an MCP call under on_request waits for an approval naming the server, then runs")
    func approvalOfAnMCPCall() async throws {
        let repository = try await Self.repository()
        defer { try? FileManager.default.removeItem(atPath: repository) }
        let extra = #", "asked": {"command": "\#(Self.venv)/mcp-server-time", "require_approval": true, "default": false, "startup_timeout_ms": 120000}"#
        let server = try await ServerProcess.launch(config: Self.config(repository: repository, extra: extra))
        let ide = try await server.askingClient()
        _ = try await Self.ready(ide)
        let started = try await ide.startThread(Wire.ThreadStartParams(approvalPolicy: .onRequest, mcpServers: ["asked", "time"]))
        let id = try #require(started.thread?.id)

        // The server not marked runs without asking.
        let free = try await ide.runTurn(id, #"#tool mcp__time__get_current_time {"timezone":"UTC"}"#, timeout: .seconds(30))
        #expect(try Self.mcpItem(free).status == .completed)

        let turnID = try await ide.startTurn(id, #"#tool mcp__asked__get_current_time {"timezone":"UTC"}"#)
        let ask = try await ide.nextServerRequest(timeout: .seconds(30))
        guard case let .itemToolRequestApproval(params)? = ask.params else { Issue.record("no approval: \(ask)"); return }
        #expect(params.source == .mcp && params.server == "asked" && params.tool == "mcp__asked__get_current_time")
        try await ide.answer(ApprovalTests.approval(ask, .approve))
        let turn = try await ide.waitForTurn(id, turnID, timeout: .seconds(30))
        let item = try Self.mcpItem(turn)
        #expect(item.status == .completed && item.toolServer == "asked", "\(item.toolOutput ?? "")")
    }

    /// Processes whose parent is `parent` and whose command line mentions `name`.
    static func children(of parent: Int32, named name: String) -> Int {
        let entries = (try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? []
        return entries.filter { entry in
            guard Int32(entry) != nil,
                  let stat = try? String(contentsOfFile: "/proc/\(entry)/stat", encoding: .utf8),
                  let close = stat.lastIndex(of: ")") else { return false }
            let fields = stat[stat.index(after: close)...].split(separator: " ")
            guard fields.count > 2, Int32(fields[1]) == parent,
                  let cmdline = FileManager.default.contents(atPath: "/proc/\(entry)/cmdline") else { return false }
            return String(decoding: cmdline, as: UTF8.self).contains(name)
        }.count
    }
}

/// Where `make py-deps` puts the PyPI MCP servers.
enum MCPPeers {
    static let venv: String = {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        return root.appendingPathComponent(".build/venv/bin").path
    }()
    static var installed: Bool {
        FileManager.default.isExecutableFile(atPath: venv + "/mcp-server-time") && FileManager.default.isExecutableFile(atPath: venv + "/mcp-server-git")
    }
}
