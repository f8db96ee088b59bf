#!/usr/bin/env python3
"""The server's user time by part of the request path, from a perf.data that
Benchmarks/profile.sh kept (KEEP=DIR). Each sample whose innermost frame is
in user space goes to the first part (in the order below) that any frame of
its stack names, so the parts add up to the user share. With the CPU per
request profile.sh printed, each part is also given in µs per request.

Usage: Benchmarks/profile_parts.py DIR/perf.data [CPU_US_PER_REQUEST]
"""
import collections
import re
import subprocess
import sys

# Innermost work first: a sample under the metrics inside an answer is the metrics'.
PARTS = [
    ("metrics", r"MethodInstruments|LatencyHistogram|11CoreMetrics|10Prometheus|frameOut"),
    ("decode", r"Envelope.*serializedBytes|protobuf_c_message_unpack|free_unpacked"),
    ("encode and write the answer", r"responseFrame|FrameResult|ByteBufferAllocatorV13ThreadwireNIOE5frame"),
    ("the inline handler", r"RunInline|InlineAnswer|SessionHandlers"),
    ("admission", r"CallDispatcherV5check|admits|RequestGate"),
    ("answerNow, the rest", r"answerNow"),
    ("ConnectionHandler.channelRead, the rest", r"ConnectionHandlerC11channelRead7"),
    ("frame splitting", r"FrameSplitter"),
    ("read complete", r"channelReadComplete|invokeB12ReadComplete|fireB10Registered"),
    ("read() through flow control", r"FlowControlHandlerC4read|readIfNeeded|readsAllowed"),
    ("flush (tick flusher, socket write)", r"TickFlusher|flushNow|flush0"),
    ("socket read", r"readFromSocket|readFromD0"),
    ("event loop, epoll", r"whenReady|epoll|runOneLoopTick|_blockingWaitForWork|SelectableEventLoop"),
]


def main():
    data = sys.argv[1]
    cpu = float(sys.argv[2]) if len(sys.argv) > 2 else None
    script = subprocess.run(["perf", "script", "-i", data, "-F", "ip,sym,dso"], capture_output=True, text=True).stdout
    counts = collections.Counter()
    total = user = 0
    for block in script.split("\n\n"):
        frames = [line.strip() for line in block.strip().split("\n") if line.strip()]
        if not frames:
            continue
        total += 1
        if "kernel.kallsyms" in frames[0]:
            continue
        user += 1
        part = next((name for name, pattern in PARTS if any(re.search(pattern, f) for f in frames)), "other")
        counts[part] += 1

    def row(name, n):
        us = f"  {cpu * n / total:5.2f} µs" if cpu else ""
        print(f"{name:42s} {100 * n / total:5.2f} %{us}")

    row("user time, all parts", user)
    for name, _ in PARTS + [("other", "")]:
        row("  " + name, counts[name])


if __name__ == "__main__":
    main()
