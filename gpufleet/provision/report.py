"""The ``provision`` report: plans and applied changes on the terminal, hosts with the
same folded into one host set, and the JSON document (schema gpufleet.provision/1)."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from gpufleet.connect.fleet import Outcome, summarize
from gpufleet.inventory.target import Target
from gpufleet.provision.engine import HostRun
from gpufleet.report import terminal
from gpufleet.report.jsonfile import envelope

SCHEMA = "gpufleet.provision/1"


def to_json(target: Target, outcomes: dict[str, Outcome[HostRun]], duration: float,
            check: bool) -> dict[str, Any]:
    """The provision report document: the header, the counts and every host's changes."""
    return envelope(SCHEMA, inventory=str(target.inventory.path),
                    inventory_digest=target.inventory.digest(), duration_s=duration,
                    summary=summary(outcomes), check=check,
                    hosts={n: host_json(o) for n, o in outcomes.items()})


def print_plans(con: Console, outcomes: dict[str, Outcome[HostRun]], diff: bool,
                title: str) -> None:
    """Each host's plan (check) or applied changes; hosts with the same are printed once,
    as a host set."""
    def shown(name: str) -> tuple[Any, ...]:
        run = outcomes[name].value
        assert run is not None and run.plan is not None
        done = {id(c) for c in run.applied}
        return (tuple((terminal.change_line(c), c.diff, id(c) in done)
                      for c in run.plan.changes), bool(run.reboot_pending))

    planned = [n for n, o in outcomes.items()
               if o.value is not None and o.value.plan is not None and not o.value.plan.empty]
    for hosts, _, members in terminal.fold(planned, shown):
        run = outcomes[members[0]].value
        assert run is not None and run.plan is not None
        con.print(f"[bold]{title} {terminal.markup(hosts)}[/bold] "
                  f"({len(run.plan.changes)} change(s))")
        terminal.print_plan(con, run.plan, diff, None if title == "PLAN" else run.applied,
                            bool(run.reboot_pending))


def summary(outcomes: dict[str, Outcome[HostRun]]) -> dict[str, int]:
    """The provision report's counts: hosts per outcome as the recap counts them, hosts
    with a reboot pending, and the changes planned and applied (as the hosts' entries
    list them)."""
    counts = {"hosts": len(outcomes), **summarize(outcomes), "reboot_required": 0,
              "changes": 0, "applied": 0}
    for outcome in outcomes.values():
        run = outcome.value
        if run is None:
            continue
        counts["reboot_required"] += bool(run.reboot_pending)
        if run.plan:
            applied = {id(c) for c in run.applied}
            counts["changes"] += len(run.plan.changes)
            counts["applied"] += sum(id(c) in applied for c in run.plan.changes)
    return counts


def host_json(outcome: Outcome[HostRun]) -> dict[str, Any]:
    """One host's provisioning result for the JSON report."""
    run = outcome.value
    doc: dict[str, Any] = {"status": outcome.status, "error": outcome.error,
                           "duration_s": round(outcome.duration, 3)}
    if run and run.plan:
        applied = {id(c) for c in run.applied}
        doc["changes"] = [dict(c.to_dict(), applied=id(c) in applied) for c in run.plan.changes]
        doc["reboot_required"] = run.reboot_pending
        doc["rebooted"] = run.rebooted
    return doc
