"""The watch suite: the standing watch on each node has no open finding, and still runs."""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet import roles
from gpufleet.conformance.registry import Settings, Suite, declared
from gpufleet.conformance.suites.common import positive
from gpufleet.provision.role import RoleVars


@dataclass(frozen=True, kw_only=True)
class WatchSettings(Settings):
    """What the watch suite reads (drift reads the same variable)."""

    watch_max_age_s: float = declared(roles.WATCH_MAX_AGE)


def _check(v: RoleVars) -> None:
    positive(v, "watch_max_age_s")


SUITE = Suite(
    "watch", ("conformance",),
    "the standing watch's report: no open finding on the node (silenced ones shown), and "
    "not older than watch_max_age_s",
    order=65, settings=WatchSettings, check=_check)
