"""Cross-node reachability: short-lived listeners on targets, connects from sources, a
matrix of open / refused / filtered / no route. Pairs run in parallel, and large fleets
can use a covering ring or a sample instead of every pair."""

from __future__ import annotations

import functools
import json
import random
import shlex
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

from gpufleet.conformance.launch import PROBES
from gpufleet.conformance.session import ConformanceSession, Node
from gpufleet.errors import GpufleetError

PROBE = PROBES / "reachability.py"
CONNECT_TIMEOUT_S = 2.0
PARALLEL_CONNECTS = 256
T = TypeVar("T")


def pairs(names: list[str], mode: str, seed: int = 0) -> list[tuple[str, str]]:
    """(source, target) pairs: ``all``, ``ring`` (each node to the next and the previous),
    or ``sample:K`` (the ring plus K random targets per source)."""
    if len(names) < 2:
        return []
    if mode == "all":
        return [(s, t) for s in names for t in names if s != t]
    ring = {(names[i], names[(i + 1) % len(names)]) for i in range(len(names))}
    ring |= {(names[(i + 1) % len(names)], names[i]) for i in range(len(names))}
    if mode == "ring":
        return sorted(ring)
    if mode.startswith("sample:") and mode[7:].isdigit():
        k = int(mode[7:])
        rng = random.Random(seed)  # noqa: S311 - a reproducible sample, not a secret
        chosen = set(ring)
        for source in names:
            others = [t for t in names if t != source]
            chosen |= {(source, t) for t in rng.sample(others, min(k, len(others)))}
        return sorted(chosen)
    raise GpufleetError(f"--pairs must be all, ring or sample:K, got {mode!r}")


def probe_ports(rendezvous: int, low: int, high: int, samples: int) -> list[int]:
    """The rendezvous port, both ends of the range and evenly spaced ports between."""
    between = [low + (high - low) * k // (samples + 1) for k in range(1, samples + 1)]
    return sorted({rendezvous, low, high, *between})


@dataclass
class Matrix:
    """Results by (source, target, port), plus what the listeners reported."""

    ports: list[int]
    results: dict[tuple[str, str, int], str] = field(default_factory=dict)
    listeners: dict[str, str] = field(default_factory=dict)

    def failures_to(self, target: str) -> dict[int, list[str]]:
        """Port -> "source (state)" for every non-open connection to ``target``."""
        return self._failures.get(target, {})

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
        return {"ports": self.ports, "matrix": table, "listeners": self.listeners}


@functools.cache
def _script() -> str:
    return PROBE.read_text()


def _python(node: Node) -> str:
    return str(node.var("conformance_python", "python3"))


def start_listener(node: Node, ports: list[int], lifetime_s: float) -> tuple[str, str]:
    """Start the listener on ``node``; return (pid, note)."""
    command = shlex.join([_python(node), "-c", _script(), "listen", str(lifetime_s),
                          ",".join(map(str, ports))])
    result = node.run(command, timeout=30)
    if not result.ok:
        raise GpufleetError(f"listener on {node.name} failed: "
                            f"{(result.stderr or result.stdout).strip()[-200:]}")
    info = json.loads(result.stdout.strip().splitlines()[-1])
    note = f"ports already in use: {info['busy']}" if info["busy"] else "ok"
    return str(info["pid"]), note


def run_matrix(session: ConformanceSession, ports: list[int], mode: str) -> Matrix:
    """Listeners on every target, connects from every source, all in parallel."""
    nodes = {n: node for n, node in session.nodes.items() if node.facts is not None}
    wanted = pairs(list(nodes), mode)
    targets = sorted({t for _, t in wanted})
    targets_of: dict[str, list[str]] = {}
    for source, target in wanted:
        targets_of.setdefault(source, []).append(target)
    sources = sorted(targets_of)
    matrix = Matrix(ports)
    busiest = max((len(t) for t in targets_of.values()), default=0) * len(ports)
    connecting = connect_time(busiest)
    lifetime = 60.0 + connecting
    pids: dict[str, str] = {}
    workers = max(1, min(64, len(nodes)))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        listeners = list(pool.map(
            lambda t: _try(lambda: start_listener(nodes[t], ports, lifetime)), targets))
        started = dict(zip(targets, listeners, strict=True))
        for target, (value, error) in started.items():
            if error:
                matrix.listeners[target] = error
            elif value is not None:
                pids[target], matrix.listeners[target] = value

        def connect_from(source: str) -> dict[str, str]:
            plan = [[t, nodes[t].host.address, p] for t in targets_of[source] for p in ports]
            command = shlex.join([_python(nodes[source]), "-c", _script(), "connect",
                                  str(CONNECT_TIMEOUT_S), str(PARALLEL_CONNECTS)])
            result = nodes[source].run(command, timeout=30 + connecting,
                                       stdin=json.dumps(plan).encode())
            if not result.ok:
                raise GpufleetError(f"connect probe on {source} failed: "
                                    f"{(result.stderr or result.stdout).strip()[-200:]}")
            states: dict[str, str] = json.loads(result.stdout.strip().splitlines()[-1])
            return states

        connected = list(pool.map(lambda s: _try(lambda: connect_from(s)), sources))
        for source, (states, error) in zip(sources, connected, strict=True):
            for t in targets_of[source]:
                for port in ports:
                    state = f"unknown: {error}" if error or states is None \
                        else states.get(f"{t} {port}", "unknown")
                    matrix.results[(source, t, port)] = state
        list(pool.map(lambda t: nodes[t].run(f"kill {shlex.quote(pids[t])} 2>/dev/null; true",
                                             timeout=30), pids))
    return matrix


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
