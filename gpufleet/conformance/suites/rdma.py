"""The rdma suite: RoCE QoS on the node's RDMA devices."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpufleet.conformance.registry import Settings, Suite, setting
from gpufleet.facts.gather import Facts
from gpufleet.inventory.model import Host


@dataclass(frozen=True, kw_only=True)
class RdmaSettings(Settings):
    """What the rdma suite reads."""

    rdma: dict[str, Any] | None = setting(None, "mapping", "{pfc_priority, trust, ecn}")
    rdma_max_discards: int | None = setting(None, "integer", "discards allowed")


def _has_rdma(host: Host, facts: Facts | None) -> bool:
    return bool(facts and facts.get("rdma"))


SUITE = Suite(
    "rdma", ("conformance",),
    "RoCE QoS: PFC, trust, DSCP map and ECN on the RoCE priority; discards",
    order=50,
    settings=RdmaSettings,
    required_when=_has_rdma)
