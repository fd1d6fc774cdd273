"""The kernel a node boots and its clock, on a lab of their own: each fault injected on one
node fails (or drifts) that node alone, naming it.

Three nodes run the kernel role's stand-in kernel 6.1.0-27-amd64, pinned, provisioned with
a reboot into it, the driver's DKMS modules built for it by the dkms stand-in
(tests/lab/fakekernel.py); the lab shares the controller's clock, and each node's chronyc
stand-in replays a real chrony report a test can replace.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpufleet import app
from gpufleet.inventory.load import load_inventory
from gpufleet.lab.boot import CHRONY_REPORT, CHRONY_TRACKING
from gpufleet.lab.cluster import Lab
from gpufleet.provision.engine import RunOptions, provision
from gpufleet.provision.plan import ApplyOptions
from gpufleet.roles import kernel, nvidia_repo, slurm_healthcheck
from tests.conftest import FIXTURES, ROOT
from tests.lab import fakekernel
from tests.lab.conftest import lab_config_for, node_sh
from tests.lab.test_provision import override

NODES = ("node01", "node02", "node03")
K27, K28 = "6.1.0-27-amd64", "6.1.0-28-amd64"
PUBLISHED = FIXTURES / "published"
APT = "DEBIAN_FRONTEND=noninteractive apt-get -q -y -o Dpkg::Options::=--force-confold"


@pytest.fixture(scope="module")
def kernel_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """Three nodes booted into the pinned stand-in kernel, with the health check installed."""
    if os.geteuid() != 0:
        pytest.skip("lab tests need root: they create network namespaces and mounts")
    inventory_dir = tmp_path_factory.mktemp("kernel-inventory") / "lab"
    shutil.copytree(ROOT / "inventory" / "lab" / "group_vars", inventory_dir / "group_vars")
    (inventory_dir / "group_vars" / "lab.yml").write_text(yaml.safe_dump({
        "kernel_version": K27, "slurm_healthcheck": True}))
    lab = Lab(lab_config_for("kt", 15, inventory_dir))
    lab.down()
    lab.up(len(NODES))
    for node in NODES:
        fakekernel.install(lab, node)
    inventory = load_inventory(inventory_dir)
    outcomes = provision(inventory, inventory.select("lab"),
                         [nvidia_repo.ROLE, kernel.ROLE, slurm_healthcheck.ROLE],
                         RunOptions(apply=ApplyOptions(reboot=True)))
    assert {o.status for o in outcomes.values()} == {"changed"}, outcomes
    assert all(o.value and o.value.rebooted for o in outcomes.values()), outcomes
    assert {fakekernel.running(lab, n) for n in NODES} == {K27}
    yield lab
    lab.down()


def _drift(lab: Lab, tmp_path: Path, name: str) -> tuple[int, dict[str, Any]]:
    report = tmp_path / f"{name}.json"
    code = app.drift_cmd(str(lab.config.inventory_dir), roles="kernel",
                         outputs=app.DriftOutputs(json_path=str(report),
                                                  report_dir=str(tmp_path / "history")))
    return code, json.loads(report.read_text())


def _items(doc: dict[str, Any], host: str) -> dict[str, tuple[str, str]]:
    return {i["item"]: (i["actual"], i["desired"]) for i in doc["hosts"][host]["items"]}


@pytest.fixture
def clocks(kernel_lab: Lab) -> Iterator[None]:
    """node01 reports chrony with no server answering, node02 a clock 7.8 s slow; every
    node's report is the synchronised one again afterwards."""
    lines = (PUBLISHED / "chronyc-tracking-omnios-2576.txt").read_text().splitlines()
    slow = "\n".join(lines[next(i for i, line in enumerate(lines)
                                if line.startswith("Reference ID")):]) + "\n"
    unsynchronised = (PUBLISHED / "chronyc-n-tracking-4.3-debian12-unsynchronised.txt").read_text()
    for node, report in (("node01", unsynchronised), ("node02", slow)):
        _report(kernel_lab, node, report)
    try:
        yield
    finally:
        for node in NODES:
            _report(kernel_lab, node, CHRONY_TRACKING)


def _report(lab: Lab, node: str, text: str) -> None:
    """What ``node``'s chronyc stand-in reports from now on."""
    node_sh(lab, node, f"printf '%s' {shlex.quote(text)} > {CHRONY_REPORT}")


def test_a_clock_out_of_sync_fails_its_node_in_conformance_and_the_health_check(
        kernel_lab: Lab, clocks: None, tmp_path: Path) -> None:
    report = tmp_path / "clock.json"
    code = app.conformance_cmd(str(kernel_lab.config.inventory_dir), suites="clock",
                               json_path=str(report))
    results = {r["host"]: r for r in json.loads(report.read_text())["results"]}
    assert code == 1
    assert {n: results[n]["outcome"] for n in NODES} == {
        "node01": "fail", "node02": "fail", "node03": "pass"}, results
    assert "not synchronised (chrony from 00000000 ())" in results["node01"]["message"], \
        results["node01"]
    assert "-7810.5 ms off (chrony from D9723B42 (ns0.luns.net.uk)), beyond " \
           "time_max_offset_ms 100" in results["node02"]["message"], results["node02"]
    assert results["node03"]["properties"]["offset_ms"] == 0.003
    program = slurm_healthcheck.ROLE.defaults["slurm_healthcheck_path"]
    checked = {n: next(line for line in node_sh(kernel_lab, n, f"{program} --no-drain",
                                                check=False).splitlines()
                       if " time_sync: " in line) for n in NODES}
    assert checked == {
        "node01": "FAIL time_sync: not synchronised (chrony)",
        "node02": "FAIL time_sync: -7810.537 ms (chrony), beyond 100 ms",
        "node03": "PASS time_sync: +0.003 ms (chrony), within 100 ms"}


def test_a_kernel_installed_but_not_running_without_its_modules_drifts_its_node_only(
        kernel_lab: Lab, tmp_path: Path) -> None:
    """A routine upgrade on node02 takes a newer image and no headers: the next boot would
    run it, not the pin, and DKMS could not build the driver for it."""
    node_sh(kernel_lab, "node02", f"{APT} install linux-image-{K28}")
    try:
        code, doc = _drift(kernel_lab, tmp_path, "upgraded")
        assert code == 1
        assert {h: doc["hosts"][h]["status"] for h in NODES} == {
            "node01": "clean", "node02": "drifted", "node03": "clean"}
        assert _items(doc, "node02") == {
            "kernel/kernel next boot": (f"{K28} (the newest installed)", K27),
            f"kernel/module nvidia ({K28})": (
                "not built (modinfo: ERROR: Module nvidia not found.)", f"built for {K28}"),
            f"kernel/module nvidia-uvm ({K28})": (
                "not built (modinfo: ERROR: Module nvidia-uvm not found.)",
                f"built for {K28}")}
        assert fakekernel.running(kernel_lab, "node02") == K27
    finally:
        node_sh(kernel_lab, "node02", f"dpkg --purge linux-image-{K28}")
    code, doc = _drift(kernel_lab, tmp_path, "restored")
    assert code == 0, doc["hosts"]["node02"]


def test_a_pinned_kernel_upgrade_goes_through_the_plan_and_the_reboot(
        kernel_lab: Lab, tmp_path: Path) -> None:
    """node03's pin moves to 6.1.0-28: provision installs its image and headers (whose
    hooks have DKMS build the driver for it), pins them, and reboots node03 into it."""
    inventory_dir = kernel_lab.config.inventory_dir
    with override(inventory_dir, "host_vars", "node03", {"kernel_version": K28}):
        code = app.provision_cmd(str(inventory_dir), limit="node03", roles="kernel",
                                 reboot=True, json_path=str(tmp_path / "provision.json"))
        doc = json.loads((tmp_path / "provision.json").read_text())
        assert code == 0, doc["hosts"]["node03"]
        assert doc["hosts"]["node03"]["rebooted"] is True
        assert {c["item"] for c in doc["hosts"]["node03"]["changes"]} >= {
            f"kernel/package linux-image-{K28}", f"kernel/package linux-headers-{K28}",
            "kernel/kernel running"}
        assert fakekernel.running(kernel_lab, "node03") == K28
        assert f"nvidia/550.127.05, {K28}, " in node_sh(kernel_lab, "node03", "dkms status")
        code, drift = _drift(kernel_lab, tmp_path, "upgraded")
        # the kernel role converged; the group's consistency names the one kernel apart
        assert code == 1
        assert {h: drift["hosts"][h]["status"] for h in NODES} == {
            "node01": "clean", "node02": "clean", "node03": "drifted"}
        assert _items(drift, "node03") == {"consistency/kernel in group lab": (K28, K27)}
