"""The rdma suite: RoCE QoS on the node's RDMA devices."""

from __future__ import annotations

from gpufleet.conformance.registry import Suite
from gpufleet.facts.gather import Facts
from gpufleet.inventory.model import Host
from gpufleet.provision.role import Var


def _has_rdma(host: Host, facts: Facts | None) -> bool:
    return bool(facts and facts.get("rdma"))


SUITE = Suite(
    "rdma", ("conformance",),
    "RoCE QoS: PFC, trust, DSCP map and ECN on the RoCE priority; discards",
    order=50,
    variables={"rdma": Var(None, "mapping", "{pfc_priority, trust, ecn}"),
               "rdma_max_discards": Var(None, "integer", "discards allowed")},
    required_when=_has_rdma)
