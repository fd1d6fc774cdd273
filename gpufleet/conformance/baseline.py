"""Per-node performance baselines: each node's own figures, recorded at certification in
``/etc/gpufleet/baseline.json`` on the node (beside bootstrap's node.json), and compared
with later runs (``--compare-baseline``): a figure is then gated at max(inventory floor,
``baseline_fraction`` x the node's baseline), and its trend (now vs baseline) is reported.

A run records (``--record-baseline``) the medians of the figures it measured on every node
that failed no check; figures the run did not measure keep their recorded value.
"""

from __future__ import annotations

import json
import shlex
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpufleet.conformance.verdict import Figure, Measure, Verdict, judge, settings
from gpufleet.errors import GpufleetError, ParseError
from gpufleet.inventory.model import Host
from gpufleet.report.jsonfile import BadJson, opening, read_json

BASELINE_FILE = "/etc/gpufleet/baseline.json"
SCHEMA = "gpufleet.baseline/1"
ABSENT = "@@gpufleet-no-baseline@@"
READ_TIMEOUT_S = 30.0
MAX_BYTES = 4 * 2**20


class BaselineNode(Protocol):
    """What the store needs of a conformance node."""

    @property
    def name(self) -> str: ...

    @property
    def host(self) -> Host: ...

    def run(self, command: str, timeout: float = ..., stdin: bytes | None = None) -> Any: ...


def parse(text: str, where: str) -> dict[str, dict[str, Any]]:
    """The figures of a baseline document (``{name: {"value": x, "unit": u, ...}}``); raises
    ParseError naming ``where`` when it is not one."""
    try:
        doc = read_json(text.encode(), where, max_bytes=MAX_BYTES)
    except BadJson as exc:
        raise ParseError(str(exc)) from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise ParseError(f"{where}: not a {SCHEMA} document")
    figures = doc.get("figures")
    if not isinstance(figures, dict):
        raise ParseError(f"{where}: 'figures' must be a mapping")
    for name, entry in figures.items():
        value = entry.get("value") if isinstance(entry, dict) else None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ParseError(f"{where}: figure {name!r} needs a positive 'value', got {entry!r}")
    return figures


def render(host: str, figures: Mapping[str, dict[str, Any]]) -> bytes:
    """The baseline document for ``host`` (schema gpufleet.baseline/1)."""
    doc = opening(SCHEMA)
    doc.update(host=host, updated_at=doc["generated_at"], figures=dict(sorted(figures.items())))
    return (json.dumps(doc, indent=2) + "\n").encode()


def merge(old: Mapping[str, dict[str, Any]], verdicts: Mapping[str, Verdict],
          stamp: str) -> dict[str, dict[str, Any]]:
    """``old`` with every figure in ``verdicts`` replaced by its median now."""
    figures = dict(old)
    for name, v in verdicts.items():
        figures[name] = {"value": round(v.median, 4), "unit": v.figure.unit,
                         "trials": len(v.values), "spread": round(v.to_dict()["spread"], 4),
                         "recorded_at": stamp}
    return figures


@dataclass
class _Known:
    figures: dict[str, dict[str, Any]] | None = None
    problem: str = ""  # why there is no baseline to compare with


@dataclass
class BaselineStore:
    """A run's baselines: read from nodes on first use, figures measured, files written."""

    record: bool = False
    compare: bool = False
    path: str = BASELINE_FILE
    _known: dict[str, _Known] = field(default_factory=dict)
    _measured: dict[str, dict[str, Verdict]] = field(default_factory=dict)
    _readings: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _node_locks: dict[str, threading.Lock] = field(default_factory=dict)

    def _node_lock(self, name: str) -> threading.Lock:
        with self._lock:
            return self._node_locks.setdefault(name, threading.Lock())

    def read(self, node: BaselineNode) -> _Known:
        """The node's recorded figures (once per run), or why there are none."""
        with self._node_lock(node.name):
            if node.name not in self._known:
                self._known[node.name] = self._load(node)
            return self._known[node.name]

    def _load(self, node: BaselineNode) -> _Known:
        p = shlex.quote(self.path)
        try:
            result = node.run(f"if [ -e {p} ]; then cat {p}; else echo {ABSENT}; fi",
                              timeout=READ_TIMEOUT_S)
        except GpufleetError as exc:
            return _Known(problem=f"{self.path} could not be read: {exc}")
        if result.rc != 0:
            return _Known(problem=f"{self.path} could not be read (exit {result.rc})")
        if result.stdout.strip() == ABSENT:
            return _Known(problem=f"no baseline recorded ({self.path} is absent)")
        try:
            return _Known(parse(result.stdout, f"{node.name}:{self.path}"))
        except ParseError as exc:
            return _Known(problem=f"baseline unusable: {exc}")

    def baseline_of(self, node: BaselineNode) -> Callable[[str], float | None] | None:
        """A lookup of the node's baseline figures when comparing, else None."""
        if not self.compare:
            return None
        known = self.read(node)

        def value(name: str) -> float | None:
            entry = (known.figures or {}).get(name)
            return None if entry is None else float(entry["value"])

        return value

    def add(self, node: str, verdicts: Mapping[str, Verdict]) -> None:
        """Remember the figures a check measured on ``node``."""
        with self._lock:
            self._measured.setdefault(node, {}).update(verdicts)

    def add_reading(self, node: str, name: str, value: float, unit: str) -> None:
        """Remember a reading (a measured peak power) to record beside the figures; a
        reading is kept, never gated."""
        with self._lock:
            self._readings.setdefault(node, {})[name] = {"value": round(value, 4),
                                                         "unit": unit, "kind": "reading"}

    def recorded(self, node: BaselineNode, name: str) -> float | None:
        """The value the node's baseline file records for ``name`` (compared or not)."""
        entry = (self.read(node).figures or {}).get(name)
        return None if entry is None else float(entry["value"])

    def trend(self, node: BaselineNode) -> dict[str, Any]:
        """Per figure measured on the node: now, baseline, ratio; or why there is none."""
        with self._lock:
            measured = dict(self._measured.get(node.name, {}))
        known = self.read(node) if self.compare else _Known()
        out: dict[str, Any] = {"baseline": self.path if known.figures is not None else None}
        if known.problem:
            out["fallback"] = f"{known.problem}: gated at the inventory floors"
        out["figures"] = {name: {"now": round(v.median, 4), "unit": v.figure.unit,
                                 "baseline": v.gate.baseline,
                                 "ratio": v.to_dict().get("ratio"), "passed": v.passed}
                          for name, v in sorted(measured.items())}
        return out

    def measured_nodes(self) -> list[str]:
        with self._lock:
            return sorted(set(self._measured) | set(self._readings))

    def write(self, node: BaselineNode, conn_put: Callable[..., None]) -> str:
        """Record the node's measured medians (merged into its file); what was written."""
        with self._lock:
            measured = dict(self._measured.get(node.name, {}))
            readings = dict(self._readings.get(node.name, {}))
        if not measured and not readings:
            return "nothing measured"
        with self._node_lock(node.name):
            old = self._known.get(node.name) or self._load(node)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        figures = merge(old.figures or {}, measured, stamp)
        figures.update({name: {**entry, "recorded_at": stamp} for name, entry in readings.items()})
        conn_put(self.path, render(node.name, figures), mode=0o644)
        return f"recorded {len(measured) + len(readings)} figures in {self.path}"


def judge_node(node: Any, store: BaselineStore | None, figures: list[Figure],
               measure: Measure, *, first: Mapping[str, list[float]] | None = None,
               cost_s: float = 0.0) -> dict[str, Verdict]:
    """:func:`verdict.judge` with the node's settings and baseline; a re-measurement that
    would take more (``cost_s`` x re-measure trials / trials) than the node's budget has
    left is not run. The verdicts are remembered for recording and the trend."""
    setting = settings(node.host)

    def can_remeasure() -> str:
        left = node.budget.remaining() if hasattr(node, "budget") else None
        need = cost_s * setting.remeasure_trials / setting.trials
        if left is not None and need > left:
            return f"it would take about {need:.0f}s, {left:.0f}s of the node's budget left"
        return ""

    verdicts = judge(figures, measure, setting, baseline_of=store.baseline_of(node)
                     if store else None, can_remeasure=can_remeasure, first=first)
    if store is not None:
        missing = store.read(node).problem if store.compare else ""
        for v in verdicts.values():
            if missing and v.gate.baseline is None:
                v.note = "; ".join(filter(None, [v.note, f"{missing}, gated at the floor"]))
        store.add(node.name, verdicts)
    return verdicts
