"""The clock suite: each node's clock synchronised and near its time source."""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet import roles
from gpufleet.conformance.checks import clock as clock_checks
from gpufleet.conformance.registry import Settings, Suite, declared
from gpufleet.facts.gather import FactRequest
from gpufleet.inventory.model import Host
from gpufleet.provision.role import RoleVars


@dataclass(frozen=True, kw_only=True)
class ClockSettings(Settings):
    """What the clock suite reads: the bound the node's health check holds it to too."""

    time_max_offset_ms: float = declared(roles.clock_settings()["time_max_offset_ms"])
    time_check_offset: bool = declared(roles.clock_settings()["time_check_offset"])


def _check(v: RoleVars) -> None:
    if not v.number("time_max_offset_ms") > 0:
        raise v.fail("time_max_offset_ms", "a number of milliseconds above 0",
                     v.get("time_max_offset_ms"))


def _facts(host: Host) -> FactRequest:
    return FactRequest(custom=frozenset({clock_checks.TIMESYNC}))


SUITE = Suite(
    "clock", ("conformance",),
    "the clock synchronised (chrony or systemd-timesyncd) and within time_max_offset_ms of "
    "its source",
    order=15,
    settings=ClockSettings,
    facts=_facts,
    check=_check)
