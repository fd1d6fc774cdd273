"""Drift reports: terminal, JSON (versioned schema), JUnit and Prometheus textfile."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from gpufleet.drift.compare import SCHEMA
from gpufleet.drift.run import DriftRun
from gpufleet.report import junit
from gpufleet.report.jsonfile import envelope
from gpufleet.report.prometheus import Metric
from gpufleet.report.terminal import markup, plain

STATUS_STYLE = {"clean": "green", "drifted": "yellow", "unreachable": "red bold",
                "error": "red bold"}


def to_json(run: DriftRun) -> dict[str, Any]:
    """The drift report document (schema gpufleet.drift/1, see docs/drift.md)."""
    doc = envelope(SCHEMA, inventory=run.inventory, inventory_digest=run.inventory_digest,
                   duration_s=run.duration, summary=run.summary(),
                   started_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(run.started)),
                   hosts={n: h.to_dict() for n, h in run.hosts.items()},
                   consistency=[i.to_dict() for i in run.inconsistencies],
                   new_since_last=run.new, resolved_since_last=run.resolved,
                   roles_checked=run.roles_checked)
    if run.remediation:
        doc["remediation"] = run.remediation
    return doc


def to_junit(run: DriftRun) -> list[junit.Case]:
    """One case per host (reachable and checked) and one per drift item."""
    cases: list[junit.Case] = []
    for name, host in run.hosts.items():
        case = junit.Case(f"drift.{name}", "host checked", host.duration)
        if host.status in ("unreachable", "error"):
            case.error = f"{host.status}: {host.error}"
        cases.append(case)
        for item in host.items:
            message = f"desired {item.desired}, actual {item.actual}"
            cases.append(junit.Case(f"drift.{name}", item.item, failure=message,
                                    details=item.diff or message,
                                    properties={"role": item.role, "kind": item.kind,
                                                "new": str(item.new).lower()}))
    return cases


def to_metrics(run: DriftRun) -> list[Metric]:
    """node_exporter textfile metrics."""
    items = Metric("gpufleet_drift_items", "Drift items per host, role and item (1 = drifted).")
    per_host = Metric("gpufleet_drift_host_items", "Number of drift items per host.")
    reachable = Metric("gpufleet_host_reachable",
                       "1 when the host's facts were gathered by the last drift run.")
    hosts = Metric("gpufleet_drift_hosts", "Hosts per drift status in the last run.")
    last = Metric("gpufleet_drift_last_run_timestamp_seconds",
                  "Unix time at which the last drift run finished.")
    duration = Metric("gpufleet_drift_last_run_duration_seconds", "Wall time of the last run.")
    hung = Metric("gpufleet_facts_timed_out",
                  "Facts whose tool did not answer in time on the host (a hung nvidia-smi).")
    for name, host in run.hosts.items():
        reachable.add(0 if host.status in ("unreachable", "error") else 1, host=name)
        per_host.add(len(host.items), host=name)
        hung.add(len(host.timed_out), host=name)
        for item in host.items:
            items.add(1, host=name, role=item.role, item=item.resource)
    for status in ("clean", "drifted", "unreachable", "error"):
        hosts.add(run.count(status), status=status)
    last.add(run.started + run.duration)
    duration.add(round(run.duration, 3))
    return [items, per_host, reachable, hosts, last, duration, hung]


def _print_hosts(out: Console, run: DriftRun) -> None:
    """One status line per host, and the facts whose tool hung on it."""
    width = max((len(plain(n)) for n in run.hosts), default=4)
    for name, host in run.hosts.items():
        style = STATUS_STYLE[host.status]
        new = sum(i.new for i in host.items)
        detail = f"{len(host.items)} item(s), {new} new" if host.items else ""
        if host.error:
            detail = host.error
        out.print(f"  {escape(plain(name).ljust(width))}  [{style}]{host.status:<11}[/{style}] "
                  f"{markup(detail)}")
        for fact, reason in host.timed_out.items():
            out.print(f"  {' ' * width}  [red]fact {markup(fact)} unknown: {markup(reason)}[/red]")


def print_report(out: Console, run: DriftRun, diff: bool = True) -> None:
    """Summary line per host, then items grouped by host with desired and actual. Every
    name and value shown comes from hosts or the inventory and is printed escaped."""
    out.print("[bold]DRIFT[/bold]")
    _print_hosts(out, run)
    for name, host in run.hosts.items():
        if not host.items:
            continue
        table = Table(title=markup(name), title_justify="left", pad_edge=False,
                      show_lines=False)
        for col in ("role", "item", "desired", "actual", ""):
            table.add_column(col, overflow="fold")
        for item in host.items:
            table.add_row(markup(item.role), markup(item.resource), markup(item.desired),
                          markup(item.actual), "NEW" if item.new else "")
        out.print(table)
        if diff:
            for item in host.items:
                if item.diff:
                    for line in item.diff.rstrip("\n").splitlines():
                        out.print(f"    [dim]{markup(line)}[/dim]")
    for inc in run.inconsistencies:
        spread = "; ".join(f"{v} on {', '.join(h)}" for v, h in inc.values.items())
        out.print(f"[yellow]group {markup(inc.group)}: {markup(inc.key)} differs[/yellow] "
                  f"({markup(spread)})")
    s = run.summary()
    out.print(f"{s['hosts']} hosts: {s['clean']} clean, {s['drifted']} drifted, "
              f"{s['unreachable']} unreachable, {s['error']} error; {s['items']} item(s); "
              f"since last run: {s['new']} new, {s['resolved']} resolved "
              f"({run.duration:.1f}s)")
    for name, result in run.remediation.items():
        out.print(f"  remediation {markup(name)}: {markup(result['status'])}"
                  + (f" ({markup(result['error'])})" if result.get("error") else ""))
