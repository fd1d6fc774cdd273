"""The plots of measured figures, drawn from a conformance document: AllReduce busbw per
size (each node alone, against its gate and baseline, and across nodes), the thermal soaks'
curves and peaks, and storage reads."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from markupsafe import Markup

from gpufleet.report.html.conformance import Result, find
from gpufleet.report.html.page import Plot, clip, dicts, finite, list_of, mapping, natural
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

MAX_NODE_PLOTS = 12
MAX_THERMAL_PLOTS = 6
MAX_LINES = 8  # nodes drawn in colours of their own; more are drawn grey


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


def _run_sizes(run: Any) -> list[SizeFigure]:
    """busbw per size of one AllReduce run of the JSON's data (runs of one process moved no
    bytes between ranks and are left out)."""
    out = []
    for entry in dicts(mapping(run).get("results")):
        busbw, size = finite(entry.get("busbw")), finite(entry.get("size"))
        if busbw is None or size is None or (finite(entry.get("world_size")) or 0) < 2:
            continue
        out.append(SizeFigure(int(size), busbw, busbw, busbw))
    return sorted(out, key=lambda f: f.size)


def busbw_alone(doc: Mapping[str, Any], results: Sequence[Result]) -> dict[str, list[SizeFigure]]:
    """Every node's single-node busbw per size: from its verdicts (trials, gate, baseline),
    else from the run in the document's data."""
    data = mapping(mapping(doc.get("data")).get("allreduce"))
    out: dict[str, list[SizeFigure]] = {}
    for r in find(results, "allreduce", "test_each_node_alone"):
        figures = []
        for name, verdict in mapping(r.properties.get("verdicts")).items():
            v = mapping(verdict)
            median = finite(v.get("median"))
            if not name.startswith("allreduce.busbw.") or median is None \
                    or not name.rsplit(".", 1)[1].isdigit():
                continue
            trials = [x for x in map(finite, [*list_of(v.get("trials")),
                                              *list_of(v.get("remeasured"))]) if x is not None]
            figures.append(SizeFigure(int(name.rsplit(".", 1)[1]), median,
                                      min(trials, default=median), max(trials, default=median),
                                      finite(v.get("gate")), str(v.get("gate_source") or ""),
                                      finite(v.get("baseline")), v.get("passed") is not False))
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
        outcome = {r.host: r.outcome for r in find(results, "allreduce", "test_each_node_alone")}
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
    data = mapping(mapping(doc.get("data")).get("allreduce"))
    together = _run_sizes(data.get("all nodes"))
    pairs = [(list_of(mapping(run).get("nodes")), _run_sizes(run))
             for run in dicts(mapping(data.get("hierarchy")).get("pairs"))]
    pairs = [(nodes, figs) for nodes, figs in pairs if figs]
    if not together and not pairs:
        return None
    fleet = next(iter(find(results, "allreduce", "test_all_nodes_together")), None)
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
        label = f"all nodes ({len(list_of(mapping(data.get('all nodes')).get('nodes')))} nodes" + \
            (f", {world} processes)" if world else ")")
        chart.lines.append(Line([(f.size, f.median) for f in together], PALETTE[0], label, 2.5,
                                dots=True))
    gate = finite(props.get("gate_gbps"))
    largest = max(sizes)
    if gate is not None:
        chart.dots.append(Dot(largest, gate, FAIL, f"gate {number(gate)} GB/s for the nodes "
                              "together", "gate"))
        chart.lines.append(Line([], FAIL, "gate"))
    note = f"{fleet.name}: {fleet.outcome}" + (f" ({clip(fleet.message)})" if fleet.message
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
    outcome = {r.host: r.outcome for r in find(results, "thermal", "test_thermal_soak")}
    out = []
    for host, entry in mapping(mapping(doc.get("data")).get("thermal")).items():
        e = mapping(entry)
        curves = {g: c for g, c in mapping(e.get("curves")).items() if isinstance(c, dict)}
        if curves:
            out.append(Soak(host, curves, {g: mapping(m) for g, m in
                                           mapping(e.get("mirror")).items()},
                            finite(e.get("max_temp_c")), finite(e.get("warmup_s")) or 0.0,
                            finite(e.get("mirror_threshold")), outcome.get(host, "")))
    return sorted(out, key=lambda s: (s.outcome != "fail", natural(s.host)))


def _series(curve: Mapping[str, Any], key: str) -> list[tuple[float, float]]:
    return [(t, v) for t, v in zip(map(finite, list_of(curve.get("t"))),
                                   map(finite, list_of(curve.get(key))), strict=False)
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
                start, stop = finite(m.get("from_s")), finite(m.get("to_s"))
                if m.get("mirrored") is True and start is not None and stop is not None:
                    chart.spans.append(Span(start, stop, FAIL, f"{gpu} mirrors (r "
                                            f"{finite(m.get('r')) or 0:.2f})", hatch=True))
        if key == "temp_c" and soak.limit is not None:
            chart.rules.append(Rule(soak.limit, FAIL, f"limit {soak.limit:g} C"))
        panels.append(chart.svg())
    return panels


def _mirror_note(soak: Soak) -> str:
    parts = []
    for gpu, m in sorted(soak.mirror.items()):
        r, drop = finite(m.get("r")), finite(m.get("drop"))
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
    peaks = [(r.host, finite(r.properties.get("max_temp_c")),
              finite(r.properties.get("temp_limit_c")), r.outcome)
             for r in find(results, "thermal", "test_thermal_soak")]
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
    rows = sorted(((r.host, finite(r.properties.get("seq_read_mbps")),
                    finite(r.properties.get("need_mbps")), r.outcome)
                   for r in find(results, "storage", "test_storage_throughput")),
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
    aggregate = next(iter(find(results, "storage", "test_storage_aggregate")), None)
    note = ""
    if aggregate is not None and aggregate.outcome != "skip":
        p = aggregate.properties
        note = (f"aggregate: {p.get('aggregate_mbps')} MB/s from {p.get('nodes')} nodes "
                f"(needs {p.get('need_mbps')} MB/s): {aggregate.outcome}")
    return [Plot("Storage", [chart.svg()], note)]
