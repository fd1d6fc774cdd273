"""The allreduce suite: AllReduce bus bandwidth alone and together."""

from __future__ import annotations

from gpufleet.conformance import container
from gpufleet.conformance.checks import allreduce as allreduce_checks
from gpufleet.conformance.registry import Suite, always
from gpufleet.conformance.suites.common import (
    COUNTERS,
    PERFORMANCE,
    RANGE,
    check_counters,
    check_performance,
    check_range,
    positive,
    probe_variables,
)
from gpufleet.provision.role import RoleVars, Var


def _check(v: RoleVars) -> None:
    check_performance(v)
    check_range(v)
    check_counters(v)
    allreduce_checks.check_choices(v)
    container.check(v)
    if not 0 < v.number("allreduce_min_line_rate_fraction") <= 1:
        raise v.fail("allreduce_min_line_rate_fraction", "a number above 0, at most 1",
                     v.get("allreduce_min_line_rate_fraction"))
    if v.get("nic_line_rate_gbps") is not None:
        positive(v, "nic_line_rate_gbps")


SUITE = Suite(
    "allreduce", ("conformance",),
    "AllReduce bus bandwidth on each node alone and on all nodes together",
    order=40,
    variables={**allreduce_checks.VARIABLES, **probe_variables(), **RANGE,
               **PERFORMANCE, **COUNTERS,
               "nccl_tests_max_size": Var("1G", "string",
                                          "largest size of nccl-tests' all_reduce_perf"),
               "topology_domain": Var(None, "string", "the node's rack or leaf"),
               "topology_group_prefixes": Var(None, "list",
                                              "inventory groups that are topology "
                                              "domains (default: rack, leaf)")},
    cross_node=frozenset({"all_nodes_together", "nic_counters_during_allreduce"}),
    with_peer=frozenset({"all_nodes_together"}),
    required_when=always, records_baseline=True, check=_check)
