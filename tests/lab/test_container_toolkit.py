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
from gpufleet.inventory.model import load_inventory
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
