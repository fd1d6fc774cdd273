"""The acceptance verdict and what it is judged from: per node the four acceptance figures
(single-node and multi-node AllReduce, storage read with every node reading, temperature
under sustained load), from the conformance documents merged."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpufleet.report.html.conformance import (
    FLEET,
    OUTCOME_CSS,
    Result,
    find,
    host_status,
    results_of,
)
from gpufleet.report.html.page import clip, dicts, finite, list_of, mapping, natural, real
from gpufleet.report.svg import number, size_label


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
        merged["results"] += dicts(doc.get("results"))
        for suite, entries in mapping(doc.get("data")).items():
            merged["data"].setdefault(suite, {}).update(mapping(entries))
        merged["baselines"].update(mapping(doc.get("baselines")))
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
    note = clip(result.message) if result.outcome == "fail" else gate
    return Figure(value or result.outcome, OUTCOME_CSS.get(result.outcome.upper(), "skip"), note)


def _largest_gate(result: Result) -> str:
    verdicts = mapping(result.properties.get("verdicts"))
    size = result.properties.get("largest_size")
    gate = real(mapping(verdicts.get(f"allreduce.busbw.{size}")).get("gate"))
    return f"gate {number(gate)} GB/s" if gate is not None else ""


def _multi_node(docs: Sequence[Mapping[str, Any]]) -> dict[str, Figure]:
    """Each node's largest multi-node AllReduce run: the nodes that ran it are the run's
    other hosts less those left out (they failed alone)."""
    best: dict[str, tuple[int, Figure]] = {}
    for doc in docs:
        results = results_of(doc)
        run = next(iter(find(results, "allreduce", "test_all_nodes_together")), None)
        if run is None:
            continue
        hosts = {r.host for r in results if r.host != FLEET}
        left = {str(h) for h in list_of(run.properties.get("left_out"))}
        props = run.properties
        busbw, gate = real(props.get("busbw_gbps")), real(props.get("gate_gbps"))
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
        return {r.host: r for r in find(results, suite, check)}

    alone = by_host("allreduce", "test_each_node_alone")
    storage = by_host("storage", "test_storage_throughput")
    thermal = by_host("thermal", "test_thermal_soak")
    aggregate = next(iter(find(results, "storage", "test_storage_aggregate")), None)
    across = _multi_node(docs)
    status = host_status(results)
    rows = []
    for host in hosts:
        a, s, t = alone.get(host), storage.get(host), thermal.get(host)
        busbw = real(a.properties.get("busbw_gbps")) if a else None
        single = _figure(a, f"{number(busbw)} GB/s at "
                            f"{size_label(finite(a.properties.get('largest_size')) or 0)}"
                         if a and busbw is not None else "", _largest_gate(a) if a else "")
        read = real(s.properties.get("seq_read_mbps")) if s else None
        together = s.properties.get("read_together_with") if s else None
        stored = _figure(s, f"{read:g} MB/s" + (f" with {together} others" if together else "")
                         if read is not None else "",
                         f"needs {s.properties.get('need_mbps')} MB/s"
                         if s and s.properties.get("need_mbps") is not None else "")
        if aggregate is not None and aggregate.outcome != "skip" and stored.css != "none":
            stored.note = "; ".join(filter(None, [
                stored.note, f"aggregate {aggregate.properties.get('aggregate_mbps')} MB/s "
                f"({aggregate.outcome})"]))
        peak = real(t.properties.get("max_temp_c")) if t else None
        limit = real(t.properties.get("temp_limit_c")) if t else None
        heat = _figure(t, f"{peak:g} C" if peak is not None else "",
                       f"limit {limit:g} C" if limit is not None else "")
        rows.append(NodeRow(host, status.get(host, "SKIP"),
                            [single, across.get(host, Figure("not run", "none")), stored, heat]))
    return sorted(rows, key=lambda r: (r.status != "FAIL", natural(r.host)))


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


def judge(rows: Sequence[NodeRow], failed: bool, ready: Iterable[bool]) -> Acceptance:
    """The verdict of the acceptance rows, whether a check failed and whether each
    bootstrapped node is ready."""
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
    hosts = set(host_status(results)) | {str(b.get("host")) for b in bootstrap
                                          if b.get("host")}
    rows = acceptance_rows(conformance, results, sorted(hosts, key=natural))
    return judge(rows, any(r.outcome == "fail" for r in results),
                  (b.get("ready") is True for b in bootstrap))
