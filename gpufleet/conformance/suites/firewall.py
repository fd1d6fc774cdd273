"""The firewall suite: the live ruleset admits the cluster."""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.conformance.registry import Settings, Suite, always, setting
from gpufleet.conformance.suites.common import positive
from gpufleet.provision.role import RoleVars


@dataclass(frozen=True, kw_only=True)
class FirewallSettings(Settings):
    """What the firewall suite reads."""

    firewall_read_timeout_s: float = setting(
        60, "number", "longest the node may take to list its ruleset (bounded by what is left "
                      "of the host's budget)")


def _check(v: RoleVars) -> None:
    positive(v, "firewall_read_timeout_s")


SUITE = Suite(
    "firewall", ("conformance",),
    "the live ruleset admits the cluster to the rendezvous port and NCCL's range",
    order=20,
    settings=FirewallSettings,
    required_when=always, check=_check)
