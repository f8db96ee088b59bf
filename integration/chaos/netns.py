"""Test hosts with real network faults (issue 27): one network namespace per
host (PostgreSQL, each threadwire instance, the clients), joined by veth
links to a bridge in a namespace of its own, so nothing touches the host's
network. Faults are nftables rules inside the hosts' namespaces:

- cut(a, b): every packet between a and b is dropped silently, both ways
  (a partition: connections stall, nothing is refused);
- cut_one_way(a, b): only what a sends to b is lost (requests arrive, their
  answers do not: the case a retry must not apply twice);
- loss(host, percent): that share of the host's packets is dropped at random;
- delay needs tc netem, which not every kernel has (`netem_support()` says).

Needs root (CI runs as root), iproute2 and nftables. Everything made is
named with this process's id and removed by `close()`, which also removes
what an earlier run that died left behind.
"""
import os
import re
import shutil
import subprocess

PREFIX = "twchaos"


def run(*args, check=True, input=None):
    result = subprocess.run(list(args), capture_output=True, text=True, input=input)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {result.stderr.strip() or result.stdout.strip()}")
    return result


def unavailable_reason():
    """Why namespaces cannot be made here (None: they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root (CI runs as root)"
    for tool in ("ip", "nft"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (make test installs iproute2 and nftables)"
    probe = f"{PREFIX}probe{os.getpid()}"
    made = run("ip", "netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    try:
        rules = run("ip", "netns", "exec", probe, "nft", "add", "table", "inet", "probe", check=False)
        if rules.returncode != 0:
            return f"nftables does not work in a namespace here: {rules.stderr.strip()}"
    finally:
        run("ip", "netns", "del", probe, check=False)
    return None


def netem_support():
    """None if tc netem works in a namespace here, else why not."""
    probe = f"{PREFIX}netem{os.getpid()}"
    run("ip", "netns", "add", probe)
    try:
        run("ip", "netns", "exec", probe, "ip", "link", "set", "lo", "up")
        made = run("ip", "netns", "exec", probe, "tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms", check=False)
        return None if made.returncode == 0 else f"tc netem is not available in this kernel: {made.stderr.strip()}"
    finally:
        run("ip", "netns", "del", probe, check=False)


def remove_leftovers():
    """Namespaces of earlier runs whose process is gone."""
    listed = run("ip", "netns", "list", check=False).stdout
    for name in re.findall(rf"^({PREFIX}\d+-\w+)", listed, re.M):
        pid = int(re.match(rf"{PREFIX}(\d+)-", name).group(1))
        try:
            os.kill(pid, 0)
            alive = pid != os.getpid()
        except ProcessLookupError:
            alive = False
        if not alive:
            run("ip", "netns", "del", name, check=False)


class Network:
    """Hosts on one /24 behind a bridge; `hosts` maps a name to its address."""

    def __init__(self, names, subnet="10.77.0"):
        remove_leftovers()
        self.tag = f"{PREFIX}{os.getpid()}"
        self.hosts = {}
        self.cuts = set()
        self.one_way = set()
        self.losses = {}
        self.created = []
        try:
            switch = self._namespace("sw")
            run("ip", "netns", "exec", switch, "ip", "link", "add", "br0", "type", "bridge")
            run("ip", "netns", "exec", switch, "ip", "link", "set", "br0", "up")
            for index, name in enumerate(names):
                namespace = self._namespace(name)
                address = f"{subnet}.{10 + index}"
                port = f"p{index}"
                # Both ends made straight in their namespaces: no name in the host's.
                run("ip", "link", "add", "eth0", "netns", namespace, "type", "veth", "peer", "name", port, "netns", switch)
                run("ip", "netns", "exec", switch, "ip", "link", "set", port, "master", "br0", "up")
                run("ip", "netns", "exec", namespace, "ip", "addr", "add", f"{address}/24", "dev", "eth0")
                run("ip", "netns", "exec", namespace, "ip", "link", "set", "eth0", "up")
                run("ip", "netns", "exec", namespace, "ip", "link", "set", "lo", "up")
                self.hosts[name] = address
                self._rules(name)
        except Exception:
            self.close()
            raise

    def _namespace(self, name):
        namespace = f"{self.tag}-{name}"
        run("ip", "netns", "add", namespace)
        self.created.append(namespace)
        return namespace

    def namespace(self, host):
        return f"{self.tag}-{host}"

    def exec_args(self, host):
        """The command prefix that runs a program on `host`."""
        return ["ip", "netns", "exec", self.namespace(host)]

    def _rules(self, host):
        """Writes the host's whole nftables table from the current faults."""
        lines = [f"table inet chaos {{", "  chain input { type filter hook input priority 0; policy accept;"]
        peers = sorted(other for pair in self.cuts if host in pair for other in pair if other != host)
        senders = sorted(src for src, dst in self.one_way if dst == host)
        receivers = sorted(dst for src, dst in self.one_way if src == host)
        for peer in peers + senders:
            lines.append(f"    ip saddr {self.hosts[peer]} drop")
        if host in self.losses:
            lines.append(f"    numgen random mod 100 < {self.losses[host]} drop")
        lines.append("  }")
        lines.append("  chain output { type filter hook output priority 0; policy accept;")
        for peer in peers + receivers:
            lines.append(f"    ip daddr {self.hosts[peer]} drop")
        if host in self.losses:
            lines.append(f"    numgen random mod 100 < {self.losses[host]} drop")
        lines += ["  }", "}"]
        script = f"table inet chaos\ndelete table inet chaos\n" + "\n".join(lines) + "\n"
        run(*self.exec_args(host), "nft", "-f", "-", input=script)

    def cut(self, a, b):
        self.cuts.add(frozenset((a, b)))
        self._rules(a)
        self._rules(b)

    def cut_one_way(self, a, b):
        self.one_way.add((a, b))
        self._rules(a)
        self._rules(b)

    def heal(self, a=None, b=None):
        """Heals one link (both ways), or (no arguments) every cut and loss."""
        touched = set()
        if a is None:
            touched = set(self.hosts) if (self.cuts or self.one_way or self.losses) else set()
            self.cuts.clear()
            self.one_way.clear()
            self.losses.clear()
        else:
            self.cuts.discard(frozenset((a, b)))
            self.one_way.discard((a, b))
            self.one_way.discard((b, a))
            touched = {a, b}
        for host in touched:
            self._rules(host)

    def loss(self, host, percent):
        self.losses[host] = percent
        self._rules(host)

    def delay(self, host, milliseconds):
        run(*self.exec_args(host), "tc", "qdisc", "replace", "dev", "eth0", "root", "netem", "delay", f"{milliseconds}ms")

    def close(self):
        for namespace in reversed(self.created):
            # Processes left in a namespace keep it alive: end them first.
            pids = run("ip", "netns", "pids", namespace, check=False).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), 9)
                except (ProcessLookupError, ValueError):
                    pass
            run("ip", "netns", "del", namespace, check=False)
        self.created = []
