"""Facts + inventory -> plan, per host; apply it unless checking. Shared by provision,
drift and bootstrap."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gpufleet.connect.connection import Connection
from gpufleet.connect.fleet import FleetOptions, Outcome, ProgressSink, TaskResult, run_fleet
from gpufleet.errors import GpufleetError
from gpufleet.facts.gather import FactRequest, Facts, gather_facts
from gpufleet.inventory.model import Host, Inventory
from gpufleet.provision import nodelock
from gpufleet.provision.plan import (
    ApplyContext,
    ApplyOptions,
    Change,
    HostLost,
    Plan,
    StepFailed,
    apply_plan,
)
from gpufleet.provision.role import PlanContext, Role, RoleVars


@dataclass
class HostRun:
    """What happened on one host: its facts, its plan, what was applied."""

    facts: Facts | None = None
    plan: Plan | None = None
    applied: list[Change] = field(default_factory=list)
    reboot_pending: str | None = None
    rebooted: bool = False
    log: list[str] = field(default_factory=list)


def active_roles(host: Host, roles: Sequence[Role]) -> list[tuple[Role, RoleVars]]:
    """The roles the inventory asks to manage on ``host``, with their variables."""
    pairs = [(role, RoleVars(host, role.defaults)) for role in roles]
    return [(role, v) for role, v in pairs if role.active(v)]


class BadVariables(GpufleetError):
    """Variables the roles cannot use, found before any host is contacted (exit 2)."""


def validate(hosts: Sequence[Host], roles: Sequence[Role], most: int = 20) -> None:
    """Check every selected role's variables on every host, once, before anything runs;
    raise BadVariables listing the problems (at most ``most``)."""
    problems: list[str] = []
    for host in hosts:
        claims: dict[str, tuple[Role, str]] = {}
        for role in roles:
            v = RoleVars(host, role.defaults)
            try:
                role.check(v)
                if role.active(v):
                    role.request(v)
                    for what, path in role.managed_files(v).items():
                        if path in claims:
                            problems.append(_claimed_twice(host, claims[path], (role, what),
                                                           path))
                        claims[path] = (role, what)
            except GpufleetError as exc:
                problems.append(str(exc))
    if problems:
        more = f" (and {len(problems) - most} more)" if len(problems) > most else ""
        raise BadVariables("; ".join(problems[:most]) + more)


def _claimed_twice(host: Host, first: tuple[Role, str], second: tuple[Role, str],
                   path: str) -> str:
    """Two roles (or one role's two variables) that would manage the same file."""
    def named(claim: tuple[Role, str]) -> str:
        role, what = claim
        where = host.origin(what) if what in host.vars else None
        return f"{role.name}'s {what}" + (f" ({where})" if where else "")

    return (f"host {host.name}: {named(first)} and {named(second)} are both {path}: one file "
            "can be managed by one of them only; give each its own path")


def fact_request(pairs: list[tuple[Role, RoleVars]]) -> FactRequest:
    """Everything the active roles need, for one facts round trip."""
    request = FactRequest()
    for role, v in pairs:
        request = request | role.request(v)
    return request


def plan_host(inventory: Inventory, host: Host, pairs: list[tuple[Role, RoleVars]],
              facts: Facts) -> Plan:
    """Every active role's changes, in role order, reboots last."""
    ctx = PlanContext(inventory, host)
    changes: list[Change] = []
    for role, v in pairs:
        changes += role.plan(facts, v, ctx)
    ordered = [c for c in changes if not c.pending_reboot] + \
              [c for c in changes if c.pending_reboot]
    return Plan(host.name, ordered)


def gather_and_plan(inventory: Inventory, host: Host, roles: Sequence[Role],
                    conn: Connection, extra: FactRequest | None = None) -> tuple[Facts, Plan]:
    """One facts round trip (the roles' needs plus ``extra``), then the plan."""
    pairs = active_roles(host, roles)
    facts = gather_facts(conn, fact_request(pairs) | (extra or FactRequest()))
    plan = plan_host(inventory, host, pairs, facts)
    plan.roles = [role.name for role, _ in pairs]
    return facts, plan


@dataclass
class RunOptions:
    """A provisioning run's choices; ``extra_facts`` adds facts to the one round trip;
    ``command`` names the run to others that find the node locked."""

    check: bool = False
    apply: ApplyOptions = field(default_factory=ApplyOptions)
    fleet: FleetOptions = field(default_factory=FleetOptions)
    extra_facts: Callable[[Host], FactRequest] | None = None
    command: str = "provision"


def provision(inventory: Inventory, hosts: Sequence[Host], roles: Sequence[Role],
              options: RunOptions, progress: ProgressSink | None = None,
              ) -> dict[str, Outcome[HostRun]]:
    """Plan every host, and apply the plans unless ``options.check``.

    Each host publishes its HostRun as its progress, and ``applied`` grows as changes
    complete, so a host cut off at its deadline or lost mid-run still reports them.
    """

    def task(host: Host, conn: Connection) -> TaskResult[HostRun]:
        run = HostRun()
        conn.budget.progress = run
        extra = options.extra_facts(host) if options.extra_facts else None
        run.facts, run.plan = gather_and_plan(inventory, host, roles, conn, extra)
        if options.check or not run.plan.applicable:  # manual changes alone: nothing to do
            run.reboot_pending = _pending_reason(run.plan)
            return TaskResult(run, changed=bool(run.plan.applicable))
        holder = nodelock.Holder.this_run(options.command, conn.budget.remaining())
        try:
            lock = nodelock.acquire(conn, holder, options.apply.lock_timeout_s)
        except nodelock.NodeLocked as exc:
            return TaskResult(run, failed=str(exc))
        run.log.append("node lock " + lock.note)
        ctx = ApplyContext(conn, host, options.apply, applied=run.applied, log=run.log)
        try:
            if lock.waited:  # the run it waited for may have changed the node: plan again
                run.facts, run.plan = gather_and_plan(inventory, host, roles, conn, extra)
            apply_plan(run.plan, ctx)
        except StepFailed as exc:
            return TaskResult(run, changed=bool(run.applied), failed=str(exc))
        except HostLost as exc:
            return TaskResult(run, changed=bool(run.applied), unreachable=str(exc))
        finally:
            with contextlib.suppress(GpufleetError):  # a lost host's lock goes stale
                nodelock.release(ctx.conn, holder)
            if ctx.conn is not conn:
                ctx.conn.close()
        run.reboot_pending = ctx.memo.get("reboot_pending")
        run.rebooted = any(line.startswith("rebooted") for line in ctx.log)
        if run.rebooted:
            return _verify_after_reboot(inventory, host, roles, run, conn)
        changed = [c for c in run.applied if not c.pending_reboot]
        return TaskResult(run, changed=bool(changed) or run.rebooted)

    return run_fleet(hosts, task, options.fleet, progress)


def _pending_reason(plan: Plan) -> str | None:
    for change in plan.changes:
        if change.pending_reboot:
            return f"{change.before} -> {change.after}"
    return None


def _verify_after_reboot(inventory: Inventory, host: Host, roles: Sequence[Role], run: HostRun,
                         before: Connection) -> TaskResult[HostRun]:
    conn = before.reopen()
    try:
        facts, plan = gather_and_plan(inventory, host, roles, conn)
    finally:
        conn.close()
    run.facts = facts
    if plan.applicable:
        left = ", ".join(f"{c.item} ({c.before} -> {c.after})" for c in plan.applicable)
        return TaskResult(run, changed=True, failed=f"not converged after reboot: {left}")
    return TaskResult(run, changed=True)
