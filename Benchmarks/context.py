"""Issue 24 measurements: a thread of many turns with and without automatic
compaction, and thread/list with a search term over many threads on SQLite
and PostgreSQL.

Usage: context.py SERVER_BIN [--turns N] [--threads N] [--postgres URL]
The embedded scripted backend answers at once, so a turn's time is the
server's own work: two commits, building the model request from the history
(the part that grows with the thread), and the notifications."""
import argparse
import json
import pathlib
import random
import subprocess
import sys
import tempfile
import threading
import time

from threadwire_client import Client


def percentiles(samples):
    ordered = sorted(samples)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]
    return {"p50_ms": round(pick(0.50) * 1000, 3), "p99_ms": round(pick(0.99) * 1000, 3), "n": len(ordered)}


def start_server(binary, directory, config, store=None):
    path = pathlib.Path(directory) / "config.json"
    path.write_text(json.dumps(config))
    storage = ["--store", store] if store else ["--data-dir", str(pathlib.Path(directory) / "store")]
    proc = subprocess.Popen([binary, "--listen", "127.0.0.1:0", "--config", str(path), "--log-level", "error"] + storage,
                            stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline().strip()
    host, port = line.rsplit(" ", 1)[1].rsplit(":", 1)
    return proc, host, int(port)


def rss_bytes(pid):
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def long_thread(binary, turns, window):
    """turn/start → turn/completed for every turn; the last 1,000 reported."""
    config = {"models": [{"slug": "echo-1", "context_window": window}]} if window else {}
    with tempfile.TemporaryDirectory() as directory:
        proc, host, port = start_server(binary, directory, config)
        try:
            with Client(host, port) as client:
                client.initialize("bench-context", opt_out=["item/agent_message/delta", "thread/token_usage/updated"])
                thread_id = client.call("thread/start", {}).thread.id
                samples, compactions = [], 0
                for n in range(turns):
                    started = time.perf_counter()
                    turn_id = client.call("turn/start", {"thread_id": thread_id, "input": [{"text": f"turn {n}: please look at file_{n}.swift"}]}).turn.id
                    for note in client.iter_notifications():
                        kind = note.WhichOneof("payload")
                        if kind == "item_completed" and note.item_completed.item.type == 5:  # CONTEXT_COMPACTION
                            compactions += 1
                        if kind == "turn_completed" and note.turn_completed.turn.id == turn_id:
                            break
                    samples.append(time.perf_counter() - started)
                read_started = time.perf_counter()
                client.call("thread/read", {"thread_id": thread_id, "include_turns": True, "turns_limit": 10})
                read_ms = round((time.perf_counter() - read_started) * 1000, 3)
            return {"turns": turns, "context_window": window, "compactions": compactions,
                    "first_1000": percentiles(samples[:1000]), "last_1000": percentiles(samples[-1000:]),
                    "server_rss_mib": round(rss_bytes(proc.pid) / 2**20, 1), "thread_read_last_10_turns_ms": read_ms}
        finally:
            proc.terminate()
            proc.wait()


WORDS = [f"word{n:02d}" for n in range(50)]


def search(binary, threads, store, label):
    """Creates `threads` named threads over 4 pipelining connections, then
    times thread/list with a rare term (one match), a common one (~2 %),
    and no term."""
    with tempfile.TemporaryDirectory() as directory:
        proc, host, port = start_server(binary, directory, {}, store)
        try:
            def create(worker, count):
                with Client(host, port, timeout=120) as client:
                    client.initialize("bench-search")
                    for start in range(0, count, 500):
                        batch = [("thread/start", {"name": f"task {worker}-{i} {random.choice(WORDS)} uniq{worker}x{i:06d}"})
                                 for i in range(start, min(count, start + 500))]
                        for response in client.call_many(batch):
                            assert response.code == 0, response.message
            started = time.perf_counter()
            workers = [threading.Thread(target=create, args=(w, threads // 4)) for w in range(4)]
            for w in workers: w.start()
            for w in workers: w.join()
            created_s = time.perf_counter() - started
            results = {"store": label, "threads": threads, "create_per_s": round(threads / created_s)}
            with Client(host, port, timeout=120) as client:
                client.initialize("bench-search")
                def timed(params, rounds=300):
                    for _ in range(20):
                        client.call("thread/list", params(0))
                    samples, sizes = [], []
                    for r in range(rounds):
                        t = time.perf_counter()
                        result = client.call("thread/list", params(r))
                        samples.append(time.perf_counter() - t)
                        sizes.append(len(result.data))
                    return {**percentiles(samples), "page_size_mean": round(sum(sizes) / len(sizes), 1)}
                per = threads // 4
                results["rare_term"] = timed(lambda r: {"search_term": f"uniq{r % 4}x{(r * 7919) % per:06d}", "limit": 50})
                results["common_term"] = timed(lambda r: {"search_term": WORDS[r % len(WORDS)], "limit": 50})
                results["no_term"] = timed(lambda r: {"limit": 50})
            return results
        finally:
            proc.terminate()
            proc.wait()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("binary")
    parser.add_argument("--turns", type=int, default=10_000)
    parser.add_argument("--window", type=int, default=8_000, help="context window (tokens) of the compacting run")
    parser.add_argument("--threads", type=int, default=100_000)
    parser.add_argument("--postgres")
    args = parser.parse_args()
    report = {
        "long_thread_without_compaction": long_thread(args.binary, args.turns, None),
        "long_thread_with_compaction": long_thread(args.binary, args.turns, args.window),
        "search_sqlite": search(args.binary, args.threads, None, "sqlite"),
    }
    if args.postgres:
        report["search_postgres"] = search(args.binary, args.threads, args.postgres, "postgres")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
