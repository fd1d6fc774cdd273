"""The firewall analysis held against the kernel.

Generated rulesets (tests/lab/rulesets.py) are loaded into a server network namespace;
real TCP connections are made from cluster addresses in a client namespace, joined to it
by a veth pair; and each connection's fate is compared with the analysis' verdict for it,
the ruleset read as the firewall check reads it (``LIVE_RULESET`` in the server namespace,
then ``analyse_live``). Traffic stays between the two namespaces, in ``10.{TEST_NET+6}/16``.

A probe the analysis calls accepted that the kernel does not connect is a false open; one
it calls dropped or rejected that connects is a false closed; both must be zero. An
uncertain verdict is counted apart, and so is a drop the kernel answers (or a reject it
does not): these are recorded, not failures.

``GPUFLEET_FW_DIFF_REPORT=PATH`` writes the summary as JSON (for docs/benchmarks.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gpufleet.firewall_analysis.findings import Finding
from gpufleet.firewall_analysis.live import LIVE_RULESET, analyse_live
from tests.lab.conftest import TEST_NET
from tests.lab.rulesets import LARGE, PORTS, SMALL, Case, Net, Size, generate

NET = Net(TEST_NET + 6, f"gffw{TEST_NET}s")
SERVER_NS = f"gffw{TEST_NET}-srv"
CLIENT_NS = f"gffw{TEST_NET}-cli"
CLIENT_IF = f"gffw{TEST_NET}c"
CONNECT_TIMEOUT = 0.7
"""Seconds a probe waits for the handshake: below the first SYN retransmission (1 s), so
each probe sends one SYN."""
SOURCE_PORTS = (10000, 32767)
"""Probes bind source ports in turn from here, below the ephemeral range, so no probe
reuses a connection tuple the server's conntrack may still remember."""

_LISTEN = """
import socket, sys
held = []
for port in sys.argv[2:]:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((sys.argv[1], int(port)))
    s.listen(64)
    held.append(s)
print("ready", flush=True)
sys.stdin.read()
"""

_PROBE = """
import errno, json, selectors, socket, struct, sys, time
job = json.load(sys.stdin)
selector = selectors.DefaultSelector()
outcome = ["timeout"] * len(job["probes"])
held = []
def settled(s, code):
    # An established socket got its SYN-ACK: an error after it (a reset, an ICMP error)
    # answers a later packet of the connection, not the SYN.
    if code == 0:
        return "connected"
    name = errno.errorcode.get(code, str(code))
    if code == errno.ECONNRESET or s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] == 1:
        return "connected, then " + name
    return "refused " + name
for i, (source, sport, port) in enumerate(job["probes"]):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.setblocking(False)
    s.bind((source, sport))
    held.append(s)
    code = s.connect_ex((job["server"], port))
    if code == errno.EINPROGRESS:
        selector.register(s, selectors.EVENT_WRITE, i)
    else:
        outcome[i] = settled(s, code)
deadline = time.monotonic() + job["timeout"]
while selector.get_map() and deadline > time.monotonic():
    for key, _ in selector.select(deadline - time.monotonic()):
        selector.unregister(key.fileobj)
        code = key.fileobj.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        outcome[key.data] = settled(key.fileobj, code)
json.dump(outcome, sys.stdout)
"""


def _run(argv: list[str], stdin: str | None = None, check: bool = True) -> str:
    proc = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=60,
                          check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(argv)[:300]} failed ({proc.returncode}): "
                             f"{proc.stderr.strip()}")
    return proc.stdout


def _ns(ns: str, script: str, check: bool = True) -> str:
    return _run(["ip", "netns", "exec", ns, "sh", "-c", script], check=check)


def _remove_namespaces() -> None:
    for ns in (SERVER_NS, CLIENT_NS):
        _run(["ip", "netns", "delete", ns], check=False)
    for dev in (NET.iif, CLIENT_IF):
        _run(["ip", "link", "delete", dev], check=False)


def _mac(ns: str, dev: str) -> str:
    links = json.loads(_run(["ip", "-n", ns, "-j", "link", "show", "dev", dev]))
    return str(links[0]["address"])


_FLUSH = """set -e
nft flush ruleset
for t in $(cat /proc/net/ip_tables_names 2>/dev/null); do
  iptables-legacy -t "$t" -F
  iptables-legacy -t "$t" -X
  for c in $(iptables-legacy -t "$t" -S | sed -n 's/^-P \\([A-Z]*\\) .*/\\1/p'); do
    iptables-legacy -t "$t" -P "$c" ACCEPT
  done
done
"""
"""Empties the server namespace: nft (iptables-nft's tables too) and iptables-legacy."""


@dataclass(frozen=True)
class Probe:
    """One connection: the analysis' verdict (and rule) and what the kernel did."""

    source: str
    port: int
    verdict: str
    rule: str
    kernel: str
    why: str = ""

    @property
    def outcome(self) -> str:
        """connected, refused or timeout."""
        return self.kernel.split()[0].rstrip(",")

    @property
    def is_open(self) -> bool:
        return self.outcome == "connected"


@dataclass
class Tally:
    """Counts over all cases, and the cases with disagreements, for the report."""

    cases: int = 0
    probes: int = 0
    agree: int = 0
    false_open: int = 0
    false_closed: int = 0
    uncertain: int = 0
    kind_mismatch: int = 0
    seconds: float = 0.0
    uncertain_kernel: Counter[str] = field(default_factory=Counter)
    uncertain_why: Counter[str] = field(default_factory=Counter)
    disagreements: list[tuple[Case, list[Probe]]] = field(default_factory=list)
    kinds: list[tuple[Case, list[Probe]]] = field(default_factory=list)

    def add(self, case: Case, probes: list[Probe]) -> None:
        wrong: list[Probe] = []
        kinds: list[Probe] = []
        self.cases += 1
        for probe in probes:
            self.probes += 1
            if probe.verdict == "uncertain":
                self.uncertain += 1
                self.uncertain_kernel[probe.outcome] += 1
                self.uncertain_why[probe.why] += 1
            elif (probe.verdict == "accepted") != probe.is_open:
                wrong.append(probe)
                if probe.verdict == "accepted":
                    self.false_open += 1
                else:
                    self.false_closed += 1
            else:
                self.agree += 1
                timed_out = probe.outcome == "timeout"
                if (probe.verdict == "dropped") != timed_out and not probe.is_open:
                    self.kind_mismatch += 1
                    kinds.append(probe)
        if wrong:
            self.disagreements.append((case, wrong))
        if kinds:
            self.kinds.append((case, kinds))

    def summary(self) -> dict[str, object]:
        return {"cases": self.cases, "probes": self.probes, "agree": self.agree,
                "false_open": self.false_open, "false_closed": self.false_closed,
                "uncertain": self.uncertain, "drop_reject_mismatch": self.kind_mismatch,
                "seconds": round(self.seconds, 1)}

    def report(self, informational: bool = True) -> str:
        """The counts, then every disagreement grouped by case with the case's ruleset, and
        the drop/reject mismatches."""
        lines = [" ".join(f"{k}={v}" for k, v in self.summary().items()),
                 f"uncertain verdicts: kernel {dict(self.uncertain_kernel)}, "
                 f"why {dict(self.uncertain_why.most_common())}"]
        for title, items in (("DISAGREEMENTS", self.disagreements),
                             ("drop/reject mismatches (informational)", self.kinds)):
            if not items or (title != "DISAGREEMENTS" and not informational):
                continue
            lines.append(f"== {title}: {sum(len(p) for _, p in items)} probes in "
                         f"{len(items)} cases")
            for case, probes in items:
                lines.append(f"-- case {case.seed}"
                             + (f" ({case.pattern})" if case.pattern else ""))
                lines += _grouped(probes)
                if title == "DISAGREEMENTS":
                    lines.append(case.text().rstrip())
        return "\n".join(lines)


def _grouped(probes: list[Probe]) -> list[str]:
    """Probes of one case with the same verdict, rule and kernel outcome on one line."""
    groups: dict[tuple[str, str, str], list[str]] = {}
    for p in probes:
        groups.setdefault((p.verdict, p.rule, p.kernel), []).append(f"{p.source}:{p.port}")
    return [f"   analysis {verdict} ({rule}); kernel {kernel}: {', '.join(where)}"
            for (verdict, rule, kernel), where in groups.items()]


class KernelLab:
    """The two namespaces, and one case run through them."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.sport = SOURCE_PORTS[0]

    def up(self) -> None:
        _remove_namespaces()
        for ns in (SERVER_NS, CLIENT_NS):
            _run(["ip", "netns", "add", ns])
            _ns(ns, "sysctl -qw net.ipv6.conf.all.disable_ipv6=1 "
                    "net.ipv6.conf.default.disable_ipv6=1 && ip link set lo up")
        _run(["ip", "link", "add", NET.iif, "netns", SERVER_NS, "type", "veth", "peer",
              "name", CLIENT_IF, "netns", CLIENT_NS])
        server_mac, client_mac = _mac(SERVER_NS, NET.iif), _mac(CLIENT_NS, CLIENT_IF)
        # ICMP errors of rejects unlimited, no reverse-path filter, and neighbours fixed:
        # an ingress chain that drops ARP must not turn an accepted SYN into a timeout.
        neighbours = " && ".join(
            f"ip neigh replace {address} lladdr {client_mac} dev {NET.iif} nud permanent"
            for address in (NET.client, *NET.pool))
        _ns(SERVER_NS, f"sysctl -qw net.ipv4.icmp_ratemask=0 net.ipv4.conf.all.rp_filter=0 "
                       f"net.ipv4.conf.{NET.iif}.rp_filter=0 && "
                       f"ip addr add {NET.server}/16 dev {NET.iif} && "
                       f"ip link set {NET.iif} up && {neighbours}")
        addresses = " && ".join(f"ip addr add {address}/32 dev {CLIENT_IF}"
                                for address in NET.pool)
        _ns(CLIENT_NS, f"ip addr add {NET.client}/16 dev {CLIENT_IF} && {addresses} && "
                       f"ip link set {CLIENT_IF} up && ip neigh replace {NET.server} "
                       f"lladdr {server_mac} dev {CLIENT_IF} nud permanent")

    def down(self) -> None:
        _remove_namespaces()

    def load(self, case: Case) -> None:
        """Empty the server namespace, then load iptables-legacy's, iptables-nft's and nft's
        rules, in that order."""
        steps = [_FLUSH]
        for name, text, command in (
                ("legacy", case.iptables_legacy, "iptables-legacy-restore < {}"),
                ("iptables-nft", case.iptables_nft, "iptables-nft-restore < {}"),
                ("nft", case.nft, "nft -f {}")):
            if text:
                path = self.workdir / f"{name}.rules"
                path.write_text(text)
                steps.append(command.format(path))
        try:
            _ns(SERVER_NS, "\n".join(steps))
        except AssertionError as exc:
            raise AssertionError(f"case {case.seed} does not load: {exc}\n{case.text()}") from None

    def connect(self, probes: list[tuple[str, int]]) -> list[str]:
        """What the kernel does to each (source, port): connected, refused ..., timeout."""
        low, high = SOURCE_PORTS
        job = []
        for source, port in probes:
            job.append((source, self.sport, port))
            self.sport = low if self.sport >= high else self.sport + 1
        out = _run(["ip", "netns", "exec", CLIENT_NS, sys.executable, "-c", _PROBE],
                   stdin=json.dumps({"server": NET.server, "timeout": CONNECT_TIMEOUT,
                                     "probes": job}))
        return [str(outcome) for outcome in json.loads(out)]

    def run(self, case: Case) -> list[Probe]:
        """Load ``case``, listen on every probed port, read the live ruleset, probe, and
        pair each probe's kernel outcome with the analysis' verdict."""
        self.load(case)
        ports = sorted({port for _, port in case.probes})
        listener = subprocess.Popen(
            ["ip", "netns", "exec", SERVER_NS, sys.executable, "-c", _LISTEN, NET.server,
             *map(str, ports)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True)
        try:
            live_text = _ns(SERVER_NS, LIVE_RULESET.shell, check=False)
            assert listener.stdout is not None
            ready = listener.stdout.readline().strip() == "ready"
            kernel = self.connect(list(case.probes)) if ready else []
        finally:
            errors = listener.communicate(timeout=30)[1]
        if not ready:
            raise AssertionError(f"case {case.seed}: the listener did not start: {errors}")
        analysis = analyse_live(LIVE_RULESET.parse(live_text), case.sources, list(PORTS),
                                NET.iif)
        by_source: dict[str, list[Finding]] = {}
        for finding in analysis.findings:
            for source in finding.sources:
                by_source.setdefault(source, []).append(finding)
        probes = []
        for (source, port), outcome in zip(case.probes, kernel, strict=True):
            found = [f for f in by_source.get(source, []) if f.ports[0] <= port <= f.ports[1]]
            assert len(found) == 1, (f"case {case.seed}: {len(found)} findings for {source} "
                                     f"port {port}\n{analysis.findings}")
            rule = str(found[0].rule) if found[0].rule else "no rule"
            cause = found[0].cause
            why = cause.reason.split(":")[0] if cause else ""
            probes.append(Probe(source, port, found[0].verdict, rule, outcome, why))
        return probes


@pytest.fixture(scope="module")
def kernel_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KernelLab]:
    """The namespaces, checked with an empty ruleset (every probe connects); removed after
    the module, whatever happened."""
    if os.geteuid() != 0:
        pytest.skip("lab tests need root: they create network namespaces and load rulesets")
    lab = KernelLab(tmp_path_factory.mktemp("firewall-kernel"))
    try:
        lab.up()
        empty = Case(0, "", "", "", NET.pool,
                     tuple((s, p) for s in NET.pool for p in (PORTS[0][0], *PORTS[1])))
        outcomes = {p.kernel for p in lab.run(empty)}
        assert outcomes == {"connected"}, f"an empty ruleset does not admit everything: {outcomes}"
        yield lab
    finally:
        lab.down()


def _differential(lab: KernelLab, seeds: range, size: Size) -> Tally:
    tally = Tally()
    start = time.monotonic()
    for seed in seeds:
        case = generate(seed, NET, size)
        tally.add(case, lab.run(case))
    tally.seconds = time.monotonic() - start
    print(tally.report())
    path = os.environ.get("GPUFLEET_FW_DIFF_REPORT")
    if path:
        Path(path).write_text(json.dumps(tally.summary(), indent=2) + "\n")
    return tally


def test_the_analysis_agrees_with_the_kernel(kernel_lab: KernelLab) -> None:
    """60 generated cases (the scale tier runs 1,000): no false open and no false closed
    verdict."""
    tally = _differential(kernel_lab, range(1, 61), SMALL)
    assert (tally.false_open, tally.false_closed) == (0, 0), tally.report(informational=False)


@pytest.mark.scale
@pytest.mark.timeout(3600)
def test_the_analysis_agrees_with_the_kernel_at_scale(kernel_lab: KernelLab) -> None:
    """1,000 cases of larger rulesets, the same assertions."""
    tally = _differential(kernel_lab, range(100_001, 101_001), LARGE)
    assert (tally.false_open, tally.false_closed) == (0, 0), tally.report(informational=False)
