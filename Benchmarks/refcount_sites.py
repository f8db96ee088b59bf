#!/usr/bin/env python3
"""Where a request's retains and releases are made: from a perf.data of the
swift_retain and swift_release uprobes recorded with call stacks
(Benchmarks/allocations.sh, SITES=DIR), each sampled call is charged to the
first frames outside the runtime, and the shares are scaled to the counts
per request that perf stat measured.

Usage: Benchmarks/refcount_sites.py PERF_DATA RETAINS_PER_REQUEST RELEASES_PER_REQUEST [DEPTH] [TOP]
"""
import collections
import re
import subprocess
import sys


def main():
    data, per_request = sys.argv[1], {"retain": float(sys.argv[2]), "release": float(sys.argv[3])}
    depth = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    top = int(sys.argv[5]) if len(sys.argv) > 5 else 40
    script = subprocess.run(["perf", "script", "-i", data, "-F", "event,ip,sym"], capture_output=True, text=True).stdout
    sites = collections.Counter()
    samples = collections.Counter()
    for block in script.split("\n\n"):
        lines = [line.strip() for line in block.strip().split("\n") if line.strip()]
        if not lines:
            continue
        kind = "retain" if "swift_retain" in lines[0] else "release"
        frames = []
        for line in lines[1:]:
            parts = line.split(None, 1)
            symbol = re.sub(r"\s*\(.*\)$", "", re.sub(r"\+0x[0-9a-f]+", "", parts[1] if len(parts) > 1 else "?"))
            if not symbol.startswith(("swift_retain", "swift_release")):
                frames.append(symbol)
        sites[(kind, " <- ".join(frames[:depth]))] += 1
        samples[kind] += 1
    demangle = subprocess.run(["swift", "demangle", "--simplified"], input="\n".join(s for _, s in sites),
                              capture_output=True, text=True).stdout.split("\n")
    names = dict(zip((s for _, s in sites), demangle))
    print("per request\tkind\tcalled from")
    for (kind, site), n in sites.most_common(top):
        print(f"{n / samples[kind] * per_request[kind]:.2f}\t{kind}\t{names.get(site, site)[:200]}")


if __name__ == "__main__":
    main()
