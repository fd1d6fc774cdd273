"""Self-contained HTML reports, rendered from gpufleet's own JSON documents: drift
(``gpufleet.drift/1`` and the runs kept in its history), conformance
(``gpufleet.conformance/1``) and the acceptance report a platform team hands over (the
conformance runs of an acceptance or a bootstrap, with ``gpufleet.bootstrap/1`` documents
and ``gpufleet.node/1`` states for the versions).

One page that opens from a file: inline CSS, plots drawn here as inline SVG, a few lines of
inline script for the filter, and a Content-Security-Policy that forbids every fetch. Hosts
are folded into sets (``node[001-998]``, ClusterShell's notation), failing hosts first, so
the page stays usable at thousands of hosts; every host still appears in the status grid
and every failure with its message. Every text comes from hosts or inventories and is
escaped by Jinja2's autoescape.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import logging
import math
import re
import statistics
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined
from markupsafe import Markup

from gpufleet import __version__
from gpufleet.report.outputs import local_put
from gpufleet.report.svg import (
    FAIL,
    MUTED,
    PALETTE,
    Chart,
    Dot,
    Line,
    Rule,
    Span,
    Whisker,
    number,
    size_label,
)
from gpufleet.report.terminal import host_set

log = logging.getLogger("gpufleet.report")

FLEET = "fleet"
MAX_NODE_PLOTS = 12
MAX_THERMAL_PLOTS = 6
MAX_LINES = 8  # nodes drawn in colours of their own; more are drawn grey
MAX_MESSAGE = 4000
MAX_HISTORY_ITEMS = 15

_ENV = Environment(loader=PackageLoader("gpufleet.report", "templates"), autoescape=True,
                   undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)
_SCRIPT = _ENV.loader.get_source(_ENV, "filter.js")[0]  # type: ignore[union-attr]
_SCRIPT_HASH = base64.b64encode(hashlib.sha256(_SCRIPT.encode()).digest()).decode()


# ---- hosts ---------------------------------------------------------------------------------

def natural(name: str) -> tuple[Any, ...]:
    """Sort key that orders node2 before node10."""
    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part)
                 for part in re.split(r"(\d+)", name))


def fold(hosts: Iterable[str]) -> str:
    """Hosts in ClusterShell's folded notation (``node[001-998],gpu7``); a name that is not
    a plain host name (brackets, commas, spaces, markup) is listed as it is."""
    return _fold(tuple(sorted(set(hosts), key=natural)))


@functools.lru_cache(maxsize=512)
def _fold(names: tuple[str, ...]) -> str:
    return host_set(names)


@dataclass
class Cell:
    """One host in the status grid."""

    host: str
    css: str
    status: str
    note: str = ""
    anchor: str = ""

    @property
    def search(self) -> str:
        return f"{self.host} {self.status} {self.note}".lower()


@dataclass
class HostSet:
    """Hosts that ended the same way, folded."""

    hosts: list[str]
    css: str
    status: str
    label: str = ""

    @property
    def folded(self) -> str:
        return fold(self.hosts)

    @property
    def search(self) -> str:
        return " ".join([*self.hosts, self.status, self.label]).lower()


@dataclass
class Row:
    """One failure (or finding) of one host, with its message."""

    host: str
    name: str
    message: str
    css: str = "fail"
    anchor: str = ""

    @property
    def search(self) -> str:
        return f"{self.host} {self.name} {self.message}".lower()


@dataclass
class Group:
    """Rows under one heading (a failing check, a drift item), with the hosts folded."""

    name: str
    rows: list[Row] = field(default_factory=list)
    detail: str = ""

    @property
    def hosts(self) -> list[str]:
        return sorted({r.host for r in self.rows}, key=natural)

    @property
    def folded(self) -> str:
        return fold(self.hosts)


@dataclass
class Plot:
    """A figure of the report: its charts, side by side, and what they show."""

    title: str
    charts: list[Markup]
    note: str = ""


@dataclass
class Card:
    """A figure of the summary."""

    label: str
    value: str
    css: str = ""


def _grid_and_sets(status: Mapping[str, str], *, css: Mapping[str, str], order: Sequence[str],
                   notes: Mapping[str, str], labels: Mapping[str, str],
                   anchors: Mapping[str, str]) -> tuple[list[Cell], list[HostSet]]:
    """Cells ordered by status (``order``: worst first), then name; hosts of one status and
    one label folded into a set."""
    rank = {s: i for i, s in enumerate(order)}
    hosts = sorted(status, key=lambda h: (rank.get(status[h], len(order)), natural(h)))
    cells = [Cell(h, css.get(status[h], "skip"), status[h], notes.get(h, ""),
                  anchors.get(h, "")) for h in hosts]
    grouped: dict[tuple[str, str], list[str]] = {}
    for h in hosts:
        grouped.setdefault((status[h], labels.get(h, "")), []).append(h)
    sets = [HostSet(names, css.get(s, "skip"), s, label) for (s, label), names in
            sorted(grouped.items(), key=lambda kv: (rank.get(kv[0][0], len(order)),
                                                   -len(kv[1]), kv[0][1]))]
    return cells, sets


def _clip(value: Any) -> str:
    text = "" if value is None else str(value)
    if len(text) <= MAX_MESSAGE:
        return text
    return f"{text[:MAX_MESSAGE]}... ({len(text) - MAX_MESSAGE} more characters in the JSON)"


def _real(value: Any) -> float | None:
    """A number from a node's figures as a text shows it: NaN and the infinities kept (they
    read ``nan``, ``inf``); anything but a number (a string, a list, a bool) is None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return float(value)
    except OverflowError:  # an integer past float's range: a JSON 1 followed by 400 zeros
        return math.inf if value > 0 else -math.inf


def _float(value: Any) -> float | None:
    """A number a plot can place: finite; NaN, the infinities and non-numbers are None, so
    one node's bad figure is left out of the plots rather than breaking the page."""
    real = _real(value)
    return real if real is not None and math.isfinite(real) else None


def _list(value: Any) -> list[Any]:
    """A list a node sent, or none: a number or a mapping where a list belongs is none."""
    return value if isinstance(value, list) else []


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [v for v in _list(value) if isinstance(v, dict)]


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _render(template: str, **context: Any) -> str:
    return _ENV.get_template(template).render(
        script=Markup(_SCRIPT),  # noqa: S704 - the package's own script, hashed in the CSP
        script_hash=_SCRIPT_HASH, version=__version__, **context)


def write_html(path: str, html: str) -> None:
    """Write a rendered report atomically (``-``: standard output)."""
    local_put(path, html.encode("utf-8"))


def write_report(path: str, render: Callable[[], str]) -> bool:
    """Render and write a run's page, the last of its outputs: a page that cannot be
    rendered or written is one warning (the traceback at -vvv), never the run's failure,
    so the JSON, JUnit, Prometheus outputs and drains written before it stand."""
    try:
        write_html(path, render())
    except Exception as exc:  # the page is a view of outputs already written
        log.warning("--html %s: the report could not be written (%s: %s); the run's other "
                    "outputs and its exit code stand", path, type(exc).__name__, exc)
        log.debug("the report's traceback", exc_info=True)
        return False
    return True


# ---- conformance ---------------------------------------------------------------------------

OUTCOME_CSS = {"FAIL": "fail", "SKIP": "skip", "PASS": "pass"}


@dataclass(frozen=True)
class Result:
    """A result of a conformance document, read defensively."""

    suite: str
    check: str
    host: str
    outcome: str
    message: str
    properties: dict[str, Any]

    @property
    def name(self) -> str:
        return f"{self.suite}/{self.check.removeprefix('test_')}"


def results_of(doc: Mapping[str, Any]) -> list[Result]:
    """The document's results (entries that are not results are left out)."""
    return [Result(str(r.get("suite", "")), str(r.get("check", "")), str(r.get("host", "")),
                   str(r.get("outcome", "")), str(r.get("message") or ""),
                   _mapping(r.get("properties"))) for r in _dicts(doc.get("results"))]


def _host_status(results: Sequence[Result]) -> dict[str, str]:
    outcomes: dict[str, set[str]] = defaultdict(set)
    for r in results:
        if r.host != FLEET:
            outcomes[r.host].add(r.outcome)
    return {h: "FAIL" if "fail" in o else "PASS" if "pass" in o else "SKIP"
            for h, o in outcomes.items()}


def _conformance_parts(doc: Mapping[str, Any], results: list[Result]) -> dict[str, Any]:
    """What the conformance and acceptance pages share: grid, host sets, failures, skips,
    fleet checks and plots."""
    status = _host_status(results)
    failing: dict[str, list[str]] = defaultdict(list)
    for r in results:
        if r.outcome == "fail" and r.host != FLEET:
            failing[r.host].append(r.name)
    groups: dict[str, Group] = {}
    anchors: dict[str, str] = {}
    for r in sorted((r for r in results if r.outcome == "fail"),
                    key=lambda r: (r.name, natural(r.host))):
        row = Row(r.host, r.name, _clip(r.message))
        if r.host not in anchors:
            row.anchor = anchors[r.host] = f"f{len(anchors)}"
        groups.setdefault(r.name, Group(r.name)).rows.append(row)
    notes = {h: "failed: " + ", ".join(sorted(set(c))) for h, c in failing.items()}
    labels = {h: ", ".join(sorted(set(c))) for h, c in failing.items()}
    cells, sets = _grid_and_sets(status, css=OUTCOME_CSS, order=("FAIL", "SKIP", "PASS"),
                                 notes=notes, labels=labels, anchors=anchors)
    skipped: dict[tuple[str, str], Group] = {}
    for r in results:
        if r.outcome == "skip":
            group = skipped.setdefault((r.name, r.message), Group(r.name, detail=r.message))
            group.rows.append(Row(r.host, r.name, r.message, "skip"))
    counts = Counter(r.outcome for r in results)
    hosts = len(status)
    cards = [Card("hosts", str(hosts)),
             Card("hosts failed", str(sum(s == "FAIL" for s in status.values())),
                  "fail" if "FAIL" in status.values() else "pass"),
             Card("hosts passed", str(sum(s == "PASS" for s in status.values())), "pass"),
             Card("checks failed", str(counts["fail"]), "fail" if counts["fail"] else "pass"),
             Card("checks passed", str(counts["pass"])),
             Card("checks skipped", str(counts["skip"]), "skip")]
    return {"cards": cards, "cells": cells, "sets": sets,
            "failures": sorted(groups.values(), key=lambda g: (-len(g.rows), g.name)),
            "skips": sorted(skipped.values(), key=lambda g: (g.name, -len(g.rows))),
            "fleet": [r for r in results if r.host == FLEET],
            "counters": counter_rows(results),
            "racks": rack_rows(doc, results),
            "plots": [*allreduce_plots(doc, results), *thermal_plots(doc, results),
                      *storage_plots(results)]}


COUNTER_PHASES = {"pairs": "AllReduce, pairs", "all": "AllReduce, all nodes",
                  "connects": "reachability connects"}


def counter_rows(results: Sequence[Result]) -> list[Row]:
    """Per node and measurement across nodes, the NIC counters that moved (the
    ``nic_counters_during_*`` checks), tagged with the check's outcome."""
    rows = []
    for r in results:
        if not r.check.startswith("test_nic_counters_during_"):
            continue
        for phase, entry in _mapping(r.properties.get("counters")).items():
            moved = [str(m) for m in _list(_mapping(entry).get("moved"))]
            if moved:
                rows.append(Row(r.host, COUNTER_PHASES.get(phase, phase),
                                _clip("; ".join(moved)),
                                {"pass": "pass", "fail": "fail"}.get(r.outcome, "skip")))
    return sorted(rows, key=lambda row: (natural(row.host), row.name))


def rack_rows(doc: Mapping[str, Any], results: Sequence[Result]) -> list[Row]:
    """Each rack's power budget use (the bmc suite's ``data.racks.budgets``): measured peaks
    against the budget, tagged with the rack check's outcome."""
    check = next(iter(_find(results, "bmc", "test_rack_power_budget")), None)
    css = {"pass": "pass", "fail": "fail"}.get(check.outcome if check else "", "skip")
    rows = []
    budgets = _mapping(_mapping(_mapping(doc.get("data")).get("racks")).get("budgets"))
    for rack, entry in sorted(budgets.items(), key=lambda kv: natural(str(kv[0]))):
        use = _mapping(entry)
        used, budget = _float(use.get("used_w")) or 0.0, _float(use.get("budget_w")) or 0.0
        share = f" ({used / budget:.0%})" if budget else ""
        peaks = _mapping(use.get("nodes"))
        unknown = sorted(str(n) for n, v in peaks.items() if v is None)
        rows.append(Row(str(rack), f"{use.get('cooling')} cooled", _clip(
            f"{number(used)} W of {number(budget)} W{share}: {use.get('margin')} x the "
            f"{number(_float(use.get('supply_w')) or 0)} W supply, {len(peaks)} "
            f"node{'' if len(peaks) == 1 else 's'}"
            + (f"; no measured peak for {fold(unknown)}" if unknown else "")),
            "fail" if budget and used > budget else css))
    return rows


def _header(doc: Mapping[str, Any]) -> dict[str, str]:
    return {k: str(doc.get(k) or "") for k in (
        "inventory", "inventory_digest", "generated_at", "started_at", "finished_at",
        "duration_s", "gpufleet_version")}


def render_conformance(doc: Mapping[str, Any]) -> str:
    """The HTML page of a ``gpufleet.conformance/1`` document."""
    results = results_of(doc)
    return _render("conformance.html.j2", title="gpufleet conformance", header=_header(doc),
                   complete=doc.get("complete", True) is not False,
                   **_conformance_parts(doc, results))


# ---- plots of measured figures -------------------------------------------------------------

@dataclass(frozen=True)
class SizeFigure:
    """busbw at one message size on one node: the median of its trials, the gate, the
    baseline."""

    size: int
    median: float
    low: float
    high: float
    gate: float | None = None
    gate_source: str = ""
    baseline: float | None = None
    passed: bool = True


def _find(results: Sequence[Result], suite: str, check: str) -> list[Result]:
    return [r for r in results if r.suite == suite and r.check == check]


def _run_sizes(run: Any) -> list[SizeFigure]:
    """busbw per size of one AllReduce run of the JSON's data (runs of one process moved no
    bytes between ranks and are left out)."""
    out = []
    for entry in _dicts(_mapping(run).get("results")):
        busbw, size = _float(entry.get("busbw")), _float(entry.get("size"))
        if busbw is None or size is None or (_float(entry.get("world_size")) or 0) < 2:
            continue
        out.append(SizeFigure(int(size), busbw, busbw, busbw))
    return sorted(out, key=lambda f: f.size)


def busbw_alone(doc: Mapping[str, Any], results: Sequence[Result]) -> dict[str, list[SizeFigure]]:
    """Every node's single-node busbw per size: from its verdicts (trials, gate, baseline),
    else from the run in the document's data."""
    data = _mapping(_mapping(doc.get("data")).get("allreduce"))
    out: dict[str, list[SizeFigure]] = {}
    for r in _find(results, "allreduce", "test_each_node_alone"):
        figures = []
        for name, verdict in _mapping(r.properties.get("verdicts")).items():
            v = _mapping(verdict)
            median = _float(v.get("median"))
            if not name.startswith("allreduce.busbw.") or median is None \
                    or not name.rsplit(".", 1)[1].isdigit():
                continue
            trials = [x for x in map(_float, [*_list(v.get("trials")),
                                              *_list(v.get("remeasured"))]) if x is not None]
            figures.append(SizeFigure(int(name.rsplit(".", 1)[1]), median,
                                      min(trials, default=median), max(trials, default=median),
                                      _float(v.get("gate")), str(v.get("gate_source") or ""),
                                      _float(v.get("baseline")), v.get("passed") is not False))
        out[r.host] = sorted(figures, key=lambda f: f.size) or _run_sizes(
            data.get(f"single {r.host}"))
    return {h: f for h, f in out.items() if f}


def _size_ticks(sizes: Iterable[int]) -> list[tuple[float, str]]:
    ordered = sorted(set(sizes))
    every = max(1, -(-len(ordered) // 8))
    return [(float(s), size_label(s)) for s in ordered[::every]]


def _gate_dots(host: str, figures: Sequence[SizeFigure]) -> list[Dot]:
    return [Dot(f.size, f.gate, FAIL, f"{host}: gate {number(f.gate)} GB/s at "
                f"{size_label(f.size)} ({f.gate_source or 'floor'})", "gate")
            for f in figures if f.gate is not None]


def allreduce_plots(doc: Mapping[str, Any], results: Sequence[Result]) -> list[Plot]:
    """busbw per size: every node alone (the fleet, then each node against its gate and its
    baseline, failing nodes first), and the runs across nodes against their gate."""
    alone = busbw_alone(doc, results)
    plots = []
    if alone:
        outcome = {r.host: r.outcome for r in _find(results, "allreduce", "test_each_node_alone")}
        hosts = sorted(alone, key=lambda h: (outcome.get(h) != "fail", natural(h)))
        sizes = {f.size for figs in alone.values() for f in figs}
        fleet = Chart("AllReduce busbw per size, each node alone", "message size", "busbw (GB/s)",
                      log_x=True, x_ticks=_size_ticks(sizes))
        few = len(hosts) <= MAX_LINES
        for i, host in enumerate(sorted(hosts, key=natural)):
            failed = outcome.get(host) == "fail"
            colour = FAIL if failed else PALETTE[i % len(PALETTE)] if few else MUTED
            fleet.lines.append(Line([(f.size, f.median) for f in alone[host]], colour,
                                    host if few else None, 2 if few or failed else 1,
                                    opacity=1 if few or failed else 0.35, dots=few,
                                    title=f"{host}: {outcome.get(host, '')}"))
        if not few:
            middle = [(s, statistics.median(f.median for figs in alone.values() for f in figs
                                            if f.size == s)) for s in sorted(sizes)]
            fleet.lines.append(Line(middle, "#111", f"median of {len(hosts)} nodes", 2.5,
                                    dots=True))
            if any(outcome.get(h) == "fail" for h in hosts):
                fleet.lines.append(Line([], FAIL, "failed nodes"))
        gates = {(f.size, f.gate, f.gate_source) for figs in alone.values() for f in figs
                 if f.gate is not None}
        fleet.dots += [Dot(s, g, FAIL, f"gate {number(g)} GB/s at {size_label(s)} ({src})",
                           "gate") for s, g, src in sorted(gates)[:40]]
        shown = hosts[:MAX_NODE_PLOTS]
        per_node = [_node_busbw_chart(h, alone[h], outcome.get(h, ""), sizes) for h in shown]
        more = len(hosts) - len(shown)
        plots.append(Plot("AllReduce bus bandwidth, each node alone", [fleet.svg()],
                          "busbw per message size (median of the trials); red ticks: the "
                          "gate (the inventory's floor at the largest size, or the node's "
                          "baseline with --compare-baseline)."))
        plots.append(Plot("Each node against its gate and its baseline", per_node,
                          "bars: the spread of the trials; dashed: the node's baseline."
                          + (f" {len(shown)} of {len(hosts)} nodes, failing nodes first; the "
                             f"other {more} are in the fleet plot above." if more else "")))
    across = _across_chart(doc, results)
    if across is not None:
        plots.append(across)
    return plots


def _node_busbw_chart(host: str, figures: list[SizeFigure], outcome: str,
                      sizes: set[int]) -> Markup:
    colour = FAIL if outcome == "fail" else PALETTE[0]
    chart = Chart(f"{host} ({outcome or 'no outcome'})", "message size", "GB/s", log_x=True,
                  x_ticks=_size_ticks(sizes), width=400, height=200)
    chart.lines.append(Line([(f.size, f.median) for f in figures], colour, "median", 2,
                            dots=True, title=host))
    chart.whiskers += [Whisker(f.size, f.low, f.high, colour) for f in figures
                       if f.high > f.low]
    base = [(f.size, f.baseline) for f in figures if f.baseline is not None]
    if base:
        chart.lines.append(Line(base, "#555", "baseline", 1.5, dash=True))
    chart.dots += _gate_dots(host, figures)
    chart.dots += [Dot(f.size, f.median, FAIL, f"{host}: {number(f.median)} GB/s at "
                       f"{size_label(f.size)}, under its gate", "ring")
                   for f in figures if not f.passed]
    if any(f.gate is not None for f in figures):
        chart.lines.append(Line([], FAIL, "gate"))
    return chart.svg()


def _across_chart(doc: Mapping[str, Any], results: Sequence[Result]) -> Plot | None:
    data = _mapping(_mapping(doc.get("data")).get("allreduce"))
    together = _run_sizes(data.get("all nodes"))
    pairs = [(_list(_mapping(run).get("nodes")), _run_sizes(run))
             for run in _dicts(_mapping(data.get("hierarchy")).get("pairs"))]
    pairs = [(nodes, figs) for nodes, figs in pairs if figs]
    if not together and not pairs:
        return None
    fleet = next(iter(_find(results, "allreduce", "test_all_nodes_together")), None)
    props = fleet.properties if fleet else {}
    sizes = {f.size for f in together} | {f.size for _, figs in pairs for f in figs}
    chart = Chart("AllReduce busbw per size across nodes", "message size", "busbw (GB/s)",
                  log_x=True, x_ticks=_size_ticks(sizes))
    for i, (nodes, figs) in enumerate(pairs):
        names = " + ".join(map(str, nodes))
        chart.lines.append(Line([(f.size, f.median) for f in figs], MUTED,
                                "pairs" if i == 0 else None, 1, opacity=0.6, title=names))
    world = props.get("world_size")
    if together:
        label = f"all nodes ({len(_list(_mapping(data.get('all nodes')).get('nodes')))} nodes" + \
            (f", {world} processes)" if world else ")")
        chart.lines.append(Line([(f.size, f.median) for f in together], PALETTE[0], label, 2.5,
                                dots=True))
    gate = _float(props.get("gate_gbps"))
    largest = max(sizes)
    if gate is not None:
        chart.dots.append(Dot(largest, gate, FAIL, f"gate {number(gate)} GB/s for the nodes "
                              "together", "gate"))
        chart.lines.append(Line([], FAIL, "gate"))
    note = f"{fleet.name}: {fleet.outcome}" + (f" ({_clip(fleet.message)})" if fleet.message
                                               else "") if fleet else ""
    share = props.get("line_rate_fraction")
    if isinstance(share, int | float) and not isinstance(share, bool):
        note += (f"; busbw is {share:g} of the slowest line rate "
                 f"({props.get('line_rate_nics')})")
    return Plot("AllReduce across nodes", [chart.svg()], note)


@dataclass(frozen=True)
class Soak:
    """One node's thermal soak as the document keeps it."""

    host: str
    curves: dict[str, dict[str, list[Any]]]
    mirror: dict[str, dict[str, Any]]
    limit: float | None
    warmup: float
    threshold: float | None
    outcome: str


def soaks(doc: Mapping[str, Any], results: Sequence[Result]) -> list[Soak]:
    """Every node's soak with curves, failing nodes first."""
    outcome = {r.host: r.outcome for r in _find(results, "thermal", "test_thermal_soak")}
    out = []
    for host, entry in _mapping(_mapping(doc.get("data")).get("thermal")).items():
        e = _mapping(entry)
        curves = {g: c for g, c in _mapping(e.get("curves")).items() if isinstance(c, dict)}
        if curves:
            out.append(Soak(host, curves, {g: _mapping(m) for g, m in
                                           _mapping(e.get("mirror")).items()},
                            _float(e.get("max_temp_c")), _float(e.get("warmup_s")) or 0.0,
                            _float(e.get("mirror_threshold")), outcome.get(host, "")))
    return sorted(out, key=lambda s: (s.outcome != "fail", natural(s.host)))


def _series(curve: Mapping[str, Any], key: str) -> list[tuple[float, float]]:
    return [(t, v) for t, v in zip(map(_float, _list(curve.get("t"))),
                                   map(_float, _list(curve.get(key))), strict=False)
            if t is not None and v is not None]


def soak_charts(soak: Soak) -> list[Markup]:
    """Temperature, SM clock and power over the soak, one line per GPU; the warm-up shaded,
    a clock that mirrors its temperature hatched over the window the verdict judged."""
    end = max((t for c in soak.curves.values() for t, _ in _series(c, "temp_c")), default=0.0)
    panels = []
    for key, label, unit in (("temp_c", "temperature", "C"), ("sm_mhz", "SM clock", "MHz"),
                             ("power_w", "power", "W")):
        chart = Chart(f"{soak.host}: {label}", "seconds under load", unit, width=390,
                      height=210, x_range=(0.0, end or 1.0), y_zero=key != "temp_c")
        for i, (gpu, curve) in enumerate(sorted(soak.curves.items(), key=lambda g: natural(g[0]))):
            chart.lines.append(Line(_series(curve, key), PALETTE[i % len(PALETTE)], gpu,
                                    title=f"{soak.host} {gpu}"))
        if soak.warmup:
            chart.spans.append(Span(0.0, min(soak.warmup, end or soak.warmup), "#777",
                                    "warm-up"))
        if key != "power_w":
            for gpu, m in sorted(soak.mirror.items()):
                start, stop = _float(m.get("from_s")), _float(m.get("to_s"))
                if m.get("mirrored") is True and start is not None and stop is not None:
                    chart.spans.append(Span(start, stop, FAIL, f"{gpu} mirrors (r "
                                            f"{_float(m.get('r')) or 0:.2f})", hatch=True))
        if key == "temp_c" and soak.limit is not None:
            chart.rules.append(Rule(soak.limit, FAIL, f"limit {soak.limit:g} C"))
        panels.append(chart.svg())
    return panels


def _mirror_note(soak: Soak) -> str:
    parts = []
    for gpu, m in sorted(soak.mirror.items()):
        r, drop = _float(m.get("r")), _float(m.get("drop"))
        if r is None:
            continue
        text = f"{gpu} r = {r:.2f}" + (f", clock fell {drop:.0%}" if drop is not None else "")
        parts.append(text + (" (MIRRORED)" if m.get("mirrored") is True else ""))
    rule = f", mirrored at r <= {soak.threshold:g}" if soak.threshold is not None else ""
    shading = (f"grey: the warm-up ({soak.warmup:g} s, not judged); " if soak.warmup else "") \
        + "hatched: a clock that mirrors its temperature, over the window judged."
    if not parts:
        return shading
    window = "after the warm-up" if soak.warmup else "over the whole soak"
    return (f"SM clock against temperature {window} (Pearson r{rule}): "
            + "; ".join(parts) + ". " + shading)


def thermal_plots(doc: Mapping[str, Any], results: Sequence[Result]) -> list[Plot]:
    """Each soak's curves (failing nodes first, a few), and every node's peak temperature."""
    found = soaks(doc, results)
    plots = [Plot(f"Thermal soak: {s.host} ({s.outcome or 'no outcome'})", soak_charts(s),
                  _mirror_note(s)) for s in found[:MAX_THERMAL_PLOTS]]
    if len(found) > MAX_THERMAL_PLOTS:
        plots[-1].note += (f" The curves of {len(found) - MAX_THERMAL_PLOTS} more nodes are "
                           "in the JSON report's data.thermal.")
    peaks = [(r.host, _float(r.properties.get("max_temp_c")),
              _float(r.properties.get("temp_limit_c")), r.outcome)
             for r in _find(results, "thermal", "test_thermal_soak")]
    peaks = sorted(((h, t, lim, o) for h, t, lim, o in peaks if t is not None),
                   key=lambda p: natural(p[0]))
    if len(peaks) > 1:
        chart = Chart("Peak temperature under sustained load, per node",
                      f"{len(peaks)} nodes, in name order", "C", x_ticks=[], y_zero=False)
        chart.dots += [Dot(i, t, FAIL if o == "fail" else PALETTE[0], f"{h}: {t:g} C ({o})")
                       for i, (h, t, _, o) in enumerate(peaks) if t is not None]
        for limit in sorted({lim for _, _, lim, _ in peaks if lim is not None}):
            chart.rules.append(Rule(limit, FAIL, f"limit {limit:g} C"))
        plots.append(Plot("Peak temperature per node", [chart.svg()]))
    return plots


def storage_plots(results: Sequence[Result]) -> list[Plot]:
    """Each node's sequential read while every node read at once, against the need."""
    rows = sorted(((r.host, _float(r.properties.get("seq_read_mbps")),
                    _float(r.properties.get("need_mbps")), r.outcome)
                   for r in _find(results, "storage", "test_storage_throughput")),
                  key=lambda row: natural(row[0]))
    rows = [row for row in rows if row[1] is not None]
    if not rows:
        return []
    chart = Chart("Sequential read per node, every node reading at once",
                  f"{len(rows)} nodes, in name order", "MB/s",
                  x_ticks=[(i, h) for i, (h, *_) in enumerate(rows)] if len(rows) <= 12 else [])
    chart.dots += [Dot(i, v, FAIL if o == "fail" else PALETTE[0], f"{h}: {v:g} MB/s ({o})")
                   for i, (h, v, _, o) in enumerate(rows) if v is not None]
    for need in sorted({n for *_, n, _ in rows if n is not None}):
        chart.rules.append(Rule(need, FAIL, f"training needs {need:g} MB/s per node"))
    aggregate = next(iter(_find(results, "storage", "test_storage_aggregate")), None)
    note = ""
    if aggregate is not None and aggregate.outcome != "skip":
        p = aggregate.properties
        note = (f"aggregate: {p.get('aggregate_mbps')} MB/s from {p.get('nodes')} nodes "
                f"(needs {p.get('need_mbps')} MB/s): {aggregate.outcome}")
    return [Plot("Storage", [chart.svg()], note)]


# ---- drift ---------------------------------------------------------------------------------

DRIFT_CSS = {"error": "fail", "unreachable": "down", "drifted": "warn", "clean": "pass"}
DRIFT_ORDER = ("error", "unreachable", "drifted", "clean")


@dataclass
class ItemGroup:
    """One drift item as several hosts have it."""

    item: str
    kind: str
    desired: str
    actual: str
    hosts: list[str] = field(default_factory=list)
    new: list[str] = field(default_factory=list)
    reboot: bool = False
    diffs: list[str] = field(default_factory=list)

    @property
    def folded(self) -> str:
        return fold(self.hosts)

    @property
    def search(self) -> str:
        return " ".join([*self.hosts, self.item, self.desired, self.actual]).lower()


def _drift_hosts(doc: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    return {str(h): e for h, e in _mapping(doc.get("hosts")).items() if isinstance(e, dict)}


def render_drift(doc: Mapping[str, Any], history: Sequence[Mapping[str, Any]] = ()) -> str:
    """The HTML page of a ``gpufleet.drift/1`` document; ``history``: the runs kept in the
    report directory (``History.documents()``, oldest first; the current run may be among
    them), for the items over time."""
    hosts = _drift_hosts(doc)
    status = {h: str(e.get("status") or "error") for h, e in hosts.items()}
    items: dict[tuple[str, str, str, str], ItemGroup] = {}
    labels: dict[str, str] = {}
    for host in sorted(hosts, key=natural):
        entry_items = _dicts(hosts[host].get("items"))
        labels[host] = ", ".join(sorted(str(i.get("item")) for i in entry_items))
        for i in entry_items:
            item, kind, desired, actual = (str(i.get(k)) for k in ("item", "kind", "desired",
                                                                    "actual"))
            group = items.setdefault((item, kind, desired, actual),
                                     ItemGroup(item, kind, desired, actual))
            group.hosts.append(host)
            if i.get("new"):
                group.new.append(host)
            group.reboot = group.reboot or bool(i.get("reboot_required"))
            diff = i.get("diff")
            if diff and diff not in group.diffs and len(group.diffs) < 3:
                group.diffs.append(_clip(diff))
    problems = Group("not checked")
    anchors: dict[str, str] = {}
    for host in sorted(hosts, key=natural):
        entry = hosts[host]
        if status[host] in ("unreachable", "error"):
            anchors[host] = f"f{len(anchors)}"
            problems.rows.append(Row(host, status[host], _clip(entry.get("error")),
                                     DRIFT_CSS[status[host]], anchors[host]))
        for fact, reason in _mapping(entry.get("facts_timed_out")).items():
            problems.rows.append(Row(host, f"fact {fact} unknown", _clip(reason), "warn"))
    notes = {h: hosts[h].get("error") or labels[h] for h in hosts}
    cells, sets = _grid_and_sets(
        status, css=DRIFT_CSS, order=DRIFT_ORDER,
        notes={h: str(n or "") for h, n in notes.items()},
        labels={h: labels[h] if status[h] == "drifted" else "" for h in hosts}, anchors=anchors)
    summary = _mapping(doc.get("summary"))
    cards = [Card("hosts", str(len(hosts)))] + [
        Card(s, str(sum(v == s for v in status.values())),
             DRIFT_CSS[s] if any(v == s for v in status.values()) else "")
        for s in DRIFT_ORDER] + [
        Card("items", str(summary.get("items", sum(len(g.hosts) for g in items.values())))),
        Card("new since last run", str(summary.get("new", len(_list(doc.get("new_since_last")))))),
        Card("resolved", str(summary.get("resolved", len(_list(doc.get("resolved_since_last"))))))]
    consistency = [Row(fold(h for hs in _mapping(c.get("values")).values() for h in hs),
                       f"group {c.get('group')}: {c.get('key')}",
                       "; ".join(f"{v} on {fold(hs)}" for v, hs in
                                 _mapping(c.get("values")).items()), "warn")
                   for c in _dicts(doc.get("consistency"))]
    return _render("drift.html.j2", title="gpufleet drift", header=_header(doc), cards=cards,
                   cells=cells, sets=sets, problems=problems,
                   items=sorted(items.values(), key=lambda g: (-len(g.hosts), g.item)),
                   consistency=consistency, since=_since(doc),
                   remediation=[Row(str(h), str(_mapping(r).get("status")),
                                    _clip(_mapping(r).get("error") or ""))
                                for h, r in _mapping(doc.get("remediation")).items()],
                   plots=drift_history_plots(doc, history),
                   heat=drift_heat(doc, history))


def _since(doc: Mapping[str, Any]) -> list[Row]:
    rows = []
    for key, label in (("new_since_last", "new"), ("resolved_since_last", "resolved")):
        by_item: dict[str, list[str]] = defaultdict(list)
        for entry in _list(doc.get(key)):
            host, _, item = str(entry).partition(" ")
            by_item[item].append(host)
        rows += [Row(fold(h), item, label, "warn" if label == "new" else "pass")
                 for item, h in sorted(by_item.items())]
    return rows


def _runs(doc: Mapping[str, Any], history: Sequence[Mapping[str, Any]]
          ) -> list[Mapping[str, Any]]:
    """The history's runs and the current one, oldest first, each once: two runs that
    started within one second (the times have seconds) stay two runs, and the current run
    is not counted twice when the history holds it."""
    seen: dict[str, Mapping[str, Any]] = {}
    for run in [*history, doc]:
        if isinstance(run, Mapping) and isinstance(run.get("hosts"), dict):
            seen.setdefault(json.dumps(run, sort_keys=True, default=str), run)
    return sorted(seen.values(),
                  key=lambda r: (str(r.get("started_at")), str(r.get("generated_at"))))


def _run_ticks(runs: Sequence[Mapping[str, Any]]) -> list[tuple[float, str]]:
    every = max(1, -(-len(runs) // 6))
    return [(float(i), str(r.get("started_at") or "")[5:16].replace("T", " "))
            for i, r in enumerate(runs)][::every]


def drift_history_plots(doc: Mapping[str, Any], history: Sequence[Mapping[str, Any]]
                        ) -> list[Plot]:
    """Hosts drifted and not checked, and drift items, per run of the history."""
    runs = _runs(doc, history)
    if len(runs) < 2:
        return []
    drifted, lost, items = [], [], []
    for i, run in enumerate(runs):
        statuses = Counter(str(_mapping(e).get("status")) for e in _drift_hosts(run).values())
        drifted.append((float(i), float(statuses["drifted"])))
        lost.append((float(i), float(statuses["unreachable"] + statuses["error"])))
        items.append((float(i), float(sum(len(_dicts(e.get("items")))
                                          for e in _drift_hosts(run).values()))))
    ticks = _run_ticks(runs)
    hosts = Chart(f"Hosts per run, last {len(runs)} runs", "run started (UTC)", "hosts",
                  x_ticks=ticks, width=580)
    hosts.lines += [Line(drifted, "#f9a825", "drifted", 2, dots=True),
                    Line(lost, "#6a1b9a", "unreachable or error", 2, dots=True)]
    count = Chart("Drift items per run", "run started (UTC)", "items", x_ticks=ticks, width=580)
    count.lines.append(Line(items, PALETTE[0], "items", 2, dots=True))
    return [Plot("Drift over time", [hosts.svg(), count.svg()],
                 "from the runs kept in the report directory (--report-dir, --keep)")]


@dataclass
class Heat:
    """Drift items (rows) over runs (columns): how many hosts had each."""

    runs: list[str]
    rows: list[tuple[str, list[tuple[int, float]]]]


def drift_heat(doc: Mapping[str, Any], history: Sequence[Mapping[str, Any]]) -> Heat | None:
    """The items most hosts have now (then over the history), per run."""
    runs = _runs(doc, history)
    if len(runs) < 2:
        return None
    per_run = [Counter(str(i.get("item")) for e in _drift_hosts(run).values()
                       for i in _dicts(e.get("items"))) for run in runs]
    total: Counter[str] = Counter()
    for c in per_run:
        total.update(c)
    if not total:
        return None
    top = sorted(total, key=lambda i: (-per_run[-1][i], -total[i], i))[:MAX_HISTORY_ITEMS]
    peak = max(max(c.values(), default=0) for c in per_run) or 1
    return Heat([label for _, label in _run_ticks(runs)] if len(runs) <= 6 else
                [str(r.get("started_at") or "")[5:16].replace("T", " ") for r in runs],
                [(item, [(c[item], round(0.15 + 0.85 * c[item] / peak, 2) if c[item] else 0.0)
                         for c in per_run]) for item in top])


# ---- acceptance ----------------------------------------------------------------------------

@dataclass
class Figure:
    """One acceptance figure of one node: its value as text, PASS/FAIL/SKIP, and why."""

    text: str
    css: str
    note: str = ""


@dataclass
class NodeRow:
    """A node's row of the acceptance table."""

    host: str
    status: str
    figures: list[Figure]

    @property
    def search(self) -> str:
        return " ".join([self.host, self.status, *(f.text + " " + f.note
                                                   for f in self.figures)]).lower()


ACCEPTANCE = ("single-node AllReduce", "multi-node AllReduce", "storage read",
              "temperature under load")


def merge_conformance(docs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Several conformance documents (bootstrap's node-local and peer runs, an acceptance
    run beside a conformance run) as one: results in order, data and baselines merged."""
    merged: dict[str, Any] = {"results": [], "data": {}, "baselines": {}}
    for doc in docs:
        merged["results"] += _dicts(doc.get("results"))
        for suite, entries in _mapping(doc.get("data")).items():
            merged["data"].setdefault(suite, {}).update(_mapping(entries))
        merged["baselines"].update(_mapping(doc.get("baselines")))
        for key in ("inventory", "inventory_digest", "gpufleet_version"):
            merged.setdefault(key, doc.get(key))
        merged.setdefault("started_at", doc.get("started_at"))
        merged["finished_at"] = doc.get("finished_at")
        merged["generated_at"] = doc.get("generated_at")
    return merged


def _figure(result: Result | None, value: str, gate: str = "") -> Figure:
    if result is None:
        return Figure("not run", "none")
    if result.outcome == "skip":
        return Figure("skipped", "skip", result.message)
    note = _clip(result.message) if result.outcome == "fail" else gate
    return Figure(value or result.outcome, OUTCOME_CSS.get(result.outcome.upper(), "skip"), note)


def _largest_gate(result: Result) -> str:
    verdicts = _mapping(result.properties.get("verdicts"))
    size = result.properties.get("largest_size")
    gate = _real(_mapping(verdicts.get(f"allreduce.busbw.{size}")).get("gate"))
    return f"gate {number(gate)} GB/s" if gate is not None else ""


def _multi_node(docs: Sequence[Mapping[str, Any]]) -> dict[str, Figure]:
    """Each node's largest multi-node AllReduce run: the nodes that ran it are the run's
    other hosts less those left out (they failed alone)."""
    best: dict[str, tuple[int, Figure]] = {}
    for doc in docs:
        results = results_of(doc)
        run = next(iter(_find(results, "allreduce", "test_all_nodes_together")), None)
        if run is None:
            continue
        hosts = {r.host for r in results if r.host != FLEET}
        left = {str(h) for h in _list(run.properties.get("left_out"))}
        props = run.properties
        busbw, gate = _real(props.get("busbw_gbps")), _real(props.get("gate_gbps"))
        ran = hosts - left
        text = f"{number(busbw)} GB/s on {len(ran)} nodes" if busbw is not None else ""
        figure = _figure(run, text, f"gate {number(gate)} GB/s" if gate is not None else "")
        for host in hosts:
            current = figure if host not in left else Figure("left out", "fail",
                                                             "failed alone")
            if len(ran) > best.get(host, (-1, current))[0]:
                best[host] = (len(ran), current)
    return {h: f for h, (_, f) in best.items()}


def acceptance_rows(docs: Sequence[Mapping[str, Any]], results: Sequence[Result],
                    hosts: Iterable[str]) -> list[NodeRow]:
    """Per node, the four acceptance figures, failing nodes first."""
    def by_host(suite: str, check: str) -> dict[str, Result]:
        return {r.host: r for r in _find(results, suite, check)}

    alone = by_host("allreduce", "test_each_node_alone")
    storage = by_host("storage", "test_storage_throughput")
    thermal = by_host("thermal", "test_thermal_soak")
    aggregate = next(iter(_find(results, "storage", "test_storage_aggregate")), None)
    across = _multi_node(docs)
    status = _host_status(results)
    rows = []
    for host in hosts:
        a, s, t = alone.get(host), storage.get(host), thermal.get(host)
        busbw = _real(a.properties.get("busbw_gbps")) if a else None
        single = _figure(a, f"{number(busbw)} GB/s at "
                            f"{size_label(_float(a.properties.get('largest_size')) or 0)}"
                         if a and busbw is not None else "", _largest_gate(a) if a else "")
        read = _real(s.properties.get("seq_read_mbps")) if s else None
        together = s.properties.get("read_together_with") if s else None
        stored = _figure(s, f"{read:g} MB/s" + (f" with {together} others" if together else "")
                         if read is not None else "",
                         f"needs {s.properties.get('need_mbps')} MB/s"
                         if s and s.properties.get("need_mbps") is not None else "")
        if aggregate is not None and aggregate.outcome != "skip" and stored.css != "none":
            stored.note = "; ".join(filter(None, [
                stored.note, f"aggregate {aggregate.properties.get('aggregate_mbps')} MB/s "
                f"({aggregate.outcome})"]))
        peak = _real(t.properties.get("max_temp_c")) if t else None
        limit = _real(t.properties.get("temp_limit_c")) if t else None
        heat = _figure(t, f"{peak:g} C" if peak is not None else "",
                       f"limit {limit:g} C" if limit is not None else "")
        rows.append(NodeRow(host, status.get(host, "SKIP"),
                            [single, across.get(host, Figure("not run", "none")), stored, heat]))
    return sorted(rows, key=lambda r: (r.status != "FAIL", natural(r.host)))


def _versions(merged: Mapping[str, Any], bootstrap: Sequence[Mapping[str, Any]],
              nodes: Sequence[Mapping[str, Any]]) -> list[tuple[str, list[tuple[str, str]]]]:
    """Per key of the stack (kernel, driver, cuda, nccl, torch ...), each value and the
    hosts that have it (folded)."""
    per_host: dict[str, dict[str, str]] = {}
    for host, values in _mapping(_mapping(_mapping(merged.get("data")).get("stack"))
                                 .get("versions")).items():
        per_host[str(host)] = {str(k): str(v) for k, v in _mapping(values).items()}
    states = [*nodes, *(_mapping(_mapping(s.get("data")).get("state")) for b in bootstrap
                        for s in _dicts(b.get("steps")) if s.get("step") == "mark")]
    for state in states:
        if state.get("host"):
            per_host.setdefault(str(state["host"]), {}).update(
                {str(k): str(v) for k, v in _mapping(state.get("versions")).items()})
    for name, run in _mapping(_mapping(merged.get("data")).get("allreduce")).items():
        summary = _mapping(_mapping(run).get("summary"))
        if name.startswith("single ") and summary:
            found = {f"{k} (AllReduce probe)": str(summary[k]) for k in ("torch", "cuda", "nccl")
                     if summary.get(k)}
            devices = Counter(map(str, _list(summary.get("devices"))))
            found.update({"GPUs (AllReduce probe)": ", ".join(f"{n}x {d}" for d, n in
                                                              devices.items())} if devices else {})
            per_host.setdefault(name.removeprefix("single "), {}).update(found)
    for host, entry in _mapping(_mapping(merged.get("data")).get("image")).items():
        per_host.setdefault(str(host), {}).update(_image_versions(_mapping(entry)))
    for r in results_of(merged):
        if r.suite == "stack" and r.check == "test_torch_imports":
            per_host.setdefault(r.host, {}).update(
                {f"{k} (imported)": str(v) for k, v in r.properties.items() if v is not None})
    keys: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for host, values in per_host.items():
        for key, value in values.items():
            keys[key][value].append(host)
    return [(key, [(value, fold(hosts)) for value, hosts in
                   sorted(values.items(), key=lambda kv: -len(kv[1]))])
            for key, values in sorted(keys.items())]


def _image_versions(entry: Mapping[str, Any]) -> dict[str, str]:
    """The training image's stack on one node, as the image suite reported it."""
    stack = _mapping(entry.get("image_stack"))
    torch = _mapping(stack.get("torch"))
    env = _mapping(stack.get("env"))
    found = {"image": entry.get("image"), "image ID": str(stack.get("id") or "")[:19] or None,
             "python (image)": stack.get("python"), "torch (image)": torch.get("version"),
             "cuda (image)": env.get("CUDA_VERSION") or torch.get("cuda"),
             "nccl (image)": torch.get("nccl") or stack.get("dpkg_nccl")
             or env.get("NCCL_VERSION")}
    return {k: str(v) for k, v in found.items() if v}


def _figure_summary(results: Sequence[Result]) -> list[Row]:
    """Every gated performance figure across the nodes: range, gates, failing nodes."""
    found: dict[str, list[tuple[str, float, bool, str]]] = defaultdict(list)
    for r in results:
        for name, verdict in _mapping(r.properties.get("verdicts")).items():
            v = _mapping(verdict)
            median = _float(v.get("median"))
            if median is not None:
                found[name].append((r.host, median, v.get("passed") is not False,
                                    str(v.get("unit") or "")))
    rows = []
    for name, entries in sorted(found.items()):
        values = [m for _, m, _, _ in entries]
        failed = [h for h, _, ok, _ in entries if not ok]
        unit = entries[0][3]
        rows.append(Row(fold(failed) if failed else "", name,
                        f"{len(entries)} nodes: {number(min(values))} to {number(max(values))} "
                        f"{unit}, median {number(statistics.median(values))}",
                        "fail" if failed else "pass"))
    return rows


ACCEPTED, NOT_ACCEPTED, NOT_MEASURED = "ACCEPTED", "NOT ACCEPTED", "NOT MEASURED"


@dataclass(frozen=True)
class Acceptance:
    """The acceptance's verdict: NOT ACCEPTED when a check failed or a bootstrapped node is
    not ready; else NOT MEASURED when a node has none of the four acceptance figures
    measured (``unmeasured``; each was skipped or not run), or there is no node; else
    ACCEPTED. Nothing measured is never accepted."""

    verdict: str
    unmeasured: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "unmeasured": list(self.unmeasured)}


def _judge(rows: Sequence[NodeRow], failed: bool, ready: Iterable[bool]) -> Acceptance:
    unmeasured = tuple(r.host for r in rows if not any(f.css == "pass" for f in r.figures))
    if failed or not all(ready):
        return Acceptance(NOT_ACCEPTED, unmeasured)
    if unmeasured or not rows:
        return Acceptance(NOT_MEASURED, unmeasured)
    return Acceptance(ACCEPTED)


def acceptance(conformance: Sequence[Mapping[str, Any]], *,
               bootstrap: Sequence[Mapping[str, Any]] = ()) -> Acceptance:
    """The verdict the acceptance report shows for these documents (those of
    :func:`render_acceptance`), for the command's exit code and its JSON to say the same."""
    results = results_of(merge_conformance(conformance))
    hosts = set(_host_status(results)) | {str(b.get("host")) for b in bootstrap
                                          if b.get("host")}
    rows = acceptance_rows(conformance, results, sorted(hosts, key=natural))
    return _judge(rows, any(r.outcome == "fail" for r in results),
                  (b.get("ready") is True for b in bootstrap))


def render_acceptance(conformance: Sequence[Mapping[str, Any]], *,
                      bootstrap: Sequence[Mapping[str, Any]] = (),
                      nodes: Sequence[Mapping[str, Any]] = ()) -> str:
    """The acceptance report: its verdict (:class:`Acceptance`), per node the four acceptance
    figures (single-node and multi-node AllReduce, storage read with every node reading,
    temperature under sustained load), every other check, the performance figures and the
    stack's versions.

    ``conformance``: the ``gpufleet.conformance/1`` documents of the runs (a ``--suite all``
    run, or a bootstrap's certify runs); ``bootstrap``: ``gpufleet.bootstrap/1`` documents
    (their steps, and the versions their mark step recorded); ``nodes``:
    ``gpufleet.node/1`` states (``/etc/gpufleet/node.json``)."""
    merged = merge_conformance(conformance)
    results = results_of(merged)
    parts = _conformance_parts(merged, results)
    hosts = set(_host_status(results)) | {str(b.get("host")) for b in bootstrap
                                          if b.get("host")}
    rows = acceptance_rows(conformance, results, sorted(hosts, key=natural))
    steps = [(str(b.get("host")), b.get("ready") is True, _clip(b.get("reason") or ""),
              [Row(str(s.get("step")), str(s.get("status")), _clip(s.get("detail")),
                   "pass" if s.get("status") == "ok" else "fail" if s.get("status") == "failed"
                   else "skip") for s in _dicts(b.get("steps"))]) for b in bootstrap]
    verdict = _judge(rows, bool(parts["failures"]), (r for _, r, _, _ in steps))
    passed: dict[str, list[str]] = defaultdict(list)
    for r in results:
        if r.outcome == "pass":
            passed[r.name].append(r.host)
    return _render("acceptance.html.j2", title="gpufleet acceptance report",
                   header=_header(merged), verdict=verdict, columns=ACCEPTANCE, rows=rows,
                   versions=_versions(merged, bootstrap, nodes), steps=steps,
                   figures=_figure_summary(results),
                   passed=[(name, fold(h), len(h)) for name, h in sorted(passed.items())],
                   **parts)
