"""What the drift page shows: each host's status, the drift items as several hosts have
them, the hosts not checked, group consistency, the standing watch's silenced findings and
unread reports, what changed since the last run, and the items over the runs the report
directory keeps."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpufleet.report.html.page import (
    Card,
    Group,
    Plot,
    Row,
    clip,
    dicts,
    fold,
    grid_and_sets,
    header,
    list_of,
    mapping,
    natural,
)
from gpufleet.report.jsonfile import utc
from gpufleet.report.svg import PALETTE, Chart, Line

MAX_HISTORY_ITEMS = 15
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
    return {str(h): e for h, e in mapping(doc.get("hosts")).items() if isinstance(e, dict)}


def drift_page(doc: Mapping[str, Any], history: Sequence[Mapping[str, Any]] = ()
               ) -> dict[str, Any]:
    """What the page of a ``gpufleet.drift/1`` document shows; ``history``: the runs kept in
    the report directory, oldest first (the current run may be among them)."""
    hosts = _drift_hosts(doc)
    status = {h: str(e.get("status") or "error") for h, e in hosts.items()}
    items: dict[tuple[str, str, str, str], ItemGroup] = {}
    labels: dict[str, str] = {}
    for host in sorted(hosts, key=natural):
        entry_items = dicts(hosts[host].get("items"))
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
                group.diffs.append(clip(diff))
    problems = Group("not checked")
    anchors: dict[str, str] = {}
    for host in sorted(hosts, key=natural):
        entry = hosts[host]
        if status[host] in ("unreachable", "error"):
            anchors[host] = f"f{len(anchors)}"
            problems.rows.append(Row(host, status[host], clip(entry.get("error")),
                                     DRIFT_CSS[status[host]], anchors[host]))
        for fact, reason in mapping(entry.get("facts_timed_out")).items():
            problems.rows.append(Row(host, f"fact {fact} unknown", clip(reason), "warn"))
    notes = {h: hosts[h].get("error") or labels[h] for h in hosts}
    cells, sets = grid_and_sets(
        status, css=DRIFT_CSS, order=DRIFT_ORDER,
        notes={h: str(n or "") for h, n in notes.items()},
        labels={h: labels[h] if status[h] == "drifted" else "" for h in hosts}, anchors=anchors)
    summary = mapping(doc.get("summary"))
    cards = [Card("hosts", str(len(hosts)))] + [
        Card(s, str(sum(v == s for v in status.values())),
             DRIFT_CSS[s] if any(v == s for v in status.values()) else "")
        for s in DRIFT_ORDER] + [
        Card("items", str(summary.get("items", sum(len(g.hosts) for g in items.values())))),
        Card("new since last run",
             str(summary.get("new", len(list_of(doc.get("new_since_last")))))),
        Card("resolved",
             str(summary.get("resolved", len(list_of(doc.get("resolved_since_last"))))))]
    consistency = [Row(fold(h for hs in mapping(c.get("values")).values() for h in hs),
                       f"group {c.get('group')}: {c.get('key')}",
                       "; ".join(f"{v} on {fold(hs)}" for v, hs in
                                 mapping(c.get("values")).items()), "warn")
                   for c in dicts(doc.get("consistency"))]
    return dict(header=header(doc), cards=cards, cells=cells, sets=sets, problems=problems,
                   items=sorted(items.values(), key=lambda g: (-len(g.hosts), g.item)),
                   consistency=consistency, watch=_watch(hosts), since=_since(doc),
                   remediation=[Row(str(h), str(mapping(r).get("status")),
                                    clip(mapping(r).get("error") or ""))
                                for h, r in mapping(doc.get("remediation")).items()],
                   plots=drift_history_plots(doc, history),
                   heat=drift_heat(doc, history))


def _watch(hosts: Mapping[str, Mapping[str, Any]]) -> list[Row]:
    """Each host's silenced watch findings (its open ones are drift items) and the watch
    reports that could not be read."""
    rows = []
    for host in sorted(hosts, key=natural):
        watch = mapping(hosts[host].get("watch"))
        if watch.get("unknown"):
            rows.append(Row(host, "watch report unknown", clip(watch["unknown"]), "warn"))
        for finding in dicts(watch.get("silenced")):
            until = finding.get("silenced_until")
            when = f"until {utc(until)}" if isinstance(until, (int, float)) else "without an end"
            reason = f" ({finding['silence_reason']})" if finding.get("silence_reason") else ""
            rows.append(Row(host, f"silenced {finding.get('id')}",
                            clip(f"{when}{reason}: {finding.get('message')}"), "skip"))
    return rows


def _since(doc: Mapping[str, Any]) -> list[Row]:
    rows = []
    for key, label in (("new_since_last", "new"), ("resolved_since_last", "resolved")):
        by_item: dict[str, list[str]] = defaultdict(list)
        for entry in list_of(doc.get(key)):
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
        statuses = Counter(str(mapping(e).get("status")) for e in _drift_hosts(run).values())
        drifted.append((float(i), float(statuses["drifted"])))
        lost.append((float(i), float(statuses["unreachable"] + statuses["error"])))
        items.append((float(i), float(sum(len(dicts(e.get("items")))
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
                       for i in dicts(e.get("items"))) for run in runs]
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
