"""fabric: the node's RDMA ports that NCCL may use (NCCL_IB_HCA of nccl_env; all when unset)
against the ports its group declares: at least rdma_port_count ACTIVE, each at
rdma_port_rate_gbps, of width rdma_port_width, link layer rdma_port_link_layer, holding
partition key rdma_port_pkey (index 0 or 1). Unset, they take the GPU model's defaults: an
HGX H100/H200 (8 SXM GPUs) with InfiniBand ports has 8 ACTIVE 400 Gb/s 4X InfiniBand ports
(NVIDIA DGX H100/H200 User Guide; DGX BasePOD Reference Architecture). Elsewhere nothing is
declared and nothing is checked (skipped, saying why). The rail plan (rdma_rails: {GPU0:
mlx5_0, ...}) is checked against nvidia-smi topo -m: each GPU's NIC among those nearest it.

Variables: rdma_port_count, rdma_port_rate_gbps, rdma_port_width, rdma_port_link_layer,
rdma_port_pkey, rdma_rails (none; defaults per GPU model), rdma_sys_root (/sys).
"""

from __future__ import annotations

import pytest

from gpufleet.conformance.checks.fabric import (
    finding_class,
    judged_ports,
    port_findings,
    port_name,
    rail_findings,
)
from gpufleet.conformance.session import Node, RecordProperty
from gpufleet.conformance.suites.fabric import FabricSettings, declared, ports_fact


def _hca(node: Node) -> str:
    return str((node.var("nccl_env") or {}).get("NCCL_IB_HCA") or "")


def test_fabric_ports(node: Node, record_property: RecordProperty) -> None:
    settings = node.typed(FabricSettings)
    name = ports_fact(settings)
    ports = node.known.get(name)
    if ports is None:
        record_property("finding_class", "hardware")
        pytest.fail(f"{node.name}: RDMA ports unknown: {node.known.why_absent(name)}")
    judged = judged_ports(ports, _hca(node))
    decl = declared(settings, node.facts, judged)
    record_property("ports", {port_name(p): {k: p.get(k) for k in (
        "state", "phys_state", "rate_gbps", "width", "link_layer", "pkeys")} for p in judged})
    if decl.empty():
        pytest.skip(f"no fabric ports declared: {decl.note}")
    record_property("declared", {k: getattr(decl, k) for k in decl.origin})
    if decl.source:
        record_property("default_source", decl.source)
    rails = settings.rdma_rails or {}
    expected = sorted({str(n) for n in rails.values() if not str(n).startswith("NIC")})
    findings = port_findings(judged, decl, expected, named=bool(_hca(node)))
    if findings:
        record_property("finding_class", finding_class(findings))
    assert not findings, f"{node.name}: " + "; ".join(f.text for f in findings)


def test_rail_plan(node: Node, record_property: RecordProperty) -> None:
    settings = node.typed(FabricSettings)
    rails = settings.rdma_rails
    if not rails:
        pytest.skip("no rail plan declared (rdma_rails: {GPU0: mlx5_0, ...})")
    topology = node.known.get("gpu_topology")
    if topology is None:
        record_property("finding_class", "hardware")
        pytest.fail(f"{node.name}: GPU topology unknown: "
                    f"{node.known.why_absent('gpu_topology')}")
    ports = node.known.get(ports_fact(settings)) or []
    findings = rail_findings({str(k): str(v) for k, v in rails.items()}, topology, ports)
    if findings:
        record_property("finding_class", finding_class(findings))
    assert not findings, f"{node.name}: " + "; ".join(f.text for f in findings)
