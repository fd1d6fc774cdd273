"""The allreduce suite: AllReduce bus bandwidth alone and together."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpufleet import roles
from gpufleet.conformance import container
from gpufleet.conformance.checks import allreduce as allreduce_checks
from gpufleet.conformance.registry import Suite, always, declared, setting
from gpufleet.conformance.suites.common import (
    Counters,
    Performance,
    Probe,
    Range,
    check_counters,
    check_performance,
    check_range,
    positive,
)
from gpufleet.provision.role import RoleVars

_VARS = allreduce_checks.VARIABLES


@dataclass(frozen=True, kw_only=True)
class AllreduceSettings(Probe, Range, Performance, Counters):
    """What the allreduce suite reads."""

    allreduce_sizes: list[str] | None = declared(_VARS["allreduce_sizes"])
    allreduce_iters: int | None = declared(_VARS["allreduce_iters"])
    allreduce_timeout_s: float = declared(_VARS["allreduce_timeout_s"])
    allreduce_bisect_timeout_s: float | None = declared(_VARS["allreduce_bisect_timeout_s"])
    allreduce_busbw_thresholds: dict[str, Any] | None = declared(
        _VARS["allreduce_busbw_thresholds"])
    allreduce_transport_intra: str = declared(_VARS["allreduce_transport_intra"])
    allreduce_transport_inter: str = declared(_VARS["allreduce_transport_inter"])
    allreduce_min_line_rate_fraction: float = declared(
        _VARS["allreduce_min_line_rate_fraction"])
    nic_line_rate_gbps: float | None = declared(_VARS["nic_line_rate_gbps"])
    nccl_tests_max_size: str = setting("1G", "string",
                                       "largest size of nccl-tests' all_reduce_perf")
    topology_domain: str | None = setting(None, "string", "the node's rack or leaf")
    topology_group_prefixes: list[str] | None = setting(
        None, "list", "inventory groups that are topology domains (default: rack, leaf)")


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
    settings=AllreduceSettings,
    cross_node=frozenset({"all_nodes_together", "nic_counters_during_allreduce"}),
    with_peer=frozenset({"all_nodes_together"}),
    required_when=always, records_baseline=True, check=_check,
    facts=roles.gpudirect_request)
