"""The TypeScript client's browser build (clients/typescript/dist/browser.js)
in a real browser: Debian's chromium driven by PyPI's playwright, the page
served over HTTP on loopback from another origin than the server's (which is
told to allow it), the session over the web listener's /ws. (Chromium's
local network access checks refuse a loopback WebSocket to a page that was
not itself loaded from a local address, as playwright's routed pages are.)"""
import functools
import http.server
import pathlib
import sys
import threading

import pytest
from playwright.sync_api import sync_playwright

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "integration" / "python"))
from conftest import tokens_file, start_listening, stop_server  # noqa: E402

DIST = ROOT / "clients" / "typescript" / "dist"
ALICE = "alice-7c2e4a6b8d0f1e3a5c9b"
CHROMIUM = "/usr/bin/chromium"

PAGE = """<!doctype html><meta charset="utf-8"><title>threadwire</title>
<script type="module">
import { WebSocketClient, Code, StatusError, notificationMethod, MultiAgentMode, TurnStatus } from "./browser.js";
const url = new URL(location.href).searchParams.get("ws");
const report = {};
try {
  try {
    await WebSocketClient.connect({ url });
    report.anonymous = "connected";
  } catch (error) {
    report.anonymous = error instanceof StatusError ? Code[error.code] : String(error);
  }
  const client = await WebSocketClient.connect({ url, token: "%s", clientName: "browser-test" });
  report.principal = client.serverInfo?.principal;
  const started = await client.threadStart({ multiAgentMode: MultiAgentMode.MULTI_AGENT_MODE_PROACTIVE });
  const threadId = started.thread.id;
  report.mode = MultiAgentMode[started.multiAgentMode];
  const turn = await client.turnStart({ threadId, input: [{ content: { case: "text", value: "hello from a browser" } }] });
  report.heard = [];
  for await (const note of client.notifications()) {
    report.heard.push(notificationMethod(note));
    if (note.payload?.case === "turnCompleted" && note.payload.value.turn?.id === turn.turn.id) break;
  }
  const read = await client.threadRead({ threadId, includeTurns: true });
  report.turns = read.thread.turns.map((t) => TurnStatus[t.status]);
  try {
    await client.threadRead({ threadId: "no-such-thread" });
    report.unknown = "found";
  } catch (error) {
    report.unknown = Code[error.code];
  }
  await client.close();
  report.closed = client.ended;
} catch (error) {
  report.error = String(error && error.stack || error);
}
window.report = report;
</script>
""" % ALICE


class PageHandler(http.server.SimpleHTTPRequestHandler):
    """dist/ as files, and the test page as index.html."""

    def do_GET(self):
        if self.path.split("?")[0] == "/index.html":
            body = PAGE.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        super().do_GET()

    def log_message(self, *args):
        pass


@pytest.fixture()
def page_origin():
    PageHandler.extensions_map = {**PageHandler.extensions_map, ".js": "text/javascript"}
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(PageHandler, directory=str(DIST)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture()
def served(tmp_path, page_origin):
    tokens = tokens_file(tmp_path, f"alice {ALICE}\n")
    config = tmp_path / "config.json"
    config.write_text('{"features": {"multi_agent_v2": true, "multi_agent_mode": true}}')
    proc, addresses = start_listening(tmp_path, "--web-listen", "127.0.0.1:0", "--web-allowed-origin", page_origin,
                                      "--auth-tokens", str(tokens), "--config", str(config))
    yield page_origin, addresses["web"].replace("http://", "ws://") + "/ws"
    stop_server(proc)


def test_a_page_starts_a_thread_runs_a_turn_and_reads_it_over_the_websocket(served):
    assert (DIST / "browser.js").is_file(), "build the client first: tsc -p clients/typescript"
    errors = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True,
                                             args=["--no-sandbox", "--disable-gpu", "--no-first-run"])
        try:
            page = browser.new_page()
            page.on("pageerror", lambda error: errors.append(str(error)))
            origin, ws = served
            page.goto(f"{origin}/index.html?ws={ws}")
            page.wait_for_function("window.report !== undefined", timeout=30_000)
            report = page.evaluate("window.report")
        finally:
            browser.close()
    assert not errors, errors
    assert "error" not in report, report["error"]
    assert report["anonymous"] == "UNAUTHENTICATED"
    assert report["principal"] == "alice"
    assert report["mode"] == "MULTI_AGENT_MODE_PROACTIVE"
    assert report["heard"][0] == "thread/started" and "turn/started" in report["heard"] and report["heard"][-1] == "turn/completed"
    assert report["turns"] == ["TURN_STATUS_COMPLETED"]
    assert report["unknown"] == "NOT_FOUND"
    assert report["closed"] is True
