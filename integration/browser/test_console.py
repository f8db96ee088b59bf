"""The operator's console (the web listener's `/`), in Debian's chromium driven
by playwright against the real server: sign in with a token, see a thread
another client made, its agent tree with a spawned child, a streamed delta
arriving, a child's approval answered from the page and its turn completing;
another principal sees none of it. Screenshots of each page go to
THREADWIRE_SCREENSHOTS when set (docs/console holds the current ones)."""
import os
import pathlib
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest
from playwright.sync_api import expect, sync_playwright

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "integration" / "python"))
from conftest import tokens_file, start_listening, stop_server  # noqa: E402
from threadwire_client import Client, StatusError  # noqa: E402

ALICE = "alice-2b4d6f8a0c1e3a5c7e9b"
BOB = "bob-9e7c5a3b1d0f2e4a6c8b"
OPS = "ops-5a3c1e9b7d0f2a4c6e8d"
CHROMIUM = "/usr/bin/chromium"
GREP = {"name": "grep", "description": "Searches the workspace.",
        "parameters_json_schema": '{"type":"object","properties":{"pattern":{"type":"string"}},"required":["pattern"]}'}


@pytest.fixture()
def served(tmp_path):
    tokens = tokens_file(tmp_path, f"alice {ALICE}\nbob {BOB}\nops {OPS} operator\n")
    config = tmp_path / "config.json"
    config.write_text('{"features": {"multi_agent_v2": true, "multi_agent_mode": true}}')
    proc, addresses = start_listening(tmp_path, "--web-listen", "127.0.0.1:0", "--auth-tokens", str(tokens),
                                      "--config", str(config))
    host, port = addresses["frames"].rsplit(":", 1)
    yield addresses["web"], (host, int(port))
    stop_server(proc)


@pytest.fixture()
def browser():
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, headless=True,
                                              args=["--no-sandbox", "--disable-gpu", "--no-first-run"])
        yield chromium
        chromium.close()


class Page:
    """A browser tab on the console that fails the test on any script error."""

    def __init__(self, browser, web):
        self.page = browser.new_page(viewport={"width": 1280, "height": 860})
        self.errors = []
        self.page.on("pageerror", lambda error: self.errors.append(f"pageerror: {error}"))
        self.page.on("console", lambda message: message.type == "error" and self.errors.append(f"console: {message.text}"))
        self.web = web

    def sign_in(self, token):
        self.page.goto(self.web + "/")
        expect(self.page.get_by_test_id("signin")).to_be_visible()
        self.page.fill("#token", token)
        self.page.keyboard.press("Enter")
        expect(self.page.locator("#main h1")).to_have_text("Threads")

    def shot(self, name):
        folder = os.environ.get("THREADWIRE_SCREENSHOTS")
        if folder:
            pathlib.Path(folder).mkdir(parents=True, exist_ok=True)
            self.page.screenshot(path=str(pathlib.Path(folder) / f"{name}.png"), full_page=True)


def pump(client, stop):
    """Reads the IDE's connection so its tool handler answers the server's calls."""
    try:
        for _ in client.iter_notifications():
            if stop.is_set():
                return
    except Exception:
        pass


def test_sign_in_tree_live_delta_and_a_childs_approval_answered_from_the_page(served, browser):
    web, frames = served
    with Client(*frames) as spawner, Client(*frames) as ide:
        spawner.initialize("spawner", auth_token=ALICE)
        ide.on_tool("grep", lambda arguments: f"found {arguments['pattern']} in main.swift")
        ide.initialize("ide", auth_token=ALICE)
        started = spawner.call("thread/start", {"name": "console-root", "approval_policy": "APPROVAL_POLICY_ALWAYS",
                                                "multi_agent_mode": "MULTI_AGENT_MODE_PROACTIVE", "client_tools": [GREP]})
        root = started.thread.id
        ide.call("thread/resume", {"thread_id": root, "exclude_turns": True})
        stop = threading.Event()
        threading.Thread(target=pump, args=(ide, stop), daemon=True).start()

        page = Page(browser, web)
        page.sign_in(ALICE)
        row = page.page.locator(f'tr[data-thread-id="{root}"]')
        expect(row).to_contain_text("console-root")
        expect(row).to_contain_text("proactive")
        page.shot("threads")

        row.get_by_role("link").click()
        expect(page.page.get_by_test_id("selected-mode")).to_have_text("proactive")
        expect(page.page.get_by_test_id("runtime")).to_contain_text("not resolved yet")
        expect(page.page.locator("#link")).to_have_text("live")

        # A streamed answer arrives delta by delta in the open turn.
        spawner.call("turn/start", {"thread_id": root, "input": [{"text": "#stream\n#sleep 200\nhello from the streaming model"}]})
        live = page.page.get_by_test_id("live")
        expect(live).to_contain_text("streaming model", timeout=20_000)
        assert int(live.get_attribute("data-deltas")) >= 2, "the text came as deltas"
        expect(page.page.locator(".turn[data-status='completed']")).to_have_count(1, timeout=20_000)
        expect(page.page.get_by_test_id("runtime")).to_have_text("v2")

        # A child spawned by another client appears in the tree; its approval waits on the page.
        child = spawner.call("agent/spawn", {"parent_thread_id": root, "message": '#tool grep {"pattern": "bug"}',
                                             "task_name": "hunter"}).thread.id
        node = page.page.locator(f'svg.tree g.node[data-thread-id="{child}"]')
        expect(node).to_be_visible(timeout=20_000)
        request = page.page.locator("#pending-list li[data-kind='approval']")
        expect(request).to_contain_text("grep", timeout=20_000)
        expect(request).to_contain_text("bug")
        expect(node).to_have_attribute("data-status", "waiting on approval", timeout=20_000)
        page.shot("thread")
        request.get_by_test_id("approve").click()
        expect(request).to_have_count(0)

        # Approved: the IDE ran the tool, the child's turn completed.
        node.click()
        expect(page.page.locator(".turn[data-status='completed']")).to_have_count(1, timeout=20_000)
        expect(page.page.locator(".turn .output")).to_contain_text("found bug in main.swift")
        page.shot("child")
        assert page.errors == [], page.errors
        stop.set()

        # Another principal sees none of alice's threads.
        other = Page(browser, web)
        other.sign_in(BOB)
        expect(other.page.locator(f'tr[data-thread-id="{root}"]')).to_have_count(0)
        expect(other.page.get_by_test_id("all-principals")).to_have_count(0)
        other.page.goto(f"{web}/#/thread/{child}")
        expect(other.page.locator("#error")).to_contain_text("NOT_FOUND")
        assert [e for e in other.errors if "NOT_FOUND" not in e] == [], other.errors

        # An operator sees them, with their principal, read-only, tree and all.
        ops = Page(browser, web)
        ops.sign_in(OPS)
        expect(ops.page.locator("#who")).to_contain_text("ops (operator)")
        expect(ops.page.locator(f'tr[data-thread-id="{root}"]')).to_have_count(0)
        ops.page.get_by_test_id("all-principals").check()
        row = ops.page.locator(f'tr[data-thread-id="{root}"]')
        expect(row).to_contain_text("alice")
        ops.shot("operator")
        row.get_by_role("link").click()
        expect(ops.page.get_by_test_id("read-only")).to_contain_text("alice's thread")
        expect(ops.page.locator("form.settings")).to_have_count(0)
        expect(ops.page.locator(f'svg.tree g.node[data-thread-id="{child}"]')).to_be_visible()
        expect(ops.page.locator(".turn[data-status='completed']")).to_have_count(1)
        ops.page.click("nav >> text=Server")
        expect(ops.page.get_by_test_id("models")).to_contain_text("echo-1")
        ops.shot("server")
        assert ops.errors == [], ops.errors


def test_no_page_works_without_the_token(served, browser):
    web, frames = served
    with Client(*frames) as alice:
        alice.initialize("alice", auth_token=ALICE)
        root = alice.call("thread/start", {"name": "secret-root"}).thread.id
    page = Page(browser, web)
    page.page.goto(f"{web}/#/thread/{root}")
    expect(page.page.get_by_test_id("signin")).to_be_visible()
    expect(page.page.locator("body")).not_to_contain_text("secret-root")
    page.page.fill("#token", "not-a-token-0123456789")
    page.page.keyboard.press("Enter")
    expect(page.page.locator("#error")).to_contain_text("UNAUTHENTICATED")
    expect(page.page.get_by_test_id("signin")).to_be_visible()
    page.shot("signin")


def test_assets_have_their_types_cache_headers_and_a_strict_policy(served):
    web, _ = served
    expected = {"/": "text/html", "/console/console.css": "text/css", "/console/src/app.js": "text/javascript",
                "/src/browser.js": "text/javascript", "/src/gen/messages.js": "text/javascript"}
    for path, kind in expected.items():
        with urllib.request.urlopen(web + path) as response:
            headers = response.headers
            assert headers["Content-Type"].startswith(kind), (path, headers["Content-Type"])
            assert headers["Cache-Control"] == "no-cache" and headers["ETag"], path
            policy = headers["Content-Security-Policy"]
            assert "default-src 'none'" in policy and "script-src 'self'" in policy and "unsafe-inline" not in policy, policy
            assert headers["X-Content-Type-Options"] == "nosniff"
            etag = headers["ETag"]
        revalidate = urllib.request.Request(web + path, headers={"If-None-Match": etag})
        with pytest.raises(urllib.error.HTTPError) as not_modified:
            urllib.request.urlopen(revalidate)
        assert not_modified.value.code == 304, path
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(web + "/no/such/file.js")
    assert missing.value.code == 404


def free_port():
    import socket
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_the_open_page_resumes_after_a_server_restart_without_reloading(tmp_path, browser):
    tokens = tokens_file(tmp_path, f"alice {ALICE}\n")
    frames_port, web_port = free_port(), free_port()

    def start():
        return start_listening(tmp_path, "--web-listen", f"127.0.0.1:{web_port}", "--auth-tokens", str(tokens),
                               listen=f"127.0.0.1:{frames_port}")[0]

    proc = start()
    try:
        web = f"http://127.0.0.1:{web_port}"
        with Client("127.0.0.1", frames_port) as alice:
            alice.initialize("alice", auth_token=ALICE)
            root = alice.call("thread/start", {"name": "restarted-root"}).thread.id
            alice.call("turn/start", {"thread_id": root, "input": [{"text": "before the restart"}]})
        page = Page(browser, web)
        page.sign_in(ALICE)
        page.page.goto(f"{web}/#/thread/{root}")
        expect(page.page.locator("#link")).to_have_text("live")
        expect(page.page.locator(".turn[data-status='completed']")).to_have_count(1, timeout=20_000)
        page.page.evaluate("window.loadedOnce = true")

        stop_server(proc)
        proc = start()
        with Client("127.0.0.1", frames_port) as alice:
            alice.initialize("alice", auth_token=ALICE)
            alice.call("turn/start", {"thread_id": root, "input": [{"text": "after the restart"}]})
        # The same page (not reloaded) heard the turn made while it was away.
        expect(page.page.locator(".turn[data-status='completed']")).to_have_count(2, timeout=30_000)
        expect(page.page.locator(".turns")).to_contain_text("after the restart")
        expect(page.page.locator("#link")).to_have_text("live")
        assert page.page.evaluate("window.loadedOnce") is True, "the page was reloaded"
        # A dropped connection logs a failed socket in the browser; nothing else may.
        assert [e for e in page.errors if "WebSocket" not in e] == [], page.errors
    finally:
        stop_server(proc)


def test_fork_after_a_turn_and_revert_from_a_turn_from_the_page(served, browser):
    web, frames = served
    with Client(*frames) as alice:
        alice.initialize("alice", auth_token=ALICE)
        root = alice.call("thread/start", {"name": "branching-root"}).thread.id
        turns = []
        for n in (1, 2, 3):
            turns.append(alice.call("turn/start", {"thread_id": root, "input": [{"text": f"message {n}"}]}).turn.id)
            for note in alice.iter_notifications():
                if note.WhichOneof("payload") == "turn_completed" and note.turn_completed.turn.id == turns[-1]:
                    break
    page = Page(browser, web)
    page.page.on("dialog", lambda dialog: dialog.accept())
    page.sign_in(ALICE)
    page.page.goto(f"{web}/#/thread/{root}")
    expect(page.page.locator(".turn[data-status='completed']")).to_have_count(3)

    page.page.get_by_test_id("effort").select_option("high")
    page.page.get_by_role("button", name="Save settings").click()
    expect(page.page.get_by_test_id("effort")).to_have_value("high")
    page.page.locator(f'.turn[data-turn-id="{turns[1]}"]').get_by_test_id("revert-here").click()
    expect(page.page.locator(".turn.rolled-back")).to_have_count(2)
    expect(page.page.locator(f'.turn[data-turn-id="{turns[0]}"]')).not_to_have_class("turn rolled-back")

    page.page.locator(f'.turn[data-turn-id="{turns[0]}"]').get_by_test_id("fork-here").click()
    expect(page.page.locator("dl.facts")).to_contain_text("forked")
    expect(page.page.locator(".turn")).to_have_count(1)
    expect(page.page.locator(".turns")).to_contain_text("message 1")
    assert root not in page.page.url
    with Client(*frames) as alice:
        alice.initialize("alice", auth_token=ALICE)
        reverted = alice.call("thread/read", {"thread_id": root, "include_turns": True, "include_rolled_back": True}).thread
        assert [turn.rolled_back for turn in reverted.turns] == [False, True, True]
        settings = alice.call("thread/read", {"thread_id": root}).settings
        assert settings.reasoning_effort == "high", "the page's settings form set the effort"
    assert page.errors == [], page.errors


def test_pause_after_tools_set_and_a_paused_turn_continued_from_the_page(served, browser):
    web, frames = served
    with Client(*frames) as alice:
        alice.initialize("alice", auth_token=ALICE)
        root = alice.call("thread/start", {"name": "pausing-root"}).thread.id
    page = Page(browser, web)
    page.sign_in(ALICE)
    page.page.goto(f"{web}/#/thread/{root}")
    page.page.get_by_test_id("pause-after-tools").check()
    page.page.get_by_role("button", name="Save settings").click()
    expect(page.page.get_by_test_id("pause-after-tools")).to_be_checked()
    with Client(*frames) as alice:
        alice.initialize("alice", auth_token=ALICE)
        # The box is checked before the page's update is acknowledged (a
        # loaded CI run read the thread in between): wait for the server.
        deadline = time.monotonic() + 10
        while not alice.call("thread/read", {"thread_id": root}).settings.pause_after_tools and time.monotonic() < deadline:
            time.sleep(0.05)
        assert alice.call("thread/read", {"thread_id": root}).settings.pause_after_tools, "the form set it"
        turn = alice.call("turn/start", {"thread_id": root, "input": [{"text": "#tool nope {}\nafter the pause"}]}).turn.id
    # The page hears the pause live and offers to go on.
    expect(page.page.locator("#thread-status")).to_have_text("paused after tools")
    expect(page.page.locator(f'.turn[data-turn-id="{turn}"]').get_by_test_id("continue-turn")).to_be_visible()
    page.shot("paused-turn")
    page.page.locator(f'.turn[data-turn-id="{turn}"]').get_by_test_id("continue-turn").click()
    expect(page.page.locator(f'.turn[data-turn-id="{turn}"][data-status="completed"]')).to_have_count(1)
    expect(page.page.locator(".turns")).to_contain_text("echo: after the pause")
    with Client(*frames) as alice:
        alice.initialize("alice", auth_token=ALICE)
        done = alice.call("thread/read", {"thread_id": root, "include_turns": True}).thread.turns[-1]
        assert done.id == turn and not done.paused_after_tools
    assert page.errors == [], page.errors


def test_the_cluster_page_shows_an_operator_this_instance_and_its_requests_and_nobody_else(served, browser):
    web, frames = served
    with Client(*frames) as alice:
        alice.initialize("alice", auth_token=ALICE)
        alice.call("thread/start", {"name": "for-the-counts"})
        try:
            alice.call("cluster/status", {})
            raise AssertionError("alice, not an operator, got cluster/status")
        except StatusError as error:
            assert error.code == 7 and "operators" in str(error), error
    page = Page(browser, web)
    page.sign_in(ALICE)
    expect(page.page.locator("#cluster-link")).to_be_hidden()
    page.page.close()
    page = Page(browser, web)
    page.sign_in(OPS)
    page.page.locator("#cluster-link").click()
    expect(page.page.locator("#main h1")).to_have_text("Cluster")
    expect(page.page.get_by_test_id("instances")).to_contain_text("this one")
    expect(page.page.locator("#main")).to_contain_text("One instance: its trees need no leases.")
    methods = page.page.get_by_test_id("methods")
    expect(methods.locator("tr", has_text="thread/start")).to_contain_text("1")
    # The poll redraws (every 2 s): the page's own calls are counted, and the
    # request rate has a bar per poll after the first.
    expect(methods.locator("tr", has_text="cluster/status").locator("td").nth(1)).to_have_text("3", timeout=15000)
    expect(page.page.locator("svg[aria-label='requests per second'] rect")).not_to_have_count(0)
    page.shot("cluster")
    assert page.errors == [], page.errors
