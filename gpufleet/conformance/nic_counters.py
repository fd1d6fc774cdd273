"""The NIC's own counters around a measurement, and the line rate the measurement is held
against.

A sample reads, on one node in one round trip: every interface's ``/sys/class/net/*/
statistics`` and link speed, ``ethtool -S`` of every interface, every RDMA port's
``counters`` and ``hw_counters`` with its rate and state, and the node's TCP counters
(``/proc/net/snmp``). Every node is sampled at once before and after a multi-node AllReduce
and a reachability run; the deltas of the counters that mean trouble (drops, errors,
pause frames per priority, ECN marks and CNPs, retransmits) are kept per node, and a node
whose drops or errors on its fabric ports pass their bounds fails. Per-queue counters are
left out (their totals are read). The fabric ports are found from the address the node was
reached at (``SSH_CONNECTION`` on the node, else its inventory address, resolved on the
controller when it is a name); a node none of whose interfaces holds it is unknown.

TCP retransmits are laid on paths, not on senders: the probes read each connection's
segments, retransmitted and sent, from its socket before it closes (``Path``); a path over
its share is lossy, and the node common to the lossy paths is named. A lossy path no other
lossy path explains is weighed on all the other evidence (``weigh``): its sender's other
paths out against its receiver's other paths in, over every phase, lossy or not, each side
pooled. One path over the ratio and the others under it by chance is what random loss
gives on a short run, so a side is read from its pooled counts, not from its paths'
verdicts: the end whose side retransmitted more than MIN_RETRANSMITS segments, at a rate
above the other side's that chance does not explain (a one-sided exact binomial test:
were both rates the same, the two sides' retransmits together, each landing on a side in
proportion to the segments it sent, would split at least this unevenly less than
SIGNIFICANCE of the time), is named alone; else both ends are (one path cannot tell which
end loses). The floor keeps a clean path's tail-loss probes (a segment or two per
connection, however few segments it sent) from pointing at anyone. The SYNs a connect to a
filtered port sends again are the measurement's own and count against no one.

A node's line rate is what its fabric can carry: ``nic_line_rate_gbps`` where declared;
else, on GPU nodes whose NCCL crosses nodes over RDMA, the declared ports (the fabric
suite's ``rdma_port_count`` x ``rdma_port_rate_gbps``, or its GPU model's defaults) where a
rate is declared: a port that trained down, is not ACTIVE or is missing does not lower the
bar but is named, and fails the node's multi-node runs; else the sum of the current rates of
the ACTIVE RDMA ports NCCL may use (``NCCL_IB_HCA``); else the link speed of the interface
holding the node's inventory address.

Shared machinery: the reachability, allreduce and network suites each read it.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import math
import re
import socket
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as Late
from dataclasses import dataclass, field, replace
from typing import Any

from gpufleet.conformance.checks.allreduce import expected_transports
from gpufleet.conformance.checks.fabric import Declaration, judged_ports, nccl_usable, port_name
from gpufleet.conformance.session import Node
from gpufleet.conformance.suites.allreduce import AllreduceSettings
from gpufleet.conformance.suites.common import Counters
from gpufleet.conformance.suites.fabric import FabricSettings, declared, ports_fact
from gpufleet.connect.connection import node_local
from gpufleet.errors import GpufleetError, ParseError
from gpufleet.facts import script
from gpufleet.facts.parsers import network

KINDS = ("drops", "errors", "pause", "ecn", "retransmits")
MIN_RETRANSMITS = 10  # fewer retransmitted segments never fail a node, whatever the ratio
SIGNIFICANCE = 0.01  # how unlikely under equal rates a side's share of retransmits must be
SAMPLE_TIMEOUT_S = 30.0
ETHTOOL_LIMIT_S = 10.0
RESOLVE_TIMEOUT_S = 5.0
MAX_PEERS = 256  # per-connection counts read from one probe's line, as the probe bounds them
_PER_QUEUE = re.compile(r"^\[\d+\]|^(?:rx|tx)[-_]?\d+[_.]|queue_\d+|^ch_?\d+_|^q\d+_|_q\d+_")
# Corrected bits and FEC lanes, subnet management (VL15), XDP's own drops, byte and duration
# counters beside the event counters, and work flushed when a queue pair is torn down.
_NOT_TROUBLE = re.compile(r"corrected|err_lane|vl15|xdp|bytes|duration|flush")
_KIND_PATTERNS = (
    ("pause", re.compile(r"pause|xoff|pfc")),
    ("ecn", re.compile(r"cnp|ecn")),
    ("retransmits", re.compile(r"retrans|out_of_sequence|seq_err|local_ack_timeout|rnr_nak")),
    ("drops", re.compile(r"drop|discard|out_of_buffer|missed_(?:err|pack)|fifo_err|over_err|"
                         r"overrun")),
    ("errors", re.compile(r"err|crc|fcs|symbol|link_downed|integrity")),
)
_PRIORITY = re.compile(r"(?:priority|prio|pri)_?(\d)(?!\d)")
_IFACE_FILE = re.compile(r"^(?P<port>[^/]+)/(?P<file>speed|operstate|statistics/\w+)$")
_RDMA_FILE = re.compile(
    r"^(?P<dev>[^/]+)/ports/(?P<port>\d+)/(?P<file>rate|state|(?:hw_)?counters/\w+)$")


def kind(counter: str) -> tuple[str, int | None] | None:
    """What a counter counts (one of KINDS) and its priority (PFC counters), or None for a
    counter that is not trouble or is one queue's share of a total."""
    name = counter.rsplit("/", 1)[-1].lower()
    if _PER_QUEUE.search(name) or _NOT_TROUBLE.search(name):
        return None
    for found, pattern in _KIND_PATTERNS:
        if pattern.search(name):
            priority = _PRIORITY.search(name) if found == "pause" else None
            return found, int(priority.group(1)) if priority else None
    return None


@dataclass(frozen=True)
class Port:
    """One interface (``eth0``) or RDMA port (``mlx5_0/1``) as one sample saw it."""

    name: str
    counters: dict[str, int] = field(default_factory=dict)  # "statistics/rx_dropped": 0
    rate_gbps: float | None = None
    state: str | None = None
    rdma: bool = False


@dataclass(frozen=True)
class Sample:
    """Every port of one node, its TCP counters, the addresses it was reached at, and what
    could not be read."""

    ports: dict[str, Port]
    tcp: dict[str, int]
    taken: float
    unknown: tuple[str, ...] = ()
    reached: tuple[str, ...] = ()


def sample_command(nonce: str) -> str:
    """The one-round-trip script that reads a node's counters."""
    return script.compose([
        ("net", "cd /sys/class/net && grep -H . */speed */operstate */statistics/* "
                "2>/dev/null; true"),
        ("rdma", "[ -d /sys/class/infiniband ] || exit 0; cd /sys/class/infiniband && "
                 "grep -H . */ports/*/rate */ports/*/state */ports/*/counters/* "
                 "*/ports/*/hw_counters/* 2>/dev/null; true"),
        ("snmp", "cat /proc/net/snmp"),
        ("peer", 'printf "%s\\n" "${SSH_CONNECTION:-}" | head -c 200'),
        script.Snippet("ethtool", "command -v ethtool >/dev/null || exit 127; "
                       "for d in /sys/class/net/*; do n=${d##*/}; [ \"$n\" = lo ] && continue; "
                       f"printf '@@if-{nonce} %s ' \"$n\"; ethtool -S \"$n\" 2>&1 | base64 | "
                       "tr -d '\\n'; echo; done", "ethtool"),
    ], nonce, limit_s=ETHTOOL_LIMIT_S)


def _number(value: str) -> int | None:
    try:
        return int(value)
    except ValueError:
        return None


def _speed_gbps(value: str) -> float | None:
    """sysfs ``speed`` (Mb/s) in Gb/s; None where the driver reports no speed (-1, or the
    same as an unsigned 32-bit number)."""
    mbps = _number(value)
    return None if mbps is None or mbps <= 0 or mbps >= 2**32 - 1 else mbps / 1000


def ethtool_sections(text: str, nonce: str) -> dict[str, str]:
    """The ethtool section's output split per interface: one line each, the interface's
    name and its ``ethtool -S`` output in base64, so nothing ethtool prints can start or
    forge another interface's counters. A name given twice is not trusted."""
    marker = f"@@if-{nonce} "
    found: dict[str, str] = {}
    seen: set[str] = set()
    for line in text.splitlines():
        if not line.startswith(marker):
            continue
        name, _, encoded = line[len(marker):].partition(" ")
        try:
            body = base64.b64decode(encoded.strip(), validate=True).decode("utf-8", "replace")
        except (binascii.Error, ValueError):
            body = f"not base64: {encoded[:40]!r}"
        found[name] = "the interface was listed twice; not trusted" if name in seen else body
        seen.add(name)
    return found


def _interfaces(section: script.Section | None) -> dict[str, dict[str, Any]]:
    """Interfaces from the ``net`` section: speed, state and statistics."""
    interfaces: dict[str, dict[str, Any]] = {}
    for path, value in (network.sysfs_values(section.text) if section else {}).items():
        match = _IFACE_FILE.match(path)
        if not match or match["port"] == "lo":
            continue
        entry = interfaces.setdefault(match["port"], {"counters": {}})
        if match["file"] == "speed":
            entry["rate"] = _speed_gbps(value)
        elif match["file"] == "operstate":
            entry["state"] = value
        elif (number := _number(value)) is not None:
            entry["counters"][match["file"]] = number
    return interfaces


def _ethtool(section: script.Section | None, nonce: str,
             interfaces: dict[str, dict[str, Any]], unknown: list[str]) -> None:
    """Add every interface's ``ethtool -S`` counters (``ethtool/NAME``)."""
    if section is None or section.rc == 127:
        return
    if section.rc != 0:
        unknown.append(f"ethtool -S: {section.text.strip()[-120:]}")
        return
    for name, text in ethtool_sections(section.text, nonce).items():
        try:
            stats = network.ethtool_stats(text)
        except ParseError:
            unknown.append(f"ethtool -S {name}: {text.strip()[:80] or 'no output'}")
            continue
        if name in interfaces:
            interfaces[name]["counters"].update({f"ethtool/{k}": v for k, v in stats.items()})


def _rdma(section: script.Section | None, unknown: list[str]) -> dict[str, Port]:
    """RDMA ports from the ``rdma`` section: rate, state, counters and hw_counters."""
    found: dict[str, dict[str, Any]] = {}
    for path, value in (network.sysfs_values(section.text) if section else {}).items():
        match = _RDMA_FILE.match(path)
        if not match:
            continue
        entry = found.setdefault(f"{match['dev']}/{match['port']}", {"counters": {}})
        if match["file"] == "rate":
            try:
                entry["rate"] = network.rdma_port_rate(value)
            except ParseError as exc:
                unknown.append(f"{path}: {exc}")
        elif match["file"] == "state":
            entry["state"] = value.split(":")[-1].strip()
        elif (number := _number(value)) is not None:
            entry["counters"][match["file"]] = number
    return {name: Port(name, e["counters"], e.get("rate"), e.get("state"), rdma=True)
            for name, e in found.items()}


def address(text: str) -> str | None:
    """An IP address in its canonical form (brackets and a zone index dropped, an
    IPv4-mapped IPv6 address as IPv4), or None for anything else."""
    try:
        found = ipaddress.ip_address(text.strip().strip("[]").split("%")[0])
    except ValueError:
        return None
    mapped = found.ipv4_mapped if isinstance(found, ipaddress.IPv6Address) else None
    return str(mapped or found)


def reached_at(text: str) -> str | None:
    """The node's own address of the SSH connection the sample came over: the third field
    of ``SSH_CONNECTION`` (client address, client port, server address, server port)."""
    fields = text.split()
    return address(fields[2]) if len(fields) == 4 else None


def parse_sample(sections: Mapping[str, script.Section], nonce: str, taken: float) -> Sample:
    """A Sample from the sample script's sections (pure)."""
    unknown: list[str] = []
    interfaces = _interfaces(sections.get("net"))
    _ethtool(sections.get("ethtool"), nonce, interfaces, unknown)
    ports = {name: Port(name, e["counters"], e.get("rate"), e.get("state"))
             for name, e in interfaces.items()}
    ports.update(_rdma(sections.get("rdma"), unknown))
    snmp = sections.get("snmp")
    tcp: dict[str, int] = {}
    try:
        tcp = network.proc_net_snmp(snmp.text if snmp else "")
    except ParseError as exc:
        unknown.append(str(exc))
    peer = sections.get("peer")
    reached = reached_at(peer.text) if peer else None
    return Sample(ports, tcp, taken, tuple(unknown), (reached,) if reached else ())


def resolve(name: str) -> tuple[str, ...]:
    """The addresses ``name`` resolves to on the controller, within RESOLVE_TIMEOUT_S; none
    when it does not resolve in time."""
    pool = ThreadPoolExecutor(max_workers=1)
    try:
        found = pool.submit(socket.getaddrinfo, name, None, type=socket.SOCK_STREAM)
        infos = found.result(timeout=RESOLVE_TIMEOUT_S)
    except (OSError, UnicodeError, Late):
        return ()
    finally:
        pool.shutdown(wait=False)
    return tuple(dict.fromkeys(a for info in infos if (a := address(str(info[4][0])))))


def take(node: Node) -> Sample:
    """Sample one node's counters (node-local)."""
    nonce = script.new_nonce()
    with node_local():
        result = node.run(sample_command(nonce), timeout=SAMPLE_TIMEOUT_S)
    taken = time.monotonic()
    sections = script.split(result.stdout, nonce)
    if "net" not in sections:
        raise GpufleetError(f"the counter sample on {node.name} printed nothing readable "
                            f"(exit {result.rc}): {(result.stderr or result.stdout)[-160:]}")
    try:
        sample = parse_sample(sections, nonce, taken)
    except ParseError as exc:
        raise GpufleetError(f"the counter sample on {node.name}: {exc}") from None
    if sample.reached or address(node.host.address):
        return sample
    return replace(sample, reached=resolve(node.host.address))


def take_all(nodes: Iterable[Node], workers: int) -> dict[str, Sample | str]:
    """Every node's sample, all nodes at once; a node that cannot be sampled has its
    error instead."""
    chosen = list(nodes)

    def one(node: Node) -> Sample | str:
        try:
            return take(node)
        except GpufleetError as exc:
            return str(exc)

    if not chosen:
        return {}
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(chosen)))) as pool:
        return dict(zip((n.name for n in chosen), pool.map(one, chosen), strict=True))


@dataclass(frozen=True)
class Delta:
    """How much one counter of one port moved during a measurement."""

    port: str
    counter: str
    kind: str
    value: int
    priority: int | None = None

    def describe(self) -> str:
        prio = f" on priority {self.priority}" if self.priority is not None else ""
        return f"{self.value:,} {self.kind}{prio} on {self.port} ({self.counter})"


@dataclass(frozen=True)
class Bounds:
    """What a node's counters may move by during one measurement."""

    max_drops: int
    max_errors: int
    max_retransmit_ratio: float

    @classmethod
    def of(cls, node: Node) -> Bounds:
        settings = node.typed(Counters)
        return cls(settings.nic_max_drops, settings.nic_max_errors,
                   settings.net_max_retransmit_ratio)


@dataclass(frozen=True)
class Path:
    """TCP from one node to another during a measurement: the segments the source's
    connections to the target retransmitted and sent, as their sockets counted them."""

    source: str
    target: str
    retransmits: int
    segments: int

    def lossy(self, ratio: float) -> bool:
        """More retransmits than ``ratio`` of the segments sent (and than MIN_RETRANSMITS)."""
        return self.retransmits > max(MIN_RETRANSMITS, ratio * self.segments)

    def describe(self) -> str:
        return f"{self.source} -> {self.target}"


@dataclass
class NodeCounters:
    """One node's counter deltas over one measurement, or why they are unknown.
    ``paths`` are the node's own connections' counts (None: its probe reported none),
    ``lossy`` the retransmit verdicts ``attribute`` laid on the node."""

    node: str
    deltas: list[Delta] = field(default_factory=list)
    fabric: frozenset[str] = frozenset()
    retransmits: int | None = None
    segments: int | None = None
    seconds: float = 0.0
    error: str | None = None
    notes: list[str] = field(default_factory=list)
    paths: list[Path] | None = None
    lossy: list[str] = field(default_factory=list)

    def problems(self, bounds: Bounds) -> list[str]:
        """Drops and errors on fabric ports over their bounds, and the lossy TCP paths the
        node is named for."""
        found = []
        limits = {"drops": (bounds.max_drops, "nic_max_drops"),
                  "errors": (bounds.max_errors, "nic_max_errors")}
        for delta in sorted(self.deltas, key=lambda d: -d.value):
            if delta.kind in limits and delta.port in self.fabric:
                limit, key = limits[delta.kind]
                if delta.value > limit:
                    found.append(f"{delta.describe()} ({key} {limit})")
        return found + self.lossy

    def moved(self) -> list[str]:
        """Every trouble counter that moved, largest first (for a slow run's message)."""
        lines = [d.describe() for d in sorted(self.deltas, key=lambda d: -d.value)]
        if self.retransmits:
            lines.append(f"{self.retransmits:,} TCP retransmits")
        return lines

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "seconds": round(self.seconds, 2), "error": self.error,
                "fabric_ports": sorted(self.fabric), "tcp_retransmits": self.retransmits,
                "tcp_segments_sent": self.segments, "notes": self.notes,
                "moved": self.moved(),
                "paths": None if self.paths is None else [
                    {"target": p.target, "retransmits": p.retransmits, "segments": p.segments}
                    for p in self.paths],
                "lossy": self.lossy,
                "deltas": [{"port": d.port, "counter": d.counter, "kind": d.kind,
                            "priority": d.priority, "value": d.value} for d in self.deltas]}


def held_interface(node: Node, sample: Sample) -> str | None:
    """The interface holding the address the node was reached at: the sample's own
    (``SSH_CONNECTION``, or the inventory name resolved on the controller), else the
    inventory address itself."""
    wanted = set(sample.reached) | ({a} if (a := address(node.host.address)) else set())
    for entry in (node.facts.get("interfaces") if node.facts else None) or []:
        if any(address(a.split("/")[0]) in wanted for a in entry.get("addresses") or []):
            return str(entry["name"])
    return None


def fabric_ports(node: Node, sample: Sample) -> frozenset[str]:
    """The ports the node's training traffic crosses: the interface holding its address,
    its RDMA netdevs and its RDMA ports."""
    held = held_interface(node, sample)
    rdma = (node.facts.get("rdma") if node.facts else None) or []
    netdevs = {d for entry in rdma for d in entry.get("netdevs") or []}
    named = ({held} if held else set()) | netdevs
    return frozenset(p.name for p in sample.ports.values() if p.rdma or p.name in named)


def _where(node: Node, sample: Sample) -> str:
    seen = ", ".join(sample.reached) or "not resolved"
    return node.host.address if address(node.host.address) else (
        f"{node.host.address} ({seen})")


def delta(node: Node, before: Sample | str, after: Sample | str) -> NodeCounters:
    """The node's counters over the measurement between two samples; unknown when no
    interface holds the node's address (its fabric ports cannot be told)."""
    out = NodeCounters(node.name)
    if isinstance(before, str) or isinstance(after, str):
        out.error = before if isinstance(before, str) else str(after)
        return out
    out.seconds = after.taken - before.taken
    out.fabric = fabric_ports(node, after)
    if held_interface(node, after) is None:
        out.error = (f"no interface holds the address it is reached at, "
                     f"{_where(node, after)}: its fabric ports are unknown")
    out.notes = sorted(set(before.unknown) | set(after.unknown))
    for name, port in after.ports.items():
        earlier = before.ports.get(name)
        if earlier is None:
            continue
        for counter, value in port.counters.items():
            what = kind(counter)
            start = earlier.counters.get(counter)
            if what is None or start is None or value == start:
                continue
            if value < start:
                out.notes.append(f"{name} {counter} went back from {start} to {value} "
                                 "(reset or wrapped): not counted")
                continue
            out.deltas.append(Delta(name, counter, what[0], value - start, what[1]))
    if {"RetransSegs", "OutSegs"} <= before.tcp.keys() & after.tcp.keys():
        out.retransmits = after.tcp["RetransSegs"] - before.tcp["RetransSegs"]
        out.segments = after.tcp["OutSegs"] - before.tcp["OutSegs"]
    return out


def deltas(nodes: Mapping[str, Node], before: Mapping[str, Sample | str],
           after: Mapping[str, Sample | str],
           paths: Mapping[str, list[Path]] | None = None) -> dict[str, NodeCounters]:
    """Every node's counters; ``paths``: each source's connections during the measurement
    (a node missing from it reported none)."""
    out = {name: delta(nodes[name], before.get(name, "not sampled before the run"),
                       after.get(name, "not sampled after the run"))
           for name in nodes}
    for name, counters in out.items():
        counters.paths = None if paths is None else paths.get(name)
    return out


def attribute(phases: Iterable[Mapping[str, NodeCounters]], ratios: Mapping[str, float]
              ) -> None:
    """Lay each phase's lossy paths on nodes (``NodeCounters.lossy``): a node on lossy
    paths with two partners or more, over every phase, is the one common to them; a lossy
    path with no such end is weighed (``weigh``) on the sender's other paths out and the
    receiver's other paths in, and laid on the end they point at, else on both (one path
    cannot tell which end loses). A path is judged with its source's
    ``net_max_retransmit_ratio`` (``ratios``)."""
    chosen = list(phases)
    every = [p for counters in chosen for c in counters.values() for p in c.paths or []]
    lossy: list[list[Path]] = []
    partners: dict[str, set[str]] = {}
    for counters in chosen:
        found = [p for c in counters.values() for p in c.paths or []
                 if p.lossy(ratios.get(p.source, 0.0))]
        lossy.append(found)
        for path in found:
            partners.setdefault(path.source, set()).add(path.target)
            partners.setdefault(path.target, set()).add(path.source)
        for c in counters.values():
            if c.paths is None and not c.error:
                c.notes.append("TCP retransmits not laid on paths: the measurement reported "
                               "no per-connection counts from this node")
    common = {n for n, ps in partners.items() if len(ps) >= 2}
    for counters, found in zip(chosen, lossy, strict=True):
        named: dict[tuple[str, str], list[Path]] = {}
        for path in found:
            ends = [n for n in (path.source, path.target) if n in common]
            if ends:
                for end in ends:
                    named.setdefault((end, f"{end} is common to the lossy paths"),
                                     []).append(path)
                continue
            weighed = weigh(path, every)
            if weighed is not None:
                named.setdefault(weighed, []).append(path)
                continue
            for end in (path.source, path.target):
                named.setdefault((end, "the only lossy path of both ends: either may lose"),
                                 []).append(path)
        for (name, why), paths in named.items():
            if name in counters:
                counters[name].lossy.append(_lossy_message(paths, ratios, why))


@dataclass(frozen=True)
class Side:
    """One end's other paths in the direction a lossy path crossed it, pooled: a sender's
    paths out to other nodes, or a receiver's paths in from other nodes."""

    node: str
    way: str
    retransmits: int
    segments: int

    def higher(self, other: Side) -> bool:
        """Whether this side retransmitted more than MIN_RETRANSMITS and at a rate above
        ``other``'s that chance does not explain: were both sides' rates the same, their
        retransmits together would fall this unevenly (or more) under SIGNIFICANCE of the
        time, each landing on a side in proportion to the segments it sent."""
        if self.retransmits <= MIN_RETRANSMITS or not other.segments:
            return False
        share = self.segments / (self.segments + other.segments)
        return binomial_tail(self.retransmits + other.retransmits, share,
                             self.retransmits) < SIGNIFICANCE

    def describe(self) -> str:
        return (f"{self.node}'s other paths {self.way} retransmitted {self.retransmits:,} of "
                f"{self.segments:,} segments")


def binomial_tail(count: int, share: float, least: int) -> float:
    """The chance that at least ``least`` of ``count`` events, each landing with chance
    ``share``, land; 1 when ``least`` is at most the expected number."""
    if least <= count * share:
        return 1.0
    if share <= 0.0:
        return 0.0
    if share >= 1.0:
        return 1.0
    total = 0.0
    for k in range(least, count + 1):
        term = math.exp(math.lgamma(count + 1) - math.lgamma(k + 1) - math.lgamma(count - k + 1)
                        + k * math.log(share) + (count - k) * math.log1p(-share))
        total += term
        if term < total * 1e-12:
            break
    return min(1.0, total)


def weigh(path: Path, every: Iterable[Path]) -> tuple[str, str] | None:
    """The end of a lossy ``path`` the other paths point at, and why: the receiver when
    its other paths in (``every`` path of the measurements, lossy or not) retransmitted at a
    rate significantly above the sender's other paths out (``Side.higher``), the sender the
    other way round; None when they do not tell."""
    paths = list(every)
    out = [p for p in paths if p.source == path.source and p.target != path.target]
    into = [p for p in paths if p.target == path.target and p.source != path.source]
    sender = Side(path.source, "out", sum(p.retransmits for p in out),
                  sum(p.segments for p in out))
    receiver = Side(path.target, "in", sum(p.retransmits for p in into),
                    sum(p.segments for p in into))
    for end, other in ((receiver, sender), (sender, receiver)):
        if end.higher(other):
            return end.node, (f"{end.node} is common to the retransmitting paths "
                              f"({end.describe()}, {other.describe()})")
    return None


def _lossy_message(paths: list[Path], ratios: Mapping[str, float], why: str) -> str:
    retransmits = sum(p.retransmits for p in paths)
    segments = sum(p.segments for p in paths)
    ratio = max(ratios.get(p.source, 0.0) for p in paths)
    return (f"TCP retransmitted {retransmits:,} of {segments:,} segments sent on "
            f"{', '.join(p.describe() for p in paths)} ({retransmits / max(1, segments):.1%}; "
            f"net_max_retransmit_ratio {ratio:g}): {why}")


def owners(nodes: Iterable[Node]) -> dict[str, str]:
    """Which node holds each address (from the interfaces fact; an address more than one
    node holds, a bridge's on every node, is left out)."""
    held: dict[str, set[str]] = {}
    for node in nodes:
        for entry in (node.facts.get("interfaces") if node.facts else None) or []:
            for text in entry.get("addresses") or []:
                if (found := address(str(text).split("/")[0])) is not None:
                    held.setdefault(found, set()).add(node.name)
    return {a: next(iter(names)) for a, names in held.items() if len(names) == 1}


def peer_counts(event: Mapping[str, Any]) -> dict[str, tuple[int, int]]:
    """A probe's ``tcp`` line checked: at most MAX_PEERS addresses, each with two counts
    (retransmitted, sent) that fit tcp_info's 32-bit fields."""
    peers = event.get("peers")
    if not isinstance(peers, dict) or len(peers) > MAX_PEERS:
        raise ParseError(f"tcp line: peers is not a map of at most {MAX_PEERS} addresses")
    found: dict[str, tuple[int, int]] = {}
    for key, value in peers.items():
        where = address(str(key)[:64])
        if (where is None or not isinstance(value, list) or len(value) != 2
                or not all(type(v) is int and 0 <= v < 2**32 for v in value)):
            raise ParseError(f"tcp line: {str(key)[:64]!r}: {str(value)[:40]} is not an "
                             "address with two counts")
        found[where] = (value[0], value[1])
    return found


def probe_paths(events: Mapping[str, Iterable[Mapping[str, Any]]], held: Mapping[str, str]
                ) -> tuple[dict[str, list[Path]], dict[str, str]]:
    """Each node's paths from its ranks' ``tcp`` lines (``events`` by node; ``held``: which
    node holds an address), and, for a node whose line could not be read, why."""
    sums: dict[str, dict[str, list[int]]] = {}
    bad: dict[str, str] = {}
    for name, lines in events.items():
        for event in lines:
            if event.get("event") != "tcp":
                continue
            try:
                counts = peer_counts(event)
            except ParseError as exc:
                bad[name] = str(exc)
                continue
            mine = sums.setdefault(name, {})
            for where, (retransmits, segments) in counts.items():
                target = held.get(where)
                if target is not None and target != name:
                    entry = mine.setdefault(target, [0, 0])
                    entry[0] += retransmits
                    entry[1] += segments
    paths = {name: [Path(name, t, r, n) for t, (r, n) in sorted(found.items())]
             for name, found in sums.items() if name not in bad}
    return paths, bad


def slow_run_note(counters: Mapping[str, NodeCounters], most: int = 3) -> str:
    """The nodes whose trouble counters moved during a slow or failed run, named with their
    largest deltas; empty when none moved."""
    moved = {name: c.moved() for name, c in sorted(counters.items()) if c.moved()}
    if not moved:
        return ""
    return "; counters during the run: " + "; ".join(
        f"{name}: {', '.join(lines[:most])}" for name, lines in moved.items())


@dataclass(frozen=True)
class LineRate:
    """What one node's fabric carries, from which NICs; ``gbps`` None says why not.
    ``short``: the ports under the declared rate (trained down, not ACTIVE, missing), each
    of which fails the node's multi-node runs."""

    node: str
    gbps: float | None
    nics: str
    short: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "gbps": self.gbps, "nics": self.nics,
                "short": list(self.short)}


def declared_line_rate(node: str, ports: Iterable[Port], rate_gbps: float, count: int | None,
                       variable: str) -> LineRate:
    """The line rate of RDMA ports held to a declared rate: ``count`` ports (all of
    ``ports`` when None) at ``rate_gbps`` each, whatever rate they trained to; every port
    under it, or not ACTIVE, and every port short of ``count`` is named in ``short``."""
    ordered = sorted(ports, key=lambda p: p.name)
    active = [p for p in ordered if p.state == "ACTIVE"]
    expected = len(ordered) if count is None else count
    short = [f"{p.name} {p.state or 'state unknown'}" for p in ordered if p.state != "ACTIVE"]
    short += [f"{p.name} at {p.rate_gbps:g} Gb/s" if p.rate_gbps is not None
              else f"{p.name} rate unknown" for p in active
              if p.rate_gbps is None or p.rate_gbps < rate_gbps]
    if len(active) < expected:
        short.append(f"{len(active)} of {expected} ports ACTIVE")
    return LineRate(node, expected * rate_gbps,
                    f"{expected} x {rate_gbps:g} Gb/s declared ({variable})", tuple(short))


def declared_ports(node: Node) -> tuple[Declaration, dict[str, str | None]]:
    """The RDMA ports the node's group declares (the fabric suite's variables over its GPU
    model's defaults), and the link layer of each port NCCL may use, from its facts."""
    settings = node.typed(FabricSettings)
    facts = node.facts
    ports = (facts.get(ports_fact(settings)) if facts else None) or []
    spec = str((node.var("nccl_env") or {}).get("NCCL_IB_HCA") or "")
    judged = judged_ports(ports, spec)
    return (declared(settings, facts, judged),
            {port_name(p): p.get("link_layer") for p in judged})


def _rdma_line_rate(node: Node, sample: Sample) -> LineRate | None:
    """The line rate of a GPU node whose NCCL crosses nodes over RDMA: its declared ports,
    else the sum of its ACTIVE ports' current rates; None for other nodes."""
    gpus = node.facts.get("gpus") if node.facts else None
    _, inter = expected_transports(node.host)
    spec = str((node.var("nccl_env") or {}).get("NCCL_IB_HCA") or "")
    usable = [p for p in sample.ports.values() if p.rdma and nccl_usable(p.name, spec)]
    if not gpus or inter == "socket" or not usable:
        return None
    decl, layers = declared_ports(node)
    if decl.rate_gbps is not None:
        fabric = [p for p in usable if decl.link_layer is None
                  or layers.get(p.name, decl.link_layer) == decl.link_layer]
        return declared_line_rate(node.name, fabric, decl.rate_gbps, decl.count,
                                  decl.variable("rate_gbps"))
    rails = [p for p in usable if p.state == "ACTIVE" and p.rate_gbps]
    if not rails:
        return None
    return LineRate(node.name, sum(p.rate_gbps or 0 for p in rails), " + ".join(
        f"{p.name} {p.rate_gbps:g} Gb/s" for p in sorted(rails, key=lambda p: p.name)))


def line_rate(node: Node, sample: Sample | str) -> LineRate:
    """The node's line rate (see the module's docstring)."""
    declared_gbps = node.typed(AllreduceSettings).nic_line_rate_gbps
    if declared_gbps is not None:
        return LineRate(node.name, float(declared_gbps), f"nic_line_rate_gbps {declared_gbps:g}")
    if isinstance(sample, str):
        return LineRate(node.name, None, f"unknown: {sample}")
    rdma = _rdma_line_rate(node, sample)
    if rdma is not None:
        return rdma
    held = held_interface(node, sample)
    port = sample.ports.get(held) if held else None
    if port is None:
        return LineRate(node.name, None, "unknown: no interface holds the node's address")
    if port.rate_gbps is None:
        return LineRate(node.name, None, f"unknown: {port.name} reports no link speed "
                                         "(declare nic_line_rate_gbps)")
    return LineRate(node.name, port.rate_gbps, f"{port.name} {port.rate_gbps:g} Gb/s")
