"""rdma: for each RoCE netdev (from /sys/class/infiniband), PFC on the RoCE priority only,
the trust mode, ECN (roce_np and roce_rp) on that priority, NCCL_IB_TC mapping to it, and
pause/discard counters. InfiniBand ports skip (PFC does not apply). Values that cannot
be read are "unknown" and fail; they are never taken as "off".

Variables: rdma: {pfc_priority: 3, trust: dscp, ecn: true}, rdma_max_discards (none),
nccl_env.NCCL_IB_TC.
"""

from __future__ import annotations

import pytest

from gpufleet.conformance.checks.rdma import problems
from gpufleet.conformance.measure.rdma import read_state
from gpufleet.conformance.session import Node, RecordProperty
from gpufleet.conformance.suites.rdma import RdmaSettings


def test_roce_qos(node: Node, record_property: RecordProperty) -> None:
    devices = node.known.get("rdma")
    if devices is None:
        pytest.fail(f"unknown: {node.known.why_absent('rdma')}")
    if not devices:
        pytest.skip("no RDMA devices (/sys/class/infiniband is empty)")
    roce = [d for d in devices if d["link_layer"] == "Ethernet"]
    if not roce:
        pytest.skip("link layer InfiniBand on every RDMA port: PFC does not apply")
    settings = node.typed(RdmaSettings)
    expected = settings.rdma or {}
    if not expected:
        pytest.skip("the inventory sets no rdma expectations (rdma: {pfc_priority, trust, ecn})")
    tc = (node.var("nccl_env") or {}).get("NCCL_IB_TC")
    found: list[str] = []
    max_discards = settings.rdma_max_discards
    for netdev in sorted({n for d in roce for n in d["netdevs"]}):
        state = read_state(node, netdev)
        record_property(f"{netdev}_tool", state.tool)
        record_property(f"{netdev}_counters", state.counters)
        found += problems(state, expected, int(tc) if tc is not None else None)
        discards = sum(v for k, v in state.counters.items() if "discard" in k)
        if max_discards is not None and discards > max_discards:
            found.append(f"{netdev}: {discards} discards, above {max_discards}")
    assert not found, "; ".join(found)
