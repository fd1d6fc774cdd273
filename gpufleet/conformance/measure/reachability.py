"""Cross-node reachability: short-lived listeners on targets, connects from sources, a
matrix of open / refused / filtered / no route.

Which pairs are probed is a strategy: ``all`` (every ordered pair; ``auto`` picks it up to
256 nodes), ``ring`` (each node to its next and previous node) or ``sample:K`` (the ring
plus K random targets per source; ``auto`` picks ``sample:8`` above 256 nodes). Every pair
covers the rendezvous port and the range's ends and evenly spaced ports; beyond those,
each target listens on a denser random sample of the range (one port in each of
``random`` equal strata, different on every target and every run) that its sources share
out between them, so the whole sample is probed once per target whatever the strategy.

A connection that is not open is tried once more from the same source after every other
connect, and the second answer is the one reported: a SYN lost on a loaded host is not a
closed port, while a firewall that drops or refuses answers the same way twice.

Each connect's segments, retransmitted and sent, are read from its socket and summed per
target over the connects the target answered (``Matrix.paths``, laid on paths by
``nic_counters.attribute``); a connect to a filtered port sends its SYN again by design and
counts against no one.

Connects leave from a source port outside the range (just below it), so the answer to a
connect never travels to a port of the range: a node whose firewall drops traffic to the
range is seen as unreachable from its sources, and never makes its sources look closed.
"""

from __future__ import annotations

import functools
import json
import random
import shlex
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from gpufleet.conformance.launch import PROBES
from gpufleet.conformance.nic_counters import Path
from gpufleet.conformance.session import ConformanceSession, Node
from gpufleet.conformance.suites.common import Probe
from gpufleet.errors import GpufleetError
from gpufleet.report.jsonfile import BadJson, read_json

PROBE = PROBES / "reachability.py"
CONNECT_TIMEOUT_S = 2.0
PARALLEL_CONNECTS = 256
AUTO_ALL_MAX = 256
AUTO_SAMPLE = "sample:8"
SOURCE_BAND = 4096
T = TypeVar("T")


def resolve_mode(mode: str, count: int) -> str:
    """``auto`` as the strategy it stands for with ``count`` nodes; other modes unchanged."""
    if mode == "auto":
        return "all" if count <= AUTO_ALL_MAX else AUTO_SAMPLE
    return mode


def pairs(names: list[str], mode: str, seed: int = 0) -> list[tuple[str, str]]:
    """(source, target) pairs: ``all``, ``ring`` (each node to the next and the previous),
    ``sample:K`` (the ring plus K random targets per source) or ``auto``."""
    mode = resolve_mode(mode, len(names))
    if mode not in ("all", "ring") and not (mode.startswith("sample:") and mode[7:].isdigit()):
        raise GpufleetError(f"--pairs must be auto, all, ring or sample:K, got {mode!r}")
    if len(names) < 2:
        return []
    if mode == "all":
        return [(s, t) for s in names for t in names if s != t]
    ring = {(names[i], names[(i + 1) % len(names)]) for i in range(len(names))}
    ring |= {(names[(i + 1) % len(names)], names[i]) for i in range(len(names))}
    if mode == "ring":
        return sorted(ring)
    k = int(mode[7:])
    rng = random.Random(seed)  # noqa: S311 - a reproducible sample, not a secret
    chosen = set(ring)
    for source in names:
        others = [t for t in names if t != source]
        chosen |= {(source, t) for t in rng.sample(others, min(k, len(others)))}
    return sorted(chosen)


def probe_ports(rendezvous: int, low: int, high: int, samples: int) -> list[int]:
    """The rendezvous port, both ends of the range and evenly spaced ports between."""
    between = [low + (high - low) * k // (samples + 1) for k in range(1, samples + 1)]
    return sorted({rendezvous, low, high, *between})


def random_ports(low: int, high: int, count: int, key: str, seed: int) -> list[int]:
    """One random port in each of ``count`` equal strata of ``low``-``high``: any closed
    stretch at least twice a stratum wide holds a probed port. ``key`` and ``seed`` make
    the sample differ from target to target and run to run."""
    span = high - low + 1
    count = max(0, min(count, span))
    rng = random.Random(zlib.crc32(f"{seed}:{key}".encode()))  # noqa: S311 - not a secret
    bounds = [low + span * i // count for i in range(count + 1)] if count else []
    return [rng.randrange(bounds[i], bounds[i + 1]) for i in range(count)]


def share(sample: list[int], sources: list[str], source: str) -> list[int]:
    """The part of a target's random sample that ``source`` probes: the sample dealt out
    round-robin over the target's sources, so together they probe all of it."""
    index = sources.index(source)
    return [port for j, port in enumerate(sample) if j % len(sources) == index]


def source_band(low: int, high: int, rendezvous: int) -> tuple[int, int] | None:
    """Source ports for connects, outside the range and apart from the rendezvous port: just
    below the range, else just above it; None when the range leaves no room."""
    if low - 1 >= 1024 + 1:
        band = (max(1024, low - SOURCE_BAND), low - 1)
    elif high + 1 <= 65535:
        band = (high + 1, min(65535, high + SOURCE_BAND))
    else:
        return None
    if band[0] <= rendezvous <= band[1]:
        band = (rendezvous + 1, band[1]) if band[1] - rendezvous > rendezvous - band[0] \
            else (band[0], rendezvous - 1)
    return band if band[0] <= band[1] else None


@dataclass
class Matrix:
    """Results by (source, target, port), plus what the listeners reported."""

    ports: list[int]
    results: dict[tuple[str, str, int], str] = field(default_factory=dict)
    listeners: dict[str, str] = field(default_factory=dict)
    mode: str = "all"
    sampled: dict[str, list[int]] = field(default_factory=dict)
    first_answers: dict[tuple[str, str, int], str] = field(default_factory=dict)
    tcp: dict[str, dict[str, list[int]]] = field(default_factory=dict)
    tcp_unknown: dict[str, str] = field(default_factory=dict)

    def paths(self) -> dict[str, list[Path]]:
        """Each source's paths: the segments its answered connects retransmitted and sent
        per target (a source whose counts could not be read is left out)."""
        return {source: [Path(source, t, r, n) for t, (r, n) in sorted(found.items())]
                for source, found in self.tcp.items() if source not in self.tcp_unknown}

    def add_tcp(self, source: str, counts: dict[str, tuple[int, int]] | str) -> None:
        """Add one sweep's counts from ``source`` (a string: why they are unknown)."""
        if isinstance(counts, str):
            self.tcp_unknown[source] = counts
            return
        mine = self.tcp.setdefault(source, {})
        for target, (retransmits, segments) in counts.items():
            entry = mine.setdefault(target, [0, 0])
            entry[0] += retransmits
            entry[1] += segments

    def failures_to(self, target: str) -> dict[int, list[str]]:
        """Port -> "source (state)" for every non-open connection to ``target``."""
        return self._failures.get(target, {})

    def blocked(self, source: str, target: str) -> list[int]:
        """The ports ``target`` did not accept from ``source``."""
        return sorted(p for (s, t, p), state in self.results.items()
                      if s == source and t == target and state != "open")

    @functools.cached_property
    def _failures(self) -> dict[str, dict[int, list[str]]]:
        """Every target's failures, indexed once (the matrix is complete when read)."""
        found: dict[str, dict[int, list[str]]] = {}
        for (source, target, port), state in sorted(self.results.items()):
            if state != "open":
                found.setdefault(target, {}).setdefault(port, []).append(
                    f"{source} ({state})")
        return found

    def to_dict(self) -> dict[str, object]:
        table: dict[str, dict[str, dict[str, str]]] = {}
        for (source, target, port), state in sorted(self.results.items()):
            table.setdefault(source, {}).setdefault(target, {})[str(port)] = state
        first = {f"{s} {t} {p}": state for (s, t, p), state in sorted(self.first_answers.items())}
        return {"mode": self.mode, "ports": self.ports, "random_ports": self.sampled,
                "matrix": table, "listeners": self.listeners, "first_answers": first}


@dataclass(frozen=True)
class PortSpec:
    """What every pair probes: fixed ports, and the range each target samples from."""

    fixed: list[int]
    low: int
    high: int
    random: int = 0
    seed: int = 0
    source_ports: tuple[int, int] | None = None


@functools.cache
def _script() -> str:
    return PROBE.read_text()


def _python(node: Node) -> str:
    return node.typed(Probe).conformance_python


def start_listener(node: Node, ports: list[int], lifetime_s: float
                   ) -> tuple[str, list[int], list[int], list[int]]:
    """Start the listener on ``node``; return (pid, bound ports, ports already in use,
    those of them another program listens on)."""
    command = shlex.join([_python(node), "-c", _script(), "listen", str(lifetime_s),
                          ",".join(map(str, ports))])
    result = node.run(command, timeout=30)
    if not result.ok:
        raise GpufleetError(f"listener on {node.name} failed: "
                            f"{(result.stderr or result.stdout).strip()[-200:]}")
    info = _last_line(result.stdout, f"the listener on {node.name}")
    try:
        return (str(info["pid"]), list(info["bound"]), list(info["busy"]),
                list(info.get("listened", [])))
    except (KeyError, TypeError) as exc:
        raise GpufleetError(f"the listener on {node.name} answered {info!r}: {exc}") from None


def _last_line(stdout: str, what: str) -> Any:
    """The JSON document on the last line a probe printed; GpufleetError when there is none
    (the node's answer fails that node's check, never the run)."""
    lines = stdout.strip().splitlines()
    try:
        return read_json(lines[-1].encode(), what) if lines else read_json(b"", what)
    except BadJson as exc:
        raise GpufleetError(f"unreadable answer: {exc}") from None


def tcp_counts(stdout: str, targets: set[str]) -> dict[str, tuple[int, int]]:
    """The connect probe's ``tcp`` line (the one before its last) checked: a target of the
    plan, each with two counts that fit tcp_info's 32-bit fields."""
    lines = stdout.strip().splitlines()
    if len(lines) < 2:
        raise GpufleetError("no tcp line")
    try:
        doc = read_json(lines[-2].encode(), "the tcp line")
    except BadJson as exc:
        raise GpufleetError(str(exc)) from None
    found = doc.get("tcp") if isinstance(doc, dict) else None
    if not isinstance(found, dict):
        raise GpufleetError(f"the tcp line is {lines[-2][:80]!r}")
    counts: dict[str, tuple[int, int]] = {}
    for target, value in found.items():
        if (target not in targets or not isinstance(value, list) or len(value) != 2
                or not all(type(v) is int and 0 <= v < 2**32 for v in value)):
            raise GpufleetError(f"the tcp line names {str(target)[:64]!r} with {str(value)[:40]}")
        counts[target] = (value[0], value[1])
    return counts


def run_matrix(session: ConformanceSession, ports: list[int] | PortSpec, mode: str,
               seed: int = 0) -> Matrix:
    """Listeners on every target, connects from every source of the strategy, in parallel."""
    nodes = {n: node for n, node in session.nodes.items() if node.facts is not None}
    resolved = resolve_mode(mode, len(nodes))
    spec = ports if isinstance(ports, PortSpec) else PortSpec(sorted(ports), 0, -1)
    return measure(nodes, pairs(list(nodes), resolved, seed), spec, resolved,
                   workers=min(64, session.forks))


def measure(nodes: dict[str, Node], wanted: list[tuple[str, str]], spec: PortSpec,
            mode: str = "all", workers: int = 64) -> Matrix:
    """Probe ``wanted`` (source, target) pairs of ``nodes`` on the ports of ``spec``."""
    targets = sorted({t for _, t in wanted})
    sources_of: dict[str, list[str]] = {}
    targets_of: dict[str, list[str]] = {}
    for source, target in wanted:
        targets_of.setdefault(source, []).append(target)
        sources_of.setdefault(target, []).append(source)
    matrix = Matrix(spec.fixed, mode=mode)
    for target in targets:
        matrix.sampled[target] = sorted(set(
            random_ports(spec.low, spec.high, spec.random, target, spec.seed)) - set(spec.fixed))
    busiest = max((sum(len(spec.fixed) + len(matrix.sampled[t]) // len(sources_of[t]) + 1
                       for t in ts) for ts in targets_of.values()), default=0)
    connecting = connect_time(busiest)
    lifetime = 120.0 + 2 * connecting
    pids: dict[str, str] = {}
    fixed_of = {target: list(spec.fixed) for target in targets}
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(nodes)))) as pool:
        listening = list(pool.map(lambda t: _try(lambda: start_listener(
            nodes[t], spec.fixed + matrix.sampled[t], lifetime)), targets))
        for target, (value, error) in zip(targets, listening, strict=True):
            if error or value is None:
                matrix.listeners[target] = str(error)
                continue
            pids[target], _, busy, listened = value
            matrix.sampled[target] = [p for p in matrix.sampled[target] if p not in busy]
            fixed_of[target], matrix.listeners[target] = _fixed_ports(spec.fixed, busy,
                                                                      listened)

        def plan_of(source: str) -> list[tuple[str, int]]:
            return [(t, p) for t in targets_of[source]
                    for p in fixed_of[t] + share(matrix.sampled[t], sources_of[t], source)]

        def connect_from(source: str, plan: list[tuple[str, int]]
                         ) -> tuple[dict[str, str], dict[str, tuple[int, int]] | str]:
            if not plan:
                return {}, {}
            wire = [[t, nodes[t].host.address, p] for t, p in plan]
            args = [_python(nodes[source]), "-c", _script(), "connect", str(CONNECT_TIMEOUT_S),
                    str(PARALLEL_CONNECTS)]
            if spec.source_ports:
                args.append(f"{spec.source_ports[0]}-{spec.source_ports[1]}")
            result = nodes[source].run(shlex.join(args), timeout=30 + connecting,
                                       stdin=json.dumps(wire).encode())
            if not result.ok:
                raise GpufleetError(f"connect probe on {source} failed: "
                                    f"{(result.stderr or result.stdout).strip()[-200:]}")
            states = _last_line(result.stdout, f"the connect probe on {source}")
            if not isinstance(states, dict):
                raise GpufleetError(f"the connect probe on {source} answered {states!r}")
            counts, why = _try(lambda: tcp_counts(result.stdout, {t for t, _ in plan}))
            return states, counts if counts is not None else \
                f"the connect probe on {source}: {why}"

        def sweep(plans: dict[str, list[tuple[str, int]]]) -> dict[tuple[str, str, int], str]:
            order = sorted(plans)
            answers = list(pool.map(lambda s: _try(lambda: connect_from(s, plans[s])), order))
            found = {}
            for source, (answer, error) in zip(order, answers, strict=True):
                states, counts = answer if answer else ({}, str(error))
                for target, port in plans[source]:
                    found[(source, target, port)] = f"unknown: {error}" \
                        if error or answer is None else states.get(f"{target} {port}", "unknown")
                matrix.add_tcp(source, counts)
            return found

        matrix.results = sweep({source: plan_of(source) for source in targets_of})
        again: dict[str, list[tuple[str, int]]] = {}
        for (source, target, port), state in matrix.results.items():
            if state != "open":
                again.setdefault(source, []).append((target, port))
        if again:
            matrix.first_answers = {key: matrix.results[key] for key in
                                   ((s, t, p) for s, plan in again.items() for t, p in plan)}
            matrix.results.update(sweep(again))
        list(pool.map(lambda t: nodes[t].run(f"kill {shlex.quote(pids[t])} 2>/dev/null; true",
                                             timeout=30), pids))
    return matrix


def _fixed_ports(fixed: list[int], busy: list[int], listened: list[int]
                 ) -> tuple[list[int], str]:
    """The fixed ports a target is probed on, and its listener's note: a port another
    program listens on is probed (the connect reaches it); one that is the local port of
    the node's own connection answers no connect, so it is left out."""
    in_use = sorted(set(busy) & set(fixed) & set(listened))
    taken = sorted(set(busy) & set(fixed) - set(listened))
    notes = [f"ports already in use: {in_use}" if in_use else "",
             f"ports taken by the node's own connections, not probed: {taken}" if taken else ""]
    return [p for p in fixed if p not in taken], "; ".join(filter(None, notes)) or "ok"


def connect_time(connects: int) -> float:
    """The longest a source's connects can take: in waves of PARALLEL_CONNECTS, each wave
    at most the connect timeout (a filtered port)."""
    waves = -(-connects // PARALLEL_CONNECTS)
    return waves * CONNECT_TIMEOUT_S + CONNECT_TIMEOUT_S


def _try(func: Callable[[], T]) -> tuple[T | None, str | None]:
    """(value, None) or (None, error message): one node's failure is data, not a crash."""
    try:
        return func(), None
    except GpufleetError as exc:
        return None, str(exc)
