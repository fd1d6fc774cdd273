"""A drift run: every selected host's provisioning plan computed in check mode, the fleet's
consistency, the standing watch's open findings and what changed since the last run, as one
typed :class:`DriftRun` (``check_fleet``); and the optional remediation of the drifted hosts
(``remediate``)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufleet import exitcodes
from gpufleet import roles as role_registry
from gpufleet.connect.fleet import FleetOptions, ProgressSink
from gpufleet.drift import compare
from gpufleet.drift.compare import HostDrift, Inconsistency
from gpufleet.drift.history import History
from gpufleet.facts.gather import FactRequest
from gpufleet.inventory.model import Host
from gpufleet.inventory.target import Target
from gpufleet.provision.engine import RunOptions, provision, validate
from gpufleet.provision.plan import ApplyOptions
from gpufleet.provision.role import Role


@dataclass
class DriftRun:
    """Everything one drift run found."""

    inventory: str
    inventory_digest: str
    hosts: dict[str, HostDrift]
    inconsistencies: list[Inconsistency]
    new: list[str]
    resolved: list[str]
    started: float
    duration: float
    roles_checked: list[str] = field(default_factory=list)
    remediation: dict[str, dict[str, Any]] = field(default_factory=dict)

    def count(self, status: str) -> int:
        return sum(h.status == status for h in self.hosts.values())

    @property
    def items(self) -> int:
        return sum(len(h.items) for h in self.hosts.values())

    def summary(self) -> dict[str, int]:
        return {"hosts": len(self.hosts), "clean": self.count("clean"),
                "drifted": self.count("drifted"), "unreachable": self.count("unreachable"),
                "error": self.count("error"), "items": self.items, "new": len(self.new),
                "resolved": len(self.resolved)}



@dataclass(frozen=True)
class DriftOptions:
    """What a drift run checks: the roles (all when None), the fleet options, and the
    history it compares with (None: every item counts as new). ``remediate``: the fleet
    options of a provisioning run that applies the plan to the drifted hosts afterwards
    (``reboot``: rebooting those whose loaded driver differs); None: read-only."""

    roles: Sequence[Role] | None = None
    fleet: FleetOptions = field(default_factory=FleetOptions)
    history: History | None = None
    remediate: FleetOptions | None = None
    reboot: bool = False


def history_dir(report_dir: Path, target: Target) -> Path:
    """Where an inventory's drift history lives under the report directory."""
    slug = "".join(c if c.isalnum() or c in "-_." else "_"
                   for c in str(target.inventory.path)).strip("_.")
    return report_dir / slug


def extra_facts(host: Host) -> FactRequest:
    """What drift reads beyond the selected roles' facts: the values a group shares and,
    where the watch is in use, its last report (both whatever ``--roles`` selects)."""
    return role_registry.consistency_request(host) | role_registry.watch_request(host)


def check_fleet(target: Target, options: DriftOptions,
                progress: ProgressSink | None = None) -> DriftRun:
    """Every selected host's drift from the inventory and from its group, and its watch's
    open findings; writes nothing on any node."""
    selected = list(options.roles) if options.roles is not None else list(role_registry.ALL)
    validate(target.hosts, selected)
    max_ages = {host.name: setup.max_age_s for host in target.hosts
                if (setup := role_registry.watch_setup(host)) is not None}
    started = time.time()
    outcomes = provision(target.inventory, target.hosts, selected,
                         RunOptions(check=True, fleet=options.fleet, extra_facts=extra_facts),
                         progress)
    hosts = {name: compare.host_drift(o, max_ages.get(name)) for name, o in outcomes.items()}
    facts = {n: o.value.facts for n, o in outcomes.items() if o.value and o.value.facts}
    inconsistencies = compare.check_consistency(target.inventory, facts)
    managed = {n: set(o.value.plan.roles) for n, o in outcomes.items()
               if o.value and o.value.plan}
    compare.add_consistency_items(hosts, inconsistencies, managed)
    checked = {r.name for r in selected}
    previous = options.history.last_items() if options.history else {}
    new, resolved = compare.mark_new(hosts, previous, checked)
    return DriftRun(str(target.inventory.path), target.inventory.digest(), hosts,
                    inconsistencies, new, resolved, started, time.time() - started,
                    sorted(checked | {compare.CONSISTENCY_ROLE, compare.WATCH_ROLE}))


def run_drift(target: Target, options: DriftOptions, progress: ProgressSink | None = None,
              remediating: ProgressSink | None = None) -> DriftRun:
    """``check_fleet``, then, when ``options.remediate`` asks, the drifted hosts
    remediated (``remediating`` follows that run)."""
    run = check_fleet(target, options, progress)
    if options.remediate is not None:
        remediate(target, run, options, options.remediate, remediating)
    return run


def remediate(target: Target, run: DriftRun, options: DriftOptions, fleet: FleetOptions,
              progress: ProgressSink | None = None) -> dict[str, dict[str, Any]]:
    """Apply the plan of ``options``' roles to the drifted hosts under ``fleet`` (a
    provisioning run's budget; its serial and max-fail-percent honoured); the result per
    host is also kept in ``run.remediation``."""
    drifted = [h for h in target.hosts if run.hosts[h.name].status == "drifted"]
    if not drifted:
        return {}
    selected = list(options.roles) if options.roles is not None else list(role_registry.ALL)
    outcomes = provision(target.inventory, drifted, selected,
                         RunOptions(apply=ApplyOptions(reboot=options.reboot), fleet=fleet,
                                    command="drift --remediate"),
                         progress)
    run.remediation = {
        name: {"status": "reboot required" if o.value and o.value.reboot_pending
               else o.status, "error": o.error,
               "applied": [c.item for c in (o.value.applied if o.value else [])
                           if not c.pending_reboot]}
        for name, o in outcomes.items()}
    return run.remediation


def exit_code(run: DriftRun) -> int:
    """3 when a host could not be checked, 1 for drift (or a remediation that left some),
    else 0."""
    if run.count("unreachable") or run.count("error"):
        return exitcodes.UNREACHABLE
    if run.remediation:
        failed = any(r["status"] not in ("ok", "changed") for r in run.remediation.values())
        unfixable = any(i.role in (compare.CONSISTENCY_ROLE, compare.WATCH_ROLE) or i.manual
                        for h in run.hosts.values() for i in h.items)
        return exitcodes.FAILED if failed or unfixable else exitcodes.OK
    return exitcodes.FAILED if run.items else exitcodes.OK
