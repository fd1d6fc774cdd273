"""pcie: PCIe peer-to-peer between each GPU and its nearest NICs, the IOMMU's mode, and
every GPU's and NIC's link as trained, read from the PCIe fact (sysfs, and ``setpci`` on the
bridges above the GPUs and NICs).

Variables: pcie_acs_check (true), pcie_iommu_passthrough (true), pcie_link_check (true),
pcie_nic_max_read_request (none), pcie_nic_relaxed_ordering (none), pcie_sys_root (/).
"""

from __future__ import annotations

from typing import Any

import pytest

from gpufleet.conformance.checks.pcie import (
    acs_problems,
    devctl_problems,
    iommu_problem,
    link_problems,
)
from gpufleet.conformance.session import Node, RecordProperty
from gpufleet.conformance.suites.pcie import PcieSettings
from gpufleet.facts.pcie import NAME, gpu_nic_paths


def _state(node: Node) -> dict[str, Any]:
    facts = node.known
    state: dict[str, Any] | None = facts.get(NAME)
    if state is None:
        pytest.fail(f"unknown: the PCIe fact: {facts.why_absent(NAME)}")
    return state


def _kinds(state: dict[str, Any]) -> set[str]:
    return {d["kind"] for d in state["devices"]}


def _fail(node: Node, record_property: RecordProperty, finding: str, problems: list[str],
          unknown: list[str]) -> None:
    """Fail naming the node and each device (``finding`` the failure's class); unknown
    where something could not be read."""
    if problems:
        record_property("finding_class", finding)
        pytest.fail(f"{node.name}: " + "; ".join(problems + unknown))
    if unknown:
        pytest.fail(f"unknown: {node.name}: " + "; ".join(unknown))


def test_acs_off_between_gpus_and_nics(node: Node, record_property: RecordProperty) -> None:
    if not node.typed(PcieSettings).pcie_acs_check:
        pytest.skip("pcie_acs_check is false")
    state = _state(node)
    if _kinds(state) != {"gpu", "nic"}:
        pytest.skip("not a node with both NVIDIA GPUs and RDMA NICs on its PCI bus")
    paths = gpu_nic_paths(state["devices"])
    nearest: dict[str, list[str]] = {}
    for path in paths:
        nearest.setdefault(path["gpu"], []).append(path["nic"])
    record_property("gpu_nic_paths", nearest)
    if not paths:
        pytest.skip("no GPU shares a PCIe switch with a NIC (their traffic crosses the "
                    "root complex)")
    problems, unknown = acs_problems(state)
    _fail(node, record_property, "configuration",
          [f"{p}, expected ReqRedir- CmpltRedir- EgressCtrl- (GPUDirect traffic goes up to "
           "the root complex; pcie_acs_disable: true clears them)" for p in problems], unknown)


def test_iommu_passthrough(node: Node, record_property: RecordProperty) -> None:
    if not node.typed(PcieSettings).pcie_iommu_passthrough:
        pytest.skip("pcie_iommu_passthrough is false")
    state = _state(node)
    if "gpu" not in _kinds(state):
        pytest.skip("no NVIDIA GPU on the PCI bus")
    record_property("iommus", state["iommus"])
    problem, unknown = iommu_problem(state)
    _fail(node, record_property, "configuration",
          [f"{problem} (pcie_iommu_passthrough)"] if problem else [],
          [unknown] if unknown else [])


def test_links_as_capable(node: Node, record_property: RecordProperty) -> None:
    if not node.typed(PcieSettings).pcie_link_check:
        pytest.skip("pcie_link_check is false")
    state = _state(node)
    if not state["devices"]:
        pytest.skip("no NVIDIA GPU or RDMA NIC on the PCI bus")
    record_property("links", {d["address"]: f"x{d['width']} {d['speed']} GT/s"
                              for d in state["devices"]})
    _fail(node, record_property, "hardware",
          [f"{p} (trained below its capability: reseat or replace; pcie_link_check)"
           for p in link_problems(state)], [])


def test_nic_device_control(node: Node, record_property: RecordProperty) -> None:
    settings = node.typed(PcieSettings)
    size, relaxed = settings.pcie_nic_max_read_request, settings.pcie_nic_relaxed_ordering
    if size is None and relaxed is None:
        pytest.skip("the inventory declares neither pcie_nic_max_read_request nor "
                    "pcie_nic_relaxed_ordering")
    state = _state(node)
    if "nic" not in _kinds(state):
        pytest.skip("no RDMA NIC on the PCI bus")
    problems, unknown = devctl_problems(state, size, relaxed)
    _fail(node, record_property, "configuration", problems, unknown)
