"""The firewall suite: the live ruleset admits the cluster."""

from __future__ import annotations

from gpufleet.conformance.registry import Suite, always
from gpufleet.conformance.suites.common import positive
from gpufleet.provision.role import RoleVars, Var


def _check(v: RoleVars) -> None:
    positive(v, "firewall_read_timeout_s")


SUITE = Suite(
    "firewall", ("conformance",),
    "the live ruleset admits the cluster to the rendezvous port and NCCL's range",
    order=20,
    variables={"firewall_read_timeout_s": Var(
        60, "number", "longest the node may take to list its ruleset (bounded by "
                      "what is left of the host's budget)")},
    required_when=always, check=_check)
