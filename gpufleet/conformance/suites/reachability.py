"""The reachability suite: real TCP connects between nodes."""

from __future__ import annotations

from gpufleet.conformance.registry import Suite
from gpufleet.conformance.suites.common import (
    COUNTERS,
    RANGE,
    check_counters,
    check_range,
    probe_variables,
)
from gpufleet.provision.role import RoleVars, Var


def _check(v: RoleVars) -> None:
    check_range(v)
    check_counters(v)


SUITE = Suite(
    "reachability", ("conformance",),
    "real TCP connects between nodes on the rendezvous port and across the range",
    order=30,
    variables={
        **RANGE, **probe_variables(),
        "firewall_enabled": Var(False, "boolean", "gpufleet manages the firewall"),
        "reachability_range_samples": Var(3, "integer",
                                          "evenly spaced ports of the range per pair"),
        "reachability_random_ports": Var(128, "integer",
                                         "random ports of the range per target"),
        "reachability_seed": Var(None, "integer",
                                 "seed of the random ports (default: new each run)"),
        **COUNTERS,
    },
    cross_node=frozenset({"reachable_from_the_cluster", "nic_counters_during_reachability"}),
    with_peer=frozenset({"reachable_from_the_cluster"}),
    check=_check)
