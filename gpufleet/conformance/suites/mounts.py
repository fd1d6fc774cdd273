"""The mounts suite: the shared filesystems mounted alike on every node."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpufleet.conformance.checks import mounts as mounts_checks
from gpufleet.conformance.registry import Settings, Suite, declared
from gpufleet.errors import GpufleetError
from gpufleet.facts.gather import FactRequest
from gpufleet.inventory.model import Host
from gpufleet.provision.role import RoleVars, Var

SHARED_MOUNTS = Var(None, "list", "[{path, fstype, source, options, writable}]")


@dataclass(frozen=True, kw_only=True)
class MountsSettings(Settings):
    """What the mounts suite reads."""

    shared_mounts: list[Any] | None = declared(SHARED_MOUNTS)


def check_shared_mounts(v: RoleVars) -> None:
    """``shared_mounts`` as declared, its error naming the file and line it came from."""
    try:
        mounts_checks.declared(v.get("shared_mounts"), f"host {v.host.name}: shared_mounts")
    except ValueError as exc:
        where = v.host.origin("shared_mounts") if "shared_mounts" in v.host.vars else None
        raise GpufleetError(str(exc) + (f" ({where})" if where else "")) from None


def _facts(host: Host) -> FactRequest:
    return FactRequest(custom=frozenset({mounts_checks.MOUNTINFO}))


SUITE = Suite(
    "mounts", ("acceptance",),
    "the shared filesystems mounted alike on every node, and the same filesystem",
    order=120,
    settings=MountsSettings,
    cross_node=frozenset({"same_filesystem", "mounts_agree_within_each_group"}),
    facts=_facts, check=check_shared_mounts)
