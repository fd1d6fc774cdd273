"""Firmware on a lab of its own (no provisioning): a VBIOS or an HCA firmware that differs on
one node of the group, and a pin one node misses, drift that node alone, naming it.

Three nodes, each with the stand-in nvidia-smi of tests/lab/fakegpu.py (the real H200's
VBIOS 96.00.A5.00.1A, which a test changes on one node) and a stand-in tree under
``firmware_root`` (lab nodes share the controller's /sys and /proc): two ConnectX-7 devices
(``fw_ver``, ``board_id``, ``hca_type`` as in tests/fixtures/watch/gpud), a DMI table, and
the NVIDIA driver's information file of each stand-in GPU with the H200's GSP firmware.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from gpufleet.drift.compare import HostDrift
from gpufleet.drift.run import DriftOptions, check_fleet
from gpufleet.inventory.load import load_inventory
from gpufleet.inventory.target import Target
from gpufleet.lab.cluster import Lab
from gpufleet.roles import firmware
from tests.lab import fakegpu
from tests.lab.conftest import lab_up, node_sh

NODES = ("node01", "node02", "node03")
ROOT = "/var/lib/gpufleet-lab-firmware"
CX7, VBIOS, GSP, BIOS = "28.39.1002", "96.00.A5.00.1A", "580.159.04", "2.1.V1"
GPUS = ("0000:00:06.0", "0000:00:07.0")  # the bus ids of fakegpu's capture


def tree(hca: dict[str, str] | None = None, bios: str = BIOS) -> dict[str, str]:
    """The stand-in tree: path under ROOT -> content."""
    files: dict[str, str] = {}
    for device in ("mlx5_0", "mlx5_1"):
        base = f"sys/class/infiniband/{device}"
        files.update({f"{base}/fw_ver": (hca or {}).get(device, CX7) + "\n",
                      f"{base}/board_id": "MT_0000000838\n", f"{base}/hca_type": "MT4129\n"})
    files.update({"sys/class/dmi/id/bios_vendor": "American Megatrends International, LLC.\n",
                  "sys/class/dmi/id/bios_version": f"{bios}\n",
                  "sys/class/dmi/id/bios_date": "03/14/2024\n",
                  "sys/class/dmi/id/board_vendor": "Supermicro\n",
                  "sys/class/dmi/id/board_name": "X13DEG-OAD\n"})
    for bus in GPUS:
        files[f"proc/driver/nvidia/gpus/{bus}/information"] = (
            f"Model: \t\t NVIDIA H200\nBus Location: \t {bus}\nGPU Firmware: \t {GSP}\n"
            "GPU Excluded: \t No\n")
    return files


def install(lab: Lab, node: str, **kwargs: Any) -> None:
    """Replace ``node``'s stand-in tree (see ``tree``)."""
    files = tree(**kwargs)
    directories = sorted({f"{ROOT}/{path.rsplit('/', 1)[0]}" for path in files})
    node_sh(lab, node, " && ".join([
        f"rm -rf {ROOT}", "mkdir -p " + " ".join(map(shlex.quote, directories)),
        *(f"printf '%s' {shlex.quote(text)} > {shlex.quote(f'{ROOT}/{path}')}"
          for path, text in files.items())]))


@pytest.fixture(scope="module")
def fw_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    with lab_up(tmp_path_factory, "fw", 19, len(NODES)) as lab:
        set_vars(lab)
        for node in NODES:
            fakegpu.install(lab, node)
            install(lab, node)
        yield lab


def set_vars(lab: Lab, **extra: Any) -> None:
    """The lab group's firmware variables (the stand-in root, and ``extra``)."""
    path = lab.config.inventory_dir / "group_vars" / "lab.yml"
    path.write_text(yaml.safe_dump({"firmware_root": ROOT, **extra}))


def drift(lab: Lab) -> dict[str, HostDrift]:
    target = Target.select(load_inventory(lab.config.inventory_dir), "lab")
    return check_fleet(target, DriftOptions(roles=[firmware.ROLE])).hosts


def drifted(hosts: dict[str, HostDrift]) -> dict[str, list[str]]:
    return {name: sorted(i.item for i in h.items) or [str(h.error)]
            for name, h in hosts.items() if h.status != "clean"}


@pytest.fixture
def restored(fw_lab: Lab) -> Iterator[Lab]:
    """Every node's stand-ins and the group's variables as the module set them, afterwards."""
    yield fw_lab
    set_vars(fw_lab)
    for node in NODES:
        fakegpu.set_fields(fw_lab, node)
        install(fw_lab, node)


def test_a_uniform_group_is_clean_and_its_firmware_gathered(fw_lab: Lab) -> None:
    hosts = drift(fw_lab)
    assert drifted(hosts) == {}


def test_a_vbios_that_differs_on_one_node_drifts_that_node_alone(restored: Lab) -> None:
    fakegpu.set_fields(restored, "node02", vbios_version="96.00.A5.00.1B")
    hosts = drift(restored)
    assert drifted(hosts) == {"node02": ["consistency/gpu_vbios in group lab"]}
    item = hosts["node02"].items[0]
    assert (item.desired, item.actual, item.finding_class) == (
        VBIOS, "96.00.A5.00.1B", "configuration")


def test_an_hca_firmware_that_differs_on_one_node_drifts_that_node_alone(
        restored: Lab) -> None:
    install(restored, "node03", hca={"mlx5_1": "28.37.1014"})
    hosts = drift(restored)
    assert drifted(hosts) == {"node03": ["consistency/hca_firmware in group lab"]}
    item = hosts["node03"].items[0]
    assert (item.desired, item.actual) == (CX7, f"28.37.1014 (mlx5_1), {CX7} (mlx5_0)")


def test_a_pin_one_node_misses_drifts_that_node_alone(restored: Lab) -> None:
    set_vars(restored, firmware_pins={"hca": {"MT4129": CX7}, "vbios": VBIOS, "gsp": GSP,
                                      "bios": BIOS})
    assert drifted(drift(restored)) == {}
    install(restored, "node01", bios="2.0")
    hosts = drift(restored)
    assert drifted(hosts) == {"node01": ["consistency/bios in group lab", "firmware/bios"]}
    pin = next(i for i in hosts["node01"].items if i.role == "firmware")
    assert (pin.actual, pin.desired, pin.manual, pin.finding_class) == (
        "2.0", f"{BIOS} (firmware_pins.bios)", True, "configuration")
