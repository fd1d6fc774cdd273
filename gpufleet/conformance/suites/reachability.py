"""The reachability suite: real TCP connects between nodes."""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.conformance.registry import Suite, setting
from gpufleet.conformance.suites.common import (
    Counters,
    Probe,
    Range,
    check_counters,
    check_range,
)
from gpufleet.provision.role import RoleVars


@dataclass(frozen=True, kw_only=True)
class ReachabilitySettings(Counters, Probe, Range):
    """What the reachability suite reads."""

    firewall_enabled: bool = setting(False, "boolean", "gpufleet manages the firewall")
    reachability_range_samples: int = setting(3, "integer",
                                              "evenly spaced ports of the range per pair")
    reachability_random_ports: int = setting(128, "integer",
                                             "random ports of the range per target")
    reachability_seed: int | None = setting(None, "integer",
                                            "seed of the random ports (default: new each run)")


def _check(v: RoleVars) -> None:
    check_range(v)
    check_counters(v)


SUITE = Suite(
    "reachability", ("conformance",),
    "real TCP connects between nodes on the rendezvous port and across the range",
    order=30,
    settings=ReachabilitySettings,
    cross_node=frozenset({"reachable_from_the_cluster", "nic_counters_during_reachability"}),
    with_peer=frozenset({"reachable_from_the_cluster"}),
    check=_check)
