"""PCIe paths on a lab of its own, three nodes, none provisioned: each node has the stand-in PCI
tree of an HGX-like board and ``setpci`` over it (tests/lab/fakepci.py), which the pcie suite
and the pcie role read through ``pcie_sys_root``. The clean lab passes the suite; then ACS on
a switch port between a GPU and its NIC (node01), the IOMMU in translation mode (node02) and
a NIC trained at x8 (node03) each fail their node's check alone, naming the node and the
device; the pcie role, converged on node01 alone, clears its ACS (lab nodes run no systemd:
the boot unit is the role's unit tests').
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpufleet import app
from gpufleet.drift.run import DriftOptions, check_fleet
from gpufleet.inventory.load import load_inventory
from gpufleet.inventory.target import Target
from gpufleet.lab.cluster import Lab
from gpufleet.provision.engine import RunOptions, provision
from gpufleet.roles import pcie
from tests.lab import fakepci
from tests.lab.conftest import lab_up, node_sh

NODES = ("node01", "node02", "node03")
LIMIT = ":".join(NODES)
CHECKS = ("acs_off_between_gpus_and_nics", "iommu_passthrough", "links_as_capable")


@pytest.fixture(scope="module")
def pcie_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """Three nodes with the stand-in tree, the suite and role pointed at it."""
    with lab_up(tmp_path_factory, "pc", 20, len(NODES)) as lab:
        (lab.config.inventory_dir / "group_vars" / "lab.yml").write_text(yaml.safe_dump({
            "pcie_sys_root": fakepci.ROOT}))
        for node in NODES:
            fakepci.install(lab, node)
        yield lab


def run_suite(lab: Lab, tmp_path: Path, name: str) -> tuple[int, dict[tuple[str, str],
                                                                      dict[str, Any]]]:
    report = tmp_path / f"{name}.json"
    code = app.conformance_cmd(str(lab.config.inventory_dir), limit=LIMIT, suites="pcie",
                               json_path=str(report))
    doc = json.loads(report.read_text())
    return code, {(r["host"], r["check"].removeprefix("test_")): r for r in doc["results"]}


def outcomes(results: dict[tuple[str, str], dict[str, Any]], check: str) -> dict[str, str]:
    return {node: results[(node, check)]["outcome"] for node in NODES}


@pytest.fixture
def faults(pcie_lab: Lab) -> Iterator[None]:
    """ACS on node01's switch port above its second NIC; node02's IOMMU translating (its
    groups DMA-FQ, ``intel_iommu=on`` without ``iommu=pt``); node03's second NIC at x8."""
    fakepci.write(pcie_lab, "node01", fakepci.device_dir("0000:82:01.0") + "/lab-acs-ctl",
                  fakepci.ACS_ON)
    for address in (*fakepci.GPUS, *fakepci.NICS):
        fakepci.write(pcie_lab, "node02", fakepci.device_dir(address) + "/iommu_group/type",
                      "DMA-FQ")
    fakepci.write(pcie_lab, "node02", "proc/cmdline",
                  "BOOT_IMAGE=/boot/vmlinuz ro intel_iommu=on")
    fakepci.write(pcie_lab, "node03",
                  fakepci.device_dir("0000:84:00.0") + "/current_link_width", "8")
    try:
        yield
    finally:
        for node in NODES:
            node_sh(pcie_lab, node, fakepci.install_command())


def test_the_clean_lab_passes(pcie_lab: Lab, tmp_path: Path) -> None:
    code, results = run_suite(pcie_lab, tmp_path, "clean")
    assert code == 0, {k: r.get("message") for k, r in results.items() if r["outcome"] != "pass"}
    for check in CHECKS:
        assert set(outcomes(results, check).values()) == {"pass"}, check
    assert outcomes(results, "nic_device_control") == dict.fromkeys(NODES, "skip")
    assert results[("node01", "acs_off_between_gpus_and_nics")]["properties"][
        "gpu_nic_paths"] == {"0000:03:00.0": ["0000:04:00.0"], "0000:83:00.0": ["0000:84:00.0"]}


def test_each_fault_fails_its_node_alone_naming_it(pcie_lab: Lab, faults: None,
                                                   tmp_path: Path) -> None:
    code, results = run_suite(pcie_lab, tmp_path, "faults")
    assert code == 1
    expected = {"acs_off_between_gpus_and_nics": "node01", "iommu_passthrough": "node02",
                "links_as_capable": "node03"}
    for check, node in expected.items():
        assert outcomes(results, check) == {n: "fail" if n == node else "pass"
                                            for n in NODES}, check
        assert results[(node, check)]["properties"]["finding_class"] == (
            "hardware" if check == "links_as_capable" else "configuration")
    acs = results[("node01", "acs_off_between_gpus_and_nics")]["message"]
    assert acs.startswith("node01: GPU 0000:83:00.0 -> switch 0000:81:00.0 -> NIC "
                          "0000:84:00.0: ACS ReqRedir+ CmpltRedir+ on port 0000:82:01.0, "
                          "expected ReqRedir- CmpltRedir- EgressCtrl-"), acs
    assert "pcie_acs_disable" in acs
    iommu = results[("node02", "iommu_passthrough")]["message"]
    assert iommu.startswith("node02: IOMMU in translation mode for GPU 0000:03:00.0 (DMA-FQ)"), \
        iommu
    assert "intel_iommu=on" in iommu and "pcie_iommu_passthrough" in iommu
    link = results[("node03", "links_as_capable")]["message"]
    assert link.startswith("node03: NIC 0000:84:00.0: link x8, capable of x16"), link


def test_the_role_clears_acs_on_its_node(pcie_lab: Lab, tmp_path: Path) -> None:
    fakepci.write(pcie_lab, "node01", fakepci.device_dir("0000:02:01.0") + "/lab-acs-ctl",
                  fakepci.ACS_ON)
    try:
        vars_file = pcie_lab.config.inventory_dir / "host_vars" / "node01.yml"
        vars_file.parent.mkdir(exist_ok=True)
        vars_file.write_text(yaml.safe_dump({"pcie_acs_disable": True}))
        inventory = load_inventory(pcie_lab.config.inventory_dir)
        hosts = check_fleet(Target.select(inventory, LIMIT),
                            DriftOptions(roles=[pcie.ROLE])).hosts
        drifted = {n: [i.item for i in h.items] for n, h in hosts.items() if h.status != "clean"}
        assert drifted == {"node01": ["pcie/acs 0000:02:01.0"]}, drifted  # no systemd: no unit
        outcome = provision(inventory, inventory.select("node01"), [pcie.ROLE], RunOptions())
        assert {o.status for o in outcome.values()} == {"changed"}, outcome
        word = node_sh(pcie_lab, "node01", f"cat {fakepci.ROOT}/"
                       f"{fakepci.device_dir('0000:02:01.0')}/lab-acs-ctl").strip()
        assert word == "0011"  # SrcValid and UpstreamFwd kept, the redirects cleared
        code, results = run_suite(pcie_lab, tmp_path, "role")
        assert code == 0, {k: r.get("message") for k, r in results.items()
                           if r["outcome"] == "fail"}
    finally:
        (pcie_lab.config.inventory_dir / "host_vars" / "node01.yml").unlink(missing_ok=True)
        node_sh(pcie_lab, "node01", fakepci.install_command())
