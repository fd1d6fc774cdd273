"""Drift: how far each host is from the inventory, and how far hosts of a group are from
each other, and the standing watch's open findings (or a watch that stopped running).
Drift is the provisioning plan computed in check mode, reported; it never writes anything
on a node.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gpufleet import roles as role_registry
from gpufleet.connect.fleet import Outcome
from gpufleet.facts.gather import Facts
from gpufleet.facts.watch import Reading, reading
from gpufleet.inventory.model import Inventory
from gpufleet.provision.engine import HostRun
from gpufleet.provision.plan import Change

SCHEMA = "gpufleet.drift/1"
CONSISTENCY_ROLE = "consistency"
WATCH_ROLE = "watch"
WATCH_DESIRED = "no open finding"
WATCH_STOPPED = "stopped"
CONFIGURATION = "configuration"
"""The class of a consistency item: a node set up unlike the rest of its group."""


@dataclass
class DriftItem:
    """One thing that differs on one host."""

    host: str
    role: str
    resource: str
    kind: str
    desired: str | None
    actual: str | None
    diff: str | None = None
    reboot_required: bool = False
    new: bool = False
    manual: bool = False  # an operator must make the change (provisioning cannot)
    finding_class: str | None = None  # configuration | performance | hardware, where known

    @property
    def item(self) -> str:
        return f"{self.role}/{self.resource}"

    @property
    def key(self) -> str:
        """Identity across runs, for new/resolved."""
        return f"{self.host} {self.item}"

    def to_dict(self) -> dict[str, Any]:
        return {"item": self.item, "role": self.role, "resource": self.resource,
                "kind": self.kind, "desired": self.desired, "actual": self.actual,
                "diff": self.diff, "reboot_required": self.reboot_required, "new": self.new,
                "finding_class": self.finding_class}


def item_from_change(host: str, change: Change) -> DriftItem:
    return DriftItem(host, change.role, change.resource, change.kind, change.after,
                     change.before, change.diff, change.pending_reboot, manual=change.manual,
                     finding_class=change.finding_class)


@dataclass
class HostDrift:
    """A host's drift: its items, or why it could not be checked; ``timed_out`` names the
    facts whose tool did not answer in time (a hung nvidia-smi), with the reason; ``watch``:
    the standing watch's report (None where the watch is not in use)."""

    host: str
    status: str  # clean | drifted | unreachable | error
    items: list[DriftItem] = field(default_factory=list)
    error: str | None = None
    duration: float = 0.0
    round_trips: int = 0
    timed_out: dict[str, str] = field(default_factory=dict)
    watch: Reading | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "error": self.error,
                "duration_s": round(self.duration, 3), "round_trips": self.round_trips,
                "items": [i.to_dict() for i in self.items],
                "facts_timed_out": self.timed_out,
                "watch": None if self.watch is None else self.watch.to_dict()}

    def watch_notes(self) -> list[str]:
        """What the report says of the watch besides its open finding's item: the silenced
        findings, and why the report could not be read."""
        if self.watch is None:
            return []
        if self.watch.report is None:
            return [f"watch report unknown: {self.watch.unknown}"]
        return [f"watch: {line}" for line in self.watch.report.silences()]


@dataclass
class Inconsistency:
    """Hosts of a group that disagree on one value."""

    group: str
    key: str
    values: dict[str, list[str]]
    majority: str | None

    @property
    def outliers(self) -> list[str]:
        return sorted(h for v, hosts in self.values.items() if v != self.majority for h in hosts)

    def to_dict(self) -> dict[str, Any]:
        return {"group": self.group, "key": self.key, "values": self.values,
                "majority": self.majority, "outliers": self.outliers}


def consistency_groups(inventory: Inventory, hosts: Sequence[str]) -> list[str]:
    """Groups compared for consistency: every group with two or more selected hosts,
    except ``all`` and ``ungrouped`` (unless the inventory has no other group)."""
    selected = set(hosts)
    named = [g for g, members in inventory.groups.items()
             if g not in ("all", "ungrouped") and len(members & selected) >= 2]
    if named:
        return sorted(named)
    return ["all"] if len(selected) >= 2 else []


def check_consistency(inventory: Inventory, facts: dict[str, Facts]) -> list[Inconsistency]:
    """Values that differ between hosts of a group, with the majority value and outliers."""
    found: list[Inconsistency] = []
    values = {host: role_registry.comparable(f, inventory.hosts[host]) for host, f in facts.items()}
    for group in consistency_groups(inventory, list(facts)):
        members = sorted(h for h in inventory.groups[group] if h in values)
        keys = sorted({k for h in members for k in values[h]})
        for key in keys:
            by_value: dict[str, list[str]] = {}
            for host in members:
                by_value.setdefault(values[host].get(key, "absent"), []).append(host)
            if len(by_value) < 2:
                continue
            counts = Counter({v: len(h) for v, h in by_value.items()}).most_common()
            majority = counts[0][0] if counts[0][1] > counts[1][1] else None
            found.append(Inconsistency(group, key, dict(sorted(by_value.items())), majority))
    return found


def host_drift(outcome: Outcome[HostRun], max_age_s: float | None = None) -> HostDrift:
    """A host's drift from its outcome in check mode; ``max_age_s``: the age past which
    its watch's report says the watch stopped running (None: not judged)."""
    run = outcome.value
    if outcome.status == "unreachable":
        return HostDrift(outcome.host, "unreachable", error=outcome.error,
                         duration=outcome.duration, round_trips=outcome.round_trips)
    if outcome.status in ("failed", "skipped") or run is None or run.plan is None:
        return HostDrift(outcome.host, "error", error=outcome.error or "no plan",
                         duration=outcome.duration, round_trips=outcome.round_trips)
    items = [item_from_change(outcome.host, c) for c in run.plan.changes]
    timed_out = {name: run.facts.why_absent(name) for name in sorted(run.facts.timeouts)} \
        if run.facts else {}
    read = reading(run.facts, max_age_s) if run.facts else None
    if read is not None and (found := watch_item(outcome.host, read)):
        items.append(found)
    return HostDrift(outcome.host, "drifted" if items else "clean", items,
                     duration=outcome.duration, round_trips=outcome.round_trips,
                     timed_out=timed_out, watch=read)


def watch_item(host: str, read: Reading) -> DriftItem | None:
    """The one item of a node whose watch stopped running (``watch/stopped``: its report
    is older than the bound, the age and the open findings of that old report named) or
    has an open finding (named after the first, with how many are open); a silenced or
    pending finding, or a report that could not be read, makes none."""
    report = read.report
    if report is None:
        return None
    found = report.open
    stale = read.stale
    if stale is not None:
        opened = f"; it had {len(found)} open: {found[0].message}" if found else ""
        return DriftItem(host, WATCH_ROLE, WATCH_STOPPED, WATCH_ROLE,
                         f"a report at most {read.max_age_s:g} s old", stale + opened)
    if not found:
        return None
    return DriftItem(host, WATCH_ROLE, found[0].id, WATCH_ROLE, WATCH_DESIRED,
                     f"{len(found)} open: {found[0].message}")


def add_consistency_items(drift: dict[str, HostDrift], inconsistencies: list[Inconsistency],
                          managed: dict[str, set[str]]) -> None:
    """Each outlier host gets one item per value it does not share with its group, unless
    a role that manages that value on the host already reports it (``managed``: host ->
    active role names)."""
    for inc in inconsistencies:
        for value, hosts in inc.values.items():
            if value == inc.majority:
                continue
            for host in hosts:
                if role_registry.owner_of(inc.key) in managed.get(host, set()):
                    continue
                entry = drift[host]
                entry.items.append(DriftItem(
                    host, CONSISTENCY_ROLE, f"{inc.key} in group {inc.group}", "consistency",
                    inc.majority or "one value across the group", value,
                    finding_class=CONFIGURATION))
                if entry.status == "clean":
                    entry.status = "drifted"


def mark_new(drift: dict[str, HostDrift], previous: dict[str, set[str]],
             checked_roles: set[str] | None = None) -> tuple[list[str], list[str]]:
    """Flag items a host did not have when it was last checked; return (new, resolved) keys.

    ``previous`` maps a host to the items of its last checked run (hosts never checked
    before are absent: all their items are new). A host that could not be checked now
    resolves nothing, and neither does a role this run did not check (``checked_roles``;
    all when None): their old items stay open.
    """
    new: list[str] = []
    resolved: list[str] = []
    for host, entry in drift.items():
        before = previous.get(host, set())
        if checked_roles is not None:
            before = {i for i in before
                      if i.split("/", 1)[0] in checked_roles | {CONSISTENCY_ROLE, WATCH_ROLE}}
        if entry.status not in ("clean", "drifted"):
            continue
        now = {i.item for i in entry.items}
        for item in entry.items:
            item.new = item.item not in before
        new += [f"{host} {i}" for i in sorted(now - before)]
        resolved += [f"{host} {i}" for i in sorted(before - now)]
    return new, resolved
