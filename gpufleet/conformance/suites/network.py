"""The network suite: one layer-2 domain, the fabric's MTU, round trips and jitter."""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.conformance.registry import Settings, Suite, setting
from gpufleet.conformance.suites.common import positive
from gpufleet.provision.role import RoleVars


@dataclass(frozen=True, kw_only=True)
class NetworkSettings(Settings):
    """What the network suite reads."""

    net_mtu: int | None = setting(None, "integer", "the fabric's MTU (default: the MTU most "
                                                   "nodes' inventory interfaces have)")
    net_max_rtt_us: float = setting(1000, "number", "smallest round trip allowed")
    net_max_jitter_us: float = setting(1000, "number", "spread of the round trips allowed "
                                                       "(10th to 90th percentile)")
    net_ping_count: int = setting(10, "integer", "echoes per pair")


def _check(v: RoleVars) -> None:
    for key in ("net_max_rtt_us", "net_max_jitter_us"):
        positive(v, key)
    if not 1 <= v.integer("net_ping_count") <= 1000:
        raise v.fail("net_ping_count", "an integer from 1 to 1000", v.get("net_ping_count"))
    mtu = v.get("net_mtu")
    if mtu is not None and not 576 <= v.integer("net_mtu") <= 65535:
        raise v.fail("net_mtu", "an MTU from 576 to 65535", mtu)


SUITE = Suite(
    "network", ("acceptance",),
    "one layer-2 domain, the fabric's MTU on every path, round trips and jitter",
    order=130,
    settings=NetworkSettings,
    cross_node=frozenset({"one_layer2_domain", "path_mtu", "round_trip_time"}),
    check=_check)
