"""The NVIDIA stack on real lab nodes, from the stand-in of NVIDIA's repository (signed, at
NVIDIA's layout, packages with the real names, versions and dependencies): an HGX-shaped
group gets fabricmanager at its driver's version; a mismatch made by hand is drift; a CUDA
release pin installs the release's metapackages and its own nvcc; a driver whose DKMS build
fails says so."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufleet import app
from gpufleet.lab.cluster import Lab
from tests.lab.conftest import node_sh
from tests.lab.test_provision import items, override, run

HGX = ["node15", "node16"]
HGX_VARS = {"nvidia_driver_version": "580.95.05", "nvidia_driver_flavor": "open",
            "nvidia_driver_source": "cuda-repo", "nvidia_driver_package": None,
            "nvidia_driver_package_version": "{version}-*", "nvidia_fabricmanager": True,
            "nvidia_fabricmanager_service": False}
STACK_ROLES = "nvidia_repo,driver,fabricmanager"


def _reset(lab: Lab, node: str) -> None:
    node_sh(lab, node, "apt-mark unhold $(apt-mark showhold) >/dev/null 2>&1; "
            "DEBIAN_FRONTEND=noninteractive apt-get -qq -y purge 'nvidia-*' 'cuda-*' "
            ">/dev/null 2>&1; rm -f /etc/apt/preferences.d/gpufleet-* "
            "/etc/apt/apt.conf.d/51gpufleet-unattended-upgrades /usr/local/cuda; true")


@pytest.fixture
def hgx(lab: Lab, inventory_path: Path) -> Iterator[Path]:
    """node15 and node16 as an HGX group (their own group_vars), reset afterwards."""
    try:
        with override(inventory_path, "host_vars", "node15", HGX_VARS), \
                override(inventory_path, "host_vars", "node16", HGX_VARS):
            yield inventory_path
    finally:
        for node in HGX:
            _reset(lab, node)
        for node in HGX:
            lab.reboot(node)


def test_an_hgx_group_gets_fabricmanager_at_its_drivers_version(
        lab: Lab, hgx: Path, tmp_path: Path) -> None:
    limit = ":".join(HGX)
    report = tmp_path / "provision.json"
    assert app.provision_cmd(str(hgx), limit=limit, roles=STACK_ROLES, reboot=True,
                             json_path=str(report)) == 0
    for node in HGX:
        versions = node_sh(lab, node, "dpkg-query -W -f='${Package}=${Version}\\n' "
                           "nvidia-open-580 nvidia-fabricmanager-580")
        assert versions.split() == ["nvidia-fabricmanager-580=580.95.05-1",
                                    "nvidia-open-580=580.95.05-1"]
        assert "Open Kernel Module for x86_64  580.95.05" in node_sh(
            lab, node, "cat /proc/driver/nvidia/version")
        assert "cuda-repository-pin-600" in node_sh(lab, node, "ls /etc/apt/preferences.d")
    assert all(items(o) == [] for o in run(hgx, limit, check=True,
                                           role_names=STACK_ROLES).values())

    # By hand, fabricmanager of another version (dpkg forced past its dependency)
    node_sh(lab, "node16", "cd /tmp && apt-get -qq download nvidia-fabricmanager-580="
            "580.105.08-1 && dpkg --force-depends -i nvidia-fabricmanager-580_580.105.08-1_*.deb "
            ">/dev/null 2>&1; rm -f /tmp/nvidia-fabricmanager-580_*.deb")
    drift = tmp_path / "drift.json"
    code = app.drift_cmd(str(hgx), limit=limit, roles=STACK_ROLES, outputs=app.DriftOutputs(
        json_path=str(drift), report_dir=str(tmp_path / "history")))
    hosts = json.loads(drift.read_text())["hosts"]
    assert code == 1
    assert hosts["node15"]["status"] == "clean"
    [item] = [i for i in hosts["node16"]["items"] if i["role"] == "fabricmanager"]
    assert (item["resource"], item["actual"], item["desired"]) == (
        "package nvidia-fabricmanager-580", "580.105.08-1", "580.95.05-*")
    assert app.provision_cmd(str(hgx), limit="node16", roles=STACK_ROLES) == 0
    assert node_sh(lab, "node16", "dpkg-query -W -f='${Version}' nvidia-fabricmanager-580") \
        == "580.95.05-1"


def test_a_cuda_release_pin_installs_its_metapackages_and_nvcc(
        lab: Lab, inventory_path: Path) -> None:
    node = "node15"
    try:
        for pin in ("13.0.2", "13.0"):
            with override(inventory_path, "host_vars", node, {"cuda_version": pin}):
                outcome = run(inventory_path, node, role_names="nvidia_repo,cuda")[node]
                assert outcome.status in ("changed", "ok"), outcome.error
                assert items(run(inventory_path, node, check=True,
                                 role_names="nvidia_repo,cuda")[node]) == []
            versions = node_sh(lab, node, "dpkg-query -W -f='${Package}=${Version}\\n' "
                               "cuda-toolkit-13-0 cuda-compiler-13-0 cuda-nvcc-13-0")
            assert versions.split() == ["cuda-compiler-13-0=13.0.2-1",
                                        "cuda-nvcc-13-0=13.0.88-1",
                                        "cuda-toolkit-13-0=13.0.2-1"]
            assert "release 13.0, V13.0.88" in node_sh(lab, node,
                                                       "/usr/local/cuda/bin/nvcc --version")
    finally:
        _reset(lab, node)


def test_a_driver_whose_dkms_build_fails_says_so(lab: Lab, inventory_path: Path) -> None:
    node = "node16"
    try:
        with override(inventory_path, "host_vars", node, {
                "nvidia_driver_version": "570.86.10",
                "nvidia_driver_package": "nvidia-driver-{branch}",
                "nvidia_driver_package_version": "{version}-0ubuntu1"}):
            outcome = run(inventory_path, node, role_names="nvidia_repo,driver")[node]
        assert outcome.status == "failed"
        assert "DKMS could not build the NVIDIA kernel module for kernel 6.8.0-45-generic" \
            in str(outcome.error)
        assert "/var/lib/dkms/nvidia/570.86.10/build/make.log" in str(outcome.error)
    finally:
        node_sh(lab, node, "dpkg --purge --force-all nvidia-driver-570 >/dev/null 2>&1; true")
        _reset(lab, node)


def test_a_node_whose_driver_the_gpu_operator_runs_is_verified_and_left_alone(
        lab: Lab, inventory_path: Path, tmp_path: Path) -> None:
    """node14 as a GPU Operator node: the driver container's root at /run/nvidia/driver and
    its module loaded (580.95.05, open). With nvidia_driver_install: apt the role refuses
    and installs nothing; with operator the node is converged and drift is clean; a pin of
    another version is a verify failure naming the operator."""
    node = "node14"
    wanted = {"nvidia_driver_version": "580.95.05", "nvidia_driver_flavor": "open",
              "nvidia_driver_source": "cuda-repo", "nvidia_driver_package": None,
              "nvidia_driver_package_version": "{version}-*"}
    node_sh(lab, node, "mkdir -p /run/nvidia/driver/usr/bin /run/nvidia/validations "
            "/proc/driver/nvidia && printf '#!/bin/sh\\n' > /run/nvidia/driver/usr/bin/nvidia-smi"
            " && chmod 755 /run/nvidia/driver/usr/bin/nvidia-smi && touch "
            "/run/nvidia/validations/.driver-ctr-ready && printf '%s\\n' 'NVRM version: NVIDIA "
            "UNIX Open Kernel Module for x86_64  580.95.05  Release Build  (gpu-operator)' > "
            "/proc/driver/nvidia/version")
    try:
        with override(inventory_path, "host_vars", node, wanted):
            refused = run(inventory_path, node, role_names="nvidia_repo,driver")[node]
            packages = node_sh(lab, node, "dpkg-query -W -f '${Package}\\n' 'nvidia-*' "
                                          "2>/dev/null; true")
        with override(inventory_path, "host_vars", node,
                      {**wanted, "nvidia_driver_install": "operator"}):
            verified = run(inventory_path, node, role_names="driver")[node]
            drift = app.drift_cmd(str(inventory_path), limit=node, roles="driver",
                                  outputs=app.DriftOutputs(report_dir=str(tmp_path / "d")))
        with override(inventory_path, "host_vars", node,
                      {**wanted, "nvidia_driver_install": "operator",
                       "nvidia_driver_version": "580.105.08"}):
            other = run(inventory_path, node, role_names="driver")[node]
    finally:
        node_sh(lab, node, "rm -rf /run/nvidia /proc/driver/nvidia; true")
        _reset(lab, node)
    assert refused.status == "failed"
    assert "the GPU Operator runs this node's driver (its driver container at " \
           "/run/nvidia/driver): gpufleet does not install or remove a driver under it" \
           in str(refused.error), refused.error
    assert packages.strip() == "", packages
    assert verified.status == "ok", verified.error
    assert items(verified) == []
    assert drift == 0
    assert other.status == "failed"
    assert "the GPU Operator provides the driver: loaded 580.95.05 (open), the inventory " \
           "wants 580.105.08 (open)" in str(other.error), other.error
