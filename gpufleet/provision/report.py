"""The ``provision`` report: plans and applied changes on the terminal, hosts with the
same folded into one host set, and the JSON document (schema gpufleet.provision/1)."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from gpufleet.connect.fleet import Outcome, summarize
from gpufleet.inventory.target import Target
from gpufleet.provision.engine import HostRun
from gpufleet.provision.plan import Change, Plan
from gpufleet.report import terminal
from gpufleet.report.jsonfile import envelope
from gpufleet.report.terminal import markup

SCHEMA = "gpufleet.provision/1"
ACTION_MARK = {"install": "+", "create": "+", "reboot": "!", "reload": "~"}


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
        return (tuple((change_line(c), c.diff, id(c) in done)
                      for c in run.plan.changes), bool(run.reboot_pending))

    planned = [n for n, o in outcomes.items()
               if o.value is not None and o.value.plan is not None and not o.value.plan.empty]
    for hosts, _, members in terminal.fold(planned, shown):
        run = outcomes[members[0]].value
        assert run is not None and run.plan is not None
        con.print(f"[bold]{title} {terminal.markup(hosts)}[/bold] "
                  f"({len(run.plan.changes)} change(s))")
        print_plan(con, run.plan, diff, None if title == "PLAN" else run.applied,
                            bool(run.reboot_pending))


def manual_notes(outcomes: dict[str, Outcome[HostRun]]) -> dict[str, str]:
    """For the recap: the hosts whose plan has changes left to an operator."""
    notes = {}
    for name, outcome in outcomes.items():
        run = outcome.value
        manual = [c for c in run.plan.changes if c.manual] if run and run.plan else []
        if manual:
            notes[name] = f"{len(manual)} change(s) for an operator (manual)"
    return notes


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


def _mark(change: Change) -> str:
    if change.pending_reboot:
        return "!"
    return ACTION_MARK.get(change.action, "~")


def change_line(change: Change) -> str:
    """One readable line: what, where, from what, to what."""
    note = "reboot required" if change.pending_reboot else change.action
    return (f"{_mark(change)} {change.role:<9} {change.resource:<44} "
            f"{change.before} -> {change.after}  ({note})")


def print_plan(out: Console, plan: Plan, diff: bool, applied: list[Change] | None = None,
               reboot_pending: bool = False) -> None:
    """A host's plan, with unified diffs when asked; with ``applied``, what was done."""
    done = {id(c) for c in applied or []}
    for change in plan.changes:
        style = "magenta" if change.pending_reboot else "yellow"
        tag = ""
        if change.manual:  # never applied: an operator makes it
            tag = "" if applied is None else "MANUAL "
        elif applied is not None:
            ok = id(change) in done and not (change.pending_reboot and reboot_pending)
            tag = "done " if ok else ("PENDING " if change.pending_reboot else "NOT DONE ")
            style = "green" if ok else ("magenta" if change.pending_reboot else "red")
        out.print(f"  [{style}]{tag}{markup(change_line(change))}[/{style}]")
        if diff and change.diff:
            for line in change.diff.rstrip("\n").splitlines():
                color = "green" if line.startswith("+") else "red" if line.startswith("-") \
                    else "dim"
                out.print(f"      [{color}]{markup(line)}[/{color}]")
