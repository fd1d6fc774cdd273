"""Drift reports: terminal, JSON (versioned schema), JUnit and Prometheus textfile."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from gpufleet import __version__
from gpufleet.drift.compare import SCHEMA, DriftItem
from gpufleet.drift.run import DriftRun
from gpufleet.report import junit
from gpufleet.report.jsonfile import envelope
from gpufleet.report.prometheus import Textfile
from gpufleet.report.terminal import fold, markup, plain

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


def to_junit(run: DriftRun) -> junit.Suite:
    """Per host its ``reachable`` case (an error when it could not be checked), then one
    failed case per drift item, named ``role/resource``."""
    suite = junit.Suite("drift", run.started, {
        "inventory": run.inventory, "inventory_digest": run.inventory_digest,
        "gpufleet_version": __version__, "roles_checked": run.roles_checked,
        "summary": run.summary()})
    for name, host in run.hosts.items():
        error = f"{host.status}: {host.error}" if host.status in ("unreachable", "error") \
            else None
        if not suite.host(name, error=error, time_s=host.duration):
            continue
        for item in host.items:
            message = f"desired {item.desired}, actual {item.actual}"
            suite.case(name, item.item, failure=message, details=item.diff or message,
                       data={"role": item.role, "resource": item.resource, "kind": item.kind,
                             "desired": item.desired, "actual": item.actual,
                             "reboot_required": item.reboot_required, "new": item.new,
                             "finding_class": item.finding_class})
    return suite


STATUSES = ("clean", "drifted", "unreachable", "error")


def to_metrics(run: DriftRun, textfile: Textfile, previous: str | None = None) -> Textfile:
    """node_exporter textfile metrics of the run; ``previous`` (the file they replace, for
    a run over part of the fleet) gives the other hosts' series, which are kept."""
    tf = textfile
    tf.gauge("gpufleet_drift_host_status", "1 for the host's status in its last drift run "
             "(clean, drifted, unreachable or error), 0 for the others.", ["host", "status"])
    tf.gauge("gpufleet_host_reachable", "1 when the host's facts were gathered by its last "
             "drift run.", ["host"])
    tf.gauge("gpufleet_drift_host_items", "Drift items of the host in its last run.", ["host"])
    tf.gauge("gpufleet_drift_items", "1 for each drift item of the host's last run, by role and "
             "item.", ["host", "role", "item"])
    tf.gauge("gpufleet_facts_timed_out", "Facts whose tool did not answer in time on the host "
             "in its last run (a hung nvidia-smi).", ["host"])
    tf.gauge("gpufleet_drift_host_last_run_timestamp_seconds", "Unix time at which the host's "
             "last drift run finished.", ["host"])
    finished = run.started + run.duration
    for name, host in run.hosts.items():
        for status in STATUSES:
            tf.set("gpufleet_drift_host_status", float(host.status == status), host=name,
                   status=status)
        tf.set("gpufleet_host_reachable", float(host.status not in ("unreachable", "error")),
               host=name)
        tf.set("gpufleet_drift_host_items", len(host.items), host=name)
        tf.set("gpufleet_facts_timed_out", len(host.timed_out), host=name)
        tf.set("gpufleet_drift_host_last_run_timestamp_seconds", finished, host=name)
        for item in host.items:  # validate_roles refuses two roles managing one path
            tf.set("gpufleet_drift_items", 1, host=name, role=item.role, item=item.resource)
    if previous is not None:
        tf.keep_others(previous, run.hosts)
    tf.gauge("gpufleet_drift_hosts", "Hosts per drift status (the fleet, each host as of its "
             "last run).", ["status"])
    counts = dict.fromkeys(STATUSES, 0)
    for labels, value in tf.samples("gpufleet_drift_host_status"):
        counts[labels["status"]] += int(value)
    for status, count in counts.items():
        tf.set("gpufleet_drift_hosts", count, status=status)
    tf.gauge("gpufleet_drift_last_run_timestamp_seconds", "Unix time at which the last drift "
             "run (of any hosts) finished.")
    tf.set("gpufleet_drift_last_run_timestamp_seconds", finished)
    tf.gauge("gpufleet_drift_last_run_duration_seconds", "Wall time of the last drift run.")
    tf.set("gpufleet_drift_last_run_duration_seconds", round(run.duration, 3))
    tf.gauge("gpufleet_drift_last_run_hosts", "Hosts the last drift run checked.")
    tf.set("gpufleet_drift_last_run_hosts", len(run.hosts))
    return tf


_SEVERITY = {"error": 0, "unreachable": 1, "drifted": 2, "clean": 3}


def _item_key(item: DriftItem) -> tuple[Any, ...]:
    note = " ".join(word for word, on in (("NEW", item.new), ("manual", item.manual)) if on)
    return (item.role, item.resource, item.desired, item.actual, note, item.diff)


def _print_hosts(out: Console, run: DriftRun) -> None:
    """One status line per set of hosts alike (``node[001-998]  clean``), the worst first,
    the facts whose tool hung, and the watch's silenced findings and unread reports."""
    names = sorted(run.hosts, key=lambda n: _SEVERITY[run.hosts[n].status])

    def line(name: str) -> tuple[Any, ...]:
        host = run.hosts[name]
        new = sum(i.new for i in host.items)
        detail = f"{len(host.items)} item(s), {new} new" if host.items else ""
        return (host.status, host.error or detail, tuple(host.timed_out.items()),
                tuple(host.watch_notes()))

    groups = fold(names, line)
    width = max((len(plain(h)) for h, _, _ in groups), default=4)
    for hosts, (status, detail, timed_out, watch_notes), _ in groups:
        style = STATUS_STYLE[status]
        out.print(f"  {escape(plain(hosts).ljust(width))}  [{style}]{status:<11}[/{style}] "
                  f"{markup(detail)}")
        for fact, reason in timed_out:
            out.print(f"  {' ' * width}  [red]fact {markup(fact)} unknown: {markup(reason)}[/red]")
        for note in watch_notes:
            out.print(f"  {' ' * width}  [yellow]{markup(note)}[/yellow]")


def print_report(out: Console, run: DriftRun, diff: bool = True) -> None:
    """Summary lines of hosts alike, then the items of each set of hosts that drifted
    alike, with desired and actual. Every name and value shown comes from hosts or the
    inventory and is printed escaped."""
    out.print("[bold]DRIFT[/bold]")
    _print_hosts(out, run)
    drifted = [n for n, h in run.hosts.items() if h.items]
    for hosts, key, _ in fold(drifted, lambda n: tuple(_item_key(i) for i in run.hosts[n].items)):
        table = Table(title=markup(hosts), title_justify="left", pad_edge=False,
                      show_lines=False)
        for col in ("role", "item", "desired", "actual", ""):
            table.add_column(col, overflow="fold")
        for role, resource, desired, actual, note, _ in key:
            table.add_row(markup(role), markup(resource), markup(desired), markup(actual),
                          note)
        out.print(table)
        if diff:
            for *_, item_diff in key:
                if item_diff:
                    for text in item_diff.rstrip("\n").splitlines():
                        out.print(f"    [dim]{markup(text)}[/dim]")
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
