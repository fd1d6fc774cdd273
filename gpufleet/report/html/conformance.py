"""A conformance document's results as the pages show them: each result read defensively,
each host's status, the NIC counters that moved, the racks' power budgets, and the gated
performance figures across the nodes."""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpufleet.report.html.page import Row, clip, dicts, finite, fold, list_of, mapping, natural
from gpufleet.report.svg import number

FLEET = "fleet"
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
                   mapping(r.get("properties"))) for r in dicts(doc.get("results"))]


def host_status(results: Sequence[Result]) -> dict[str, str]:
    """Each host's status: FAIL if a check failed, else PASS if one passed, else SKIP."""
    outcomes: dict[str, set[str]] = defaultdict(set)
    for r in results:
        if r.host != FLEET:
            outcomes[r.host].add(r.outcome)
    return {h: "FAIL" if "fail" in o else "PASS" if "pass" in o else "SKIP"
            for h, o in outcomes.items()}


def find(results: Sequence[Result], suite: str, check: str) -> list[Result]:
    """The results of one check of one suite."""
    return [r for r in results if r.suite == suite and r.check == check]


COUNTER_PHASES = {"pairs": "AllReduce, pairs", "all": "AllReduce, all nodes",
                  "connects": "reachability connects"}


def counter_rows(results: Sequence[Result]) -> list[Row]:
    """Per node and measurement across nodes, the NIC counters that moved (the
    ``nic_counters_during_*`` checks), tagged with the check's outcome."""
    rows = []
    for r in results:
        if not r.check.startswith("test_nic_counters_during_"):
            continue
        for phase, entry in mapping(r.properties.get("counters")).items():
            moved = [str(m) for m in list_of(mapping(entry).get("moved"))]
            if moved:
                rows.append(Row(r.host, COUNTER_PHASES.get(phase, phase),
                                clip("; ".join(moved)),
                                {"pass": "pass", "fail": "fail"}.get(r.outcome, "skip")))
    return sorted(rows, key=lambda row: (natural(row.host), row.name))


def rack_rows(doc: Mapping[str, Any], results: Sequence[Result]) -> list[Row]:
    """Each rack's power budget use (the bmc suite's ``data.racks.budgets``): measured peaks
    against the budget, tagged with the rack check's outcome."""
    check = next(iter(find(results, "bmc", "test_rack_power_budget")), None)
    css = {"pass": "pass", "fail": "fail"}.get(check.outcome if check else "", "skip")
    rows = []
    budgets = mapping(mapping(mapping(doc.get("data")).get("racks")).get("budgets"))
    for rack, entry in sorted(budgets.items(), key=lambda kv: natural(str(kv[0]))):
        use = mapping(entry)
        used, budget = finite(use.get("used_w")) or 0.0, finite(use.get("budget_w")) or 0.0
        share = f" ({used / budget:.0%})" if budget else ""
        peaks = mapping(use.get("nodes"))
        unknown = sorted(str(n) for n, v in peaks.items() if v is None)
        rows.append(Row(str(rack), f"{use.get('cooling')} cooled", clip(
            f"{number(used)} W of {number(budget)} W{share}: {use.get('margin')} x the "
            f"{number(finite(use.get('supply_w')) or 0)} W supply, {len(peaks)} "
            f"node{'' if len(peaks) == 1 else 's'}"
            + (f"; no measured peak for {fold(unknown)}" if unknown else "")),
            "fail" if budget and used > budget else css))
    return rows


def figure_summary(results: Sequence[Result]) -> list[Row]:
    """Every gated performance figure across the nodes: range, gates, failing nodes."""
    found: dict[str, list[tuple[str, float, bool, str]]] = defaultdict(list)
    for r in results:
        for name, verdict in mapping(r.properties.get("verdicts")).items():
            v = mapping(verdict)
            median = finite(v.get("median"))
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
