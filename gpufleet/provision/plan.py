"""The plan model: the changes that take a host from its facts to its desired state.

Provisioning applies a plan, drift reports it, bootstrap applies and certifies it:
one computation, three uses. A change names a resource with its value before and
after, and the steps that make it so; a step shared by several changes (one apt
transaction for two packages) runs once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from gpufleet.connect.connection import Connection, Unreachable
from gpufleet.errors import GpufleetError
from gpufleet.inventory.model import Host


@dataclass
class ApplyOptions:
    """Choices that change how a plan is applied."""

    reboot: bool = False
    lock_timeout_s: int = 300
    reboot_timeout_s: int = 900


@dataclass
class ApplyContext:
    """What steps see while applying on one host; ``applied`` grows as changes complete,
    so that a host cut off mid-run still reports what it had applied."""

    conn: Connection
    host: Host
    options: ApplyOptions
    memo: dict[str, Any] = field(default_factory=dict)
    log: list[str] = field(default_factory=list)
    applied: list[Change] = field(default_factory=list)

    def reconnect(self) -> Connection:
        """A new connection to the host, under the same budget (refused once cut off)."""
        return self.conn.reopen()


class Step(Protocol):
    """One action on a host."""

    def describe(self) -> str: ...
    def apply(self, ctx: ApplyContext) -> None: ...


@dataclass(eq=False)
class Run:
    """Run a shell command that must succeed."""

    command: str
    description: str
    timeout: float = 600.0

    def describe(self) -> str:
        return self.description

    def apply(self, ctx: ApplyContext) -> None:
        ctx.conn.run(self.command, timeout=self.timeout).check(self.description)


@dataclass(eq=False)
class Put:
    """Write a file atomically, keeping a backup of the previous content."""

    path: str
    content: bytes
    mode: int = 0o644
    owner: str = "root:root"

    def describe(self) -> str:
        return f"write {self.path}"

    def apply(self, ctx: ApplyContext) -> None:
        ctx.conn.put(self.path, self.content, mode=self.mode, owner=self.owner)


@dataclass(eq=False)
class Fail:
    """A difference gpufleet cannot fix on its own (a preinstalled driver, a toolkit from
    elsewhere): applying it fails the host with ``message``."""

    message: str

    def describe(self) -> str:
        return "needs an operator"

    def apply(self, ctx: ApplyContext) -> None:
        raise GpufleetError(self.message)


MANUAL = "manual"
"""The action of a change gpufleet reports but never applies: a setting of a file the site
owns (slurm.conf), which an operator changes. Such a change has no steps; provisioning
shows it and goes on, drift reports it, and it stays until the operator has made it."""


@dataclass
class Change:
    """One resource that differs from its desired state, and how to fix it. ``kind`` (for
    reports: package, hold, file, link, sysctl, reboot ...) defaults to the resource's first
    word. A change whose action is :data:`MANUAL` has no steps. ``finding_class``: what kind
    of finding the change is, where the role says (``configuration``, ``performance``,
    ``hardware``), carried into drift's items."""

    role: str
    resource: str
    action: str
    before: str | None
    after: str | None
    steps: list[Step] = field(default_factory=list)
    diff: str | None = None
    pending_reboot: bool = False
    kind: str = ""
    finding_class: str | None = None

    def __post_init__(self) -> None:
        if not self.kind:  # "package libnccl2" is of kind package, "file /etc/x" of kind file
            self.kind = self.resource.split(" ", 1)[0]
        if self.manual and self.steps:
            raise ValueError(f"{self.item}: a manual change has no steps")

    @property
    def manual(self) -> bool:
        """Whether an operator must make this change (gpufleet only reports it)."""
        return self.action == MANUAL

    @property
    def item(self) -> str:
        """A stable identifier for history and metrics: ``role/resource``."""
        return f"{self.role}/{self.resource}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "resource": self.resource,
            "item": self.item,
            "action": self.action,
            "desired": self.after,
            "actual": self.before,
            "diff": self.diff,
            "reboot_required": self.pending_reboot,
        }


@dataclass
class Plan:
    """The ordered changes for one host."""

    host: str
    changes: list[Change] = field(default_factory=list)
    roles: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.changes

    @property
    def reboot_required(self) -> bool:
        return any(c.pending_reboot for c in self.changes)

    @property
    def applicable(self) -> list[Change]:
        """The changes provisioning applies: every one but the manual ones."""
        return [c for c in self.changes if not c.manual]

    def steps(self) -> list[tuple[Change, Step]]:
        """Each step once, with the first change that asked for it, in plan order."""
        seen: set[int] = set()
        ordered: list[tuple[Change, Step]] = []
        for change in self.changes:
            for step in change.steps:
                if id(step) not in seen:
                    seen.add(id(step))
                    ordered.append((change, step))
        return ordered


class StepFailed(GpufleetError):
    """A step failed while applying; says which change, and what was applied before it."""

    def __init__(self, change: Change, step: Step, error: Exception,
                 applied: list[Change]) -> None:
        super().__init__(f"{change.item}: {step.describe()}: {error}")
        self.change = change
        self.applied = applied


class HostLost(Unreachable):
    """The host became unreachable while applying; carries what was applied before."""

    def __init__(self, change: Change, step: Step, error: Exception,
                 applied: list[Change]) -> None:
        super().__init__(f"{change.item}: {step.describe()}: {error}")
        self.applied = applied


def apply_plan(plan: Plan, ctx: ApplyContext) -> list[Change]:
    """Apply every step in order; return the changes whose steps all ran (also kept in
    ``ctx.applied`` as they complete).

    Stops at the first failing step: later changes may depend on it, and a
    half-converged host is reported as failed, never hidden.
    """
    finished: set[int] = set()
    done: set[int] = {id(c) for c in ctx.applied}
    for change, step in plan.steps():
        try:
            step.apply(ctx)
        except Unreachable as exc:
            raise HostLost(change, step, exc, list(ctx.applied)) from exc
        except GpufleetError as exc:
            raise StepFailed(change, step, exc, list(ctx.applied)) from exc
        finished.add(id(step))
        ctx.log.append(f"{change.item}: {step.describe()}")
        for completed in plan.changes:
            if id(completed) not in done and completed.steps and \
                    all(id(s) in finished for s in completed.steps):
                done.add(id(completed))
                ctx.applied.append(completed)
    return list(ctx.applied)
