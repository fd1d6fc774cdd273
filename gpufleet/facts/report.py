"""The ``facts`` command's core and report: every host's facts gathered with their short
summary (``gather``), the summary for the terminal table, the facts a host could not read
grouped by reason, the standing watch's findings, and the JSON document (schema
gpufleet.facts/1)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpufleet.connect.connection import Connection
from gpufleet.connect.fleet import (
    FleetOptions,
    Outcome,
    ProgressSink,
    TaskResult,
    run_fleet,
    summarize,
)
from gpufleet.facts.catalog import json_safe
from gpufleet.facts.gather import FactRequest, Facts, gather_facts
from gpufleet.facts.summary import summarize_facts
from gpufleet.facts.watch import reading
from gpufleet.inventory.model import Host
from gpufleet.inventory.target import Target
from gpufleet.report.jsonfile import envelope, utc

SCHEMA = "gpufleet.facts/1"


def gather(hosts: list[Host], request: Callable[[Host], FactRequest], options: FleetOptions,
           progress: ProgressSink | None = None) -> dict[str, Outcome[dict[str, Any]]]:
    """Every host's facts (what ``request(host)`` asks for) in one round trip each, as
    ``{"summary": ..., "facts": ...}``."""
    def task(host: Host, conn: Connection) -> TaskResult[dict[str, Any]]:
        gathered = gather_facts(conn, request(host))
        return TaskResult({"summary": summarize_facts(gathered), "facts": gathered})

    return run_fleet(hosts, task, options, progress)


def to_json(target: Target, outcomes: dict[str, Outcome[dict[str, Any]]],
            duration: float) -> dict[str, Any]:
    """The facts report document: the header, the counts and every host's facts."""
    return envelope(SCHEMA, inventory=str(target.inventory.path),
                    inventory_digest=target.inventory.digest(), duration_s=duration,
                    summary=summary(outcomes),
                    hosts={n: host_json(o) for n, o in outcomes.items()})


def summary(outcomes: dict[str, Outcome[Any]]) -> dict[str, int]:
    """The facts report's counts: hosts, and how many ended each way (``ok``: gathered)."""
    counts = summarize(outcomes)
    return {"hosts": len(outcomes), **{k: n for k, n in counts.items() if k != "changed"}}


def summary_only(outcome: Outcome[dict[str, Any]]) -> Outcome[Any]:
    """The outcome with its short summary as the value, as the terminal table shows it."""
    value = outcome.value["summary"] if outcome.value else None
    return Outcome(outcome.host, outcome.status, outcome.error, outcome.duration, value,
                   outcome.round_trips)


def absent_by_reason(gathered: Facts) -> dict[str, list[str]]:
    """The facts a host could not give, grouped by why: reason -> fact names."""
    by_reason: dict[str, list[str]] = {}
    for fact, reason in gathered.absent.items():
        by_reason.setdefault(reason, []).append(fact)
    return by_reason


def ago(seconds: float) -> str:
    """``42s``, ``5m``, ``3h``, ``2d``: how long ago, to its largest unit."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


RISING_SHOWN = 5
"""Rising counters the facts command shows per node (the fastest; the JSON has them all)."""


def watch_lines(gathered: Facts) -> list[str]:
    """The watch's report as the facts command shows it, where it has anything to show: its
    counts and time, then each finding (``OPEN``, ``PENDING``, ``SILENCED``) with its
    message, which names the counter's increase, window, rate and limit, the fastest
    rising counters (``RISING``: subject, counter, increase, window, rate and the rule's
    limit), and the watch's notes. A report that could not be read is among the unknown
    facts."""
    found = reading(gathered)
    if found is None or found.report is None or not (found.report.findings
                                                      or found.report.notes
                                                      or found.report.rising):
        return []
    report = found.report
    when = utc(report.time) + ("" if report.age_s is None else f", {ago(report.age_s)} ago")
    lines = [f"watch: {report.counts()} (report {when})"]
    for finding in report.findings:
        silence = f" [silenced {finding.silence}]" if finding.status == "silenced" else ""
        lines.append(f"  {finding.status.upper()} {finding.id}: {finding.message}{silence}")
    lines += [f"  RISING {rise.describe()}" for rise in report.rising[:RISING_SHOWN]]
    if len(report.rising) > RISING_SHOWN:
        lines.append(f"  (+{len(report.rising) - RISING_SHOWN} more rising counters)")
    return lines + [f"  note: {note}" for note in report.notes]


def host_json(outcome: Outcome[dict[str, Any]]) -> dict[str, Any]:
    """One host's entry of the facts report."""
    doc: dict[str, Any] = {"status": outcome.status, "error": outcome.error,
                           "duration_s": round(outcome.duration, 3),
                           "round_trips": outcome.round_trips}
    if outcome.value:
        gathered = outcome.value["facts"]
        doc["summary"] = outcome.value["summary"]
        doc["facts"] = json_safe(gathered.values)
        doc["absent"] = gathered.absent
    return doc
