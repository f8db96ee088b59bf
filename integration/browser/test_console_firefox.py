"""The operator's console in Debian's Firefox ESR, driven over WebDriver BiDi
(Firefox's own remote protocol, spoken here with `websockets`: playwright
drives only its patched Firefox builds, which cannot be downloaded here).
The same pages as in chromium: sign in, the threads list, a thread with its
agent tree and a child, the cluster page; no script error on any of them."""
import asyncio
import json
import pathlib
import shutil
import socket
import subprocess
import sys
import time

import pytest
import websockets

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "integration" / "python"))
from threadwire_client import Client  # noqa: E402
# The same server as the chromium tests: tokens for alice, bob and an operator.
from test_console import OPS, served  # noqa: E402,F401

FIREFOX = shutil.which("firefox-esr") or "/usr/bin/firefox-esr"


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class BiDi:
    """One WebDriver BiDi session: commands answered by id, events kept."""

    def __init__(self, socket_):
        self.socket = socket_
        self.next_id = 0
        self.events = []

    async def command(self, method, params):
        self.next_id += 1
        sent = self.next_id
        await self.socket.send(json.dumps({"id": sent, "method": method, "params": params}))
        while True:
            message = json.loads(await asyncio.wait_for(self.socket.recv(), 30))
            if message.get("id") == sent:
                if message.get("type") == "error":
                    raise AssertionError(f"{method}: {message.get('error')}: {message.get('message')}")
                return message["result"]
            if message.get("type") == "event":
                self.events.append(message)

    async def evaluate(self, context, expression):
        result = await self.command("script.evaluate", {
            "expression": expression, "target": {"context": context}, "awaitPromise": True})
        if result.get("type") == "exception":
            raise AssertionError(f"{expression}: {result['exceptionDetails'].get('text')}")
        return result["result"].get("value")

    async def wait_for(self, context, expression, what, seconds=20):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if await self.evaluate(context, expression):
                return
            await asyncio.sleep(0.1)
        raise AssertionError(f"not within {seconds} s: {what}")

    def errors(self):
        return [event["params"] for event in self.events
                if event.get("method") == "log.entryAdded" and event["params"].get("level") == "error"]


@pytest.fixture()
def firefox(tmp_path):
    port = free_port()
    profile = tmp_path / "profile"
    profile.mkdir()
    process = subprocess.Popen([FIREFOX, "--headless", "--no-remote", "--profile", str(profile),
                                "--remote-debugging-port", str(port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    # Firefox says where its remote agent listens once it does.
    deadline = time.monotonic() + 60
    for line in process.stderr:
        if "WebDriver BiDi listening on" in line:
            break
        if time.monotonic() > deadline:
            break
    yield f"ws://127.0.0.1:{port}/session"
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()


def test_the_console_works_in_firefox_without_script_errors(served, firefox):
    web, frames = served
    with Client(*frames) as ops:
        ops.initialize("ops", auth_token=OPS)
        root = ops.call("thread/start", {"name": "firefox-root"}).thread.id
        turn = ops.call("turn/start", {"thread_id": root, "input": [{"text": "plan"}]}).turn.id
        for note in ops.iter_notifications():
            if note.WhichOneof("payload") == "turn_completed" and note.turn_completed.turn.id == turn:
                break
        child = ops.call("agent/spawn", {"parent_thread_id": root}).thread.id

    async def drive():
        async with websockets.connect(firefox, max_size=None) as socket_:
            bidi = BiDi(socket_)
            await bidi.command("session.new", {"capabilities": {}})
            await bidi.command("session.subscribe", {"events": ["log.entryAdded"]})
            tree = await bidi.command("browsingContext.getTree", {})
            context = tree["contexts"][0]["context"]
            await bidi.command("browsingContext.navigate", {"context": context, "url": web + "/", "wait": "complete"})
            await bidi.wait_for(context, "document.querySelector('#token') !== null", "the sign-in form")
            await bidi.evaluate(context, f"document.querySelector('#token').value = {json.dumps(OPS)};"
                                         "document.querySelector('form.signin').requestSubmit(); true")
            await bidi.wait_for(context, "document.querySelector('#main h1')?.textContent === 'Threads'", "the threads page")
            await bidi.wait_for(context, f"document.querySelector('#main').textContent.includes('firefox-root')",
                                "the thread in the list")
            await bidi.evaluate(context, f"location.hash = '#/thread/{root}'; true")
            await bidi.wait_for(context, f"document.querySelector('svg[data-testid=agent-tree] g[data-thread-id=\"{child}\"]') !== null",
                                "the agent tree with the child")
            await bidi.evaluate(context, "location.hash = '#/cluster'; true")
            await bidi.wait_for(context, "document.querySelector('[data-testid=instances]')?.textContent.includes('this one')",
                                "the cluster page")
            await asyncio.sleep(2.5)  # one poll of the cluster page
            await bidi.evaluate(context, "1")  # events sent before this answer are in
            errors = bidi.errors()
            # The watch itself: an uncaught error on the page is seen.
            await bidi.evaluate(context, "setTimeout(() => { throw new Error('planted') }, 0); true")
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not any("planted" in entry.get("text", "") for entry in bidi.errors()):
                await asyncio.sleep(0.2)
                await bidi.evaluate(context, "1")
            return errors, bidi.errors()

    errors, with_planted = asyncio.run(drive())
    assert errors == [], errors
    assert any("planted" in entry.get("text", "") for entry in with_planted), "a script error on the page would go unseen"
