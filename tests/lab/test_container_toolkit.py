"""NVIDIA Container Toolkit on a real lab node, from the stand-in of NVIDIA's repository:
the four packages pinned, Docker's daemon.json given the nvidia runtime by the toolkit's
own nvidia-ctk (keeping the file's other settings), the CDI spec of the node's GPUs; then
a driver change makes the spec stale (drift names it, provisioning regenerates it) and a
daemon.json edited by hand is drift."""

from __future__ import annotations

import json
from pathlib import Path

from gpufleet import app
from gpufleet.facts import containers
from gpufleet.inventory.load import load_inventory
from gpufleet.lab.cluster import Lab
from tests.lab import fakegpu
from tests.lab.conftest import node_sh
from tests.lab.test_provision import items, override, run

NODE = "node12"
ROLES = "nvidia_repo,container_toolkit"
PACKAGES = ("nvidia-container-toolkit", "nvidia-container-toolkit-base",
            "libnvidia-container-tools", "libnvidia-container1")
WANTED = {"container_engine": "docker", "nvidia_container_toolkit_version": "1.17.8-1",
          "container_default_runtime": True}
UPGRADE = "580.95.05"


def _load_module(lab: Lab, version: str) -> None:
    """The lab's "loaded" driver: the module line /proc/driver/nvidia/version shows."""
    node_sh(lab, NODE, "mkdir -p /proc/driver/nvidia && printf '%s\\n' 'NVRM version: NVIDIA "
            f"UNIX Open Kernel Module for x86_64  {version}  Release Build  (gpufleet lab)' > "
            "/proc/driver/nvidia/version")


def _drift(inventory_path: Path, tmp_path: Path, name: str) -> tuple[int, list[dict[str, str]]]:
    report = tmp_path / f"{name}.json"
    code = app.drift_cmd(str(inventory_path), limit=NODE, roles=ROLES, outputs=app.DriftOutputs(
        json_path=str(report), report_dir=str(tmp_path / "history")))
    return code, json.loads(report.read_text())["hosts"][NODE]["items"]


def test_the_toolkit_converges_and_a_driver_change_regenerates_the_cdi_spec(
        lab: Lab, inventory_path: Path, tmp_path: Path) -> None:
    pinned = load_inventory(inventory_path).hosts[NODE].vars["nvidia_driver_version"]
    fakegpu.install(lab, NODE)
    _load_module(lab, pinned)
    node_sh(lab, NODE, "mkdir -p /etc/docker && printf '%s' '{\"log-driver\": \"journald\"}' "
            "> /etc/docker/daemon.json")
    uuids = [line.split("UUID: ")[1].rstrip(")") for line in
             node_sh(lab, NODE, "nvidia-smi -L").splitlines()]
    try:
        with override(inventory_path, "host_vars", NODE, WANTED):
            first = run(inventory_path, NODE, role_names=ROLES)[NODE]
            versions = node_sh(lab, NODE, "dpkg-query -W -f='${Package}=${Version}\\n' "
                               + " ".join(PACKAGES))
            held = node_sh(lab, NODE, "apt-mark showhold")
            daemon = node_sh(lab, NODE, "cat /etc/docker/daemon.json")
            spec = containers.cdi_spec(node_sh(lab, NODE, "cat /etc/cdi/nvidia.yaml"))
            clean, clean_items = _drift(inventory_path, tmp_path, "clean")

        # the driver's pin moves and the node reboots into the new driver
        with override(inventory_path, "host_vars", NODE,
                      {**WANTED, "nvidia_driver_version": UPGRADE}):
            _load_module(lab, UPGRADE)
            stale, stale_items = _drift(inventory_path, tmp_path, "stale")
            again = run(inventory_path, NODE, role_names=ROLES)[NODE]
            regenerated = containers.cdi_spec(node_sh(lab, NODE, "cat /etc/cdi/nvidia.yaml"))
            node_sh(lab, NODE, "printf '{}' > /etc/docker/daemon.json")  # edited by hand
            edited, edited_items = _drift(inventory_path, tmp_path, "edited")
    finally:
        node_sh(lab, NODE, "apt-mark unhold " + " ".join(PACKAGES) + " >/dev/null 2>&1; "
                "DEBIAN_FRONTEND=noninteractive apt-get -qq -y purge " + " ".join(PACKAGES)
                + " >/dev/null 2>&1; rm -rf /etc/cdi /etc/docker /proc/driver/nvidia "
                "/etc/apt/preferences.d/gpufleet-container_toolkit.pref; true")
        fakegpu.remove(lab, NODE)

    assert first.status == "changed", first.error
    assert sorted(versions.split()) == sorted(f"{p}=1.17.8-1" for p in PACKAGES)
    assert set(PACKAGES) <= set(held.split())
    assert json.loads(daemon) == {"log-driver": "journald", "default-runtime": "nvidia",
                                  "runtimes": {"nvidia": {"args": [],
                                                          "path": "nvidia-container-runtime"}}}
    assert (spec.driver, spec.uuids) == (pinned, uuids)
    assert (clean, clean_items) == (0, [])

    assert stale == 1
    [item] = stale_items
    assert (item["item"], item["actual"], item["desired"]) == (
        "container_toolkit/cdi spec /etc/cdi/nvidia.yaml", f"driver {pinned}",
        f"driver {UPGRADE}, {len(uuids)} GPU(s)")
    assert again.status == "changed", again.error
    assert items(again) == ["container_toolkit/cdi spec /etc/cdi/nvidia.yaml"]
    assert regenerated.driver == UPGRADE

    assert edited == 1
    [runtime] = edited_items
    assert (runtime["item"], runtime["actual"], runtime["desired"]) == (
        "container_toolkit/runtime docker", "/etc/docker/daemon.json: no nvidia runtime",
        "/etc/docker/daemon.json: nvidia runtime (the default)")


ENROOT_PACKAGES = ("enroot", "enroot+caps", "nvslurm-plugin-pyxis")
ENROOT_WANTED = {"enroot_version": "3.5.0-1", "pyxis_version": "0.20.0-1",
                 "enroot_settings": {"ENROOT_ROOTFS_WRITABLE": True},
                 "enroot_shm_size": "50%", "shared_mounts": [{"path": "/datasets"}]}


def test_enroot_and_pyxis_converge_and_a_hand_edit_is_drift(
        lab: Lab, inventory_path: Path, tmp_path: Path) -> None:
    """node12 gets enroot, enroot+caps and pyxis pinned, enroot's settings and mounts, and
    pyxis's plugstack link; while its plugstack.conf lacks the include, the run fails naming
    it; a line added by hand to enroot's settings is drift with its diff."""
    roles = "nvidia_repo,enroot_pyxis"
    try:
        with override(inventory_path, "host_vars", NODE, ENROOT_WANTED):
            refused = run(inventory_path, NODE, role_names=roles)[NODE]
            node_sh(lab, NODE, "mkdir -p /etc/slurm && echo 'include "
                    "/etc/slurm/plugstack.conf.d/*' > /etc/slurm/plugstack.conf")
            converged = run(inventory_path, NODE, role_names=roles)[NODE]
            versions = node_sh(lab, NODE, "dpkg-query -W -f='${Package}=${Version}\\n' "
                               + " ".join(ENROOT_PACKAGES))
            settings = node_sh(lab, NODE, "cat /etc/enroot/enroot.conf.d/90-gpufleet.conf")
            fstab = node_sh(lab, NODE, "cat /etc/enroot/mounts.d/90-gpufleet.fstab")
            link = node_sh(lab, NODE, "readlink /etc/slurm/plugstack.conf.d/pyxis.conf")
            version = node_sh(lab, NODE, "enroot version")
            code = app.drift_cmd(str(inventory_path), limit=NODE, roles=roles,
                                 outputs=app.DriftOutputs(report_dir=str(tmp_path / "h")))
            node_sh(lab, NODE, "echo 'ENROOT_ROOTFS_WRITABLE no' >> "
                    "/etc/enroot/enroot.conf.d/90-gpufleet.conf")
            report = tmp_path / "edited.json"
            edited = app.drift_cmd(str(inventory_path), limit=NODE, roles=roles,
                                   outputs=app.DriftOutputs(json_path=str(report),
                                                            report_dir=str(tmp_path / "h")))
    finally:
        node_sh(lab, NODE, "apt-mark unhold " + " ".join(ENROOT_PACKAGES) + " >/dev/null 2>&1; "
                "DEBIAN_FRONTEND=noninteractive apt-get -qq -y purge " + " ".join(ENROOT_PACKAGES)
                + " >/dev/null 2>&1; rm -rf /etc/enroot /etc/slurm "
                "/etc/apt/preferences.d/gpufleet-enroot_pyxis.pref; true")
    assert refused.status == "failed"
    assert "/etc/slurm/plugstack.conf must include /etc/slurm/plugstack.conf.d/* for Slurm " \
           "to load pyxis" in str(refused.error), refused.error
    # the failed run applied what came before the failure: only the include was missing
    assert converged.status == "ok", converged.error
    assert items(converged) == []
    assert sorted(versions.split()) == ["enroot+caps=3.5.0-1", "enroot=3.5.0-1",
                                        "nvslurm-plugin-pyxis=0.20.0-1"]
    assert settings.splitlines()[1:] == ["ENROOT_ROOTFS_WRITABLE yes"]
    assert fstab.splitlines()[1:] == ["/datasets /datasets none x-create=dir,bind,rw,nosuid,nodev",
                                      "tmpfs /dev/shm tmpfs x-create=dir,rw,nosuid,nodev,size=50%"]
    assert link.strip() == "/usr/share/pyxis/pyxis.conf"
    assert version.strip() == "3.5.0"
    assert code == 0
    assert edited == 1
    [item] = json.loads(report.read_text())["hosts"][NODE]["items"]
    assert item["item"] == "enroot_pyxis/file /etc/enroot/enroot.conf.d/90-gpufleet.conf"
    assert "\n-ENROOT_ROOTFS_WRITABLE no\n" in item["diff"]  # the host's line, to go
