"""Firmware facts (HCA, BIOS, GSP; VBIOS in the GPU query), their consistency within a group
and the per-group pins, on real captures (tests/fixtures/firmware/README.md) and the real
snippets run over trees built from them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpufleet import exitcodes
from gpufleet.drift.compare import HostDrift, add_consistency_items, check_consistency
from gpufleet.errors import ParseError
from gpufleet.facts import catalog
from gpufleet.facts.gather import Facts
from gpufleet.facts.parsers import firmware, nvidia_smi
from gpufleet.facts.summary import summarize_facts
from gpufleet.inventory.load import load_inventory
from gpufleet.inventory.model import Inventory
from gpufleet.provision.engine import BadVariables, validate
from gpufleet.provision.role import PlanContext
from gpufleet.roles.firmware import ROLE
from tests.conftest import FIXTURES

HERE = FIXTURES / "firmware"
GPUD = FIXTURES / "watch" / "gpud"
H100_BUS = "0000:62:00.0"
CX7 = "28.41.1000"
BF3 = "32.38.3056"


def run(fact: catalog.Fact) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", "-c", fact.shell], capture_output=True, text=True, check=False,
                          timeout=30)


def gathered(fact: catalog.Fact) -> Any:
    done = run(fact)
    assert done.returncode == 0, done.stdout
    return fact.parse(done.stdout)


def tree_from_grep(root: Path, capture: Path) -> None:
    """Files under ``root`` from a ``PATH:LINE`` capture."""
    for line in capture.read_text().splitlines():
        path, _, value = line.partition(":")
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(value + "\n")


def gpu_tree(root: Path, files: dict[str, str]) -> None:
    for bus, text in files.items():
        directory = root / "proc/driver/nvidia/gpus" / bus
        directory.mkdir(parents=True)
        (directory / "information").write_text(text)


# ---- the facts ----------------------------------------------------------------------------


def test_hca_firmware_of_an_h100_node_with_a_bluefield(tmp_path: Path) -> None:
    """The gpud tree: eight ConnectX-7 (MT4129) and a BlueField-3 (MT41692)."""
    devices = gathered(catalog.hca_firmware_fact(str(GPUD)))
    assert len(devices) == 9
    assert devices["mlx5_0"] == {"fw_ver": CX7, "board_id": "MT_0000000838",
                                 "hca_type": "MT4129"}
    assert devices["mlx5_bond_0"] == {"fw_ver": BF3, "board_id": "MT_0000000884",
                                      "hca_type": "MT41692"}
    host = inventory(tmp_path, {"n1": {}}).hosts["n1"]
    assert ROLE.shared(Facts("n1", values={"hca_firmware": devices}),
                       ROLE.vars(host))["hca_firmware"] == (
        f"{CX7} (mlx5_0, mlx5_1, mlx5_4, mlx5_5, mlx5_6, mlx5_7, mlx5_8, mlx5_9), "
        f"{BF3} (mlx5_bond_0)")


def test_no_rdma_device_no_dmi_no_gpu_are_absent_with_a_reason(tmp_path: Path) -> None:
    for fact, reason in ((catalog.hca_firmware_fact(str(tmp_path)), "no RDMA devices"),
                         (catalog.bios_fact(str(tmp_path)), "no DMI table"),
                         (catalog.gsp_firmware_fact(str(tmp_path)), "no NVIDIA GPU")):
        done = run(fact)
        assert done.returncode == 127
        assert done.stdout.startswith(reason)


def test_an_unreadable_dmi_table_is_absent(tmp_path: Path) -> None:
    (tmp_path / "sys/class/dmi/id").mkdir(parents=True)
    done = run(catalog.bios_fact(str(tmp_path)))
    assert (done.returncode, done.stdout.strip()) == (127, "the DMI table is not readable")


@pytest.mark.parametrize(("capture", "expected"), [
    ("dmi-bugzilla-209011-asus-tp412ua.txt",
     {"bios_vendor": "American Megatrends Inc.", "bios_version": "TP412UA.308",
      "bios_date": "07/25/2019", "board_vendor": "ASUSTeK COMPUTER INC.",
      "board_name": "TP412UA", "product_name": "VivoBook Flip 14_ASUS Flip TP412UA"}),
    ("dmi-bugzilla-199715-hp-envy.txt",
     {"bios_vendor": "AMI", "bios_version": "F.46", "bios_date": "11/15/2019",
      "board_vendor": "HP", "board_name": "8496",
      "product_name": "HP ENVY x360 Convertible 13-ag0xxx"}),
])
def test_bios_from_published_dmi_tables(capture: str, expected: dict[str, str],
                                        tmp_path: Path) -> None:
    assert firmware.dmi_bios((HERE / capture).read_text()) == expected
    tree_from_grep(tmp_path, HERE / capture)
    assert gathered(catalog.bios_fact(str(tmp_path))) == expected


def test_gsp_firmware_from_the_drivers_information_file(tmp_path: Path) -> None:
    text = (HERE / "gpu-information-h100-535.txt").read_text()
    gpu_tree(tmp_path, {H100_BUS: text,
                        "0000:63:00.0": text.replace("535.129.03", "N/A"),
                        "0000:64:00.0": "".join(line + "\n" for line in text.splitlines()
                                                if "Firmware" not in line)})
    assert gathered(catalog.gsp_firmware_fact(str(tmp_path))) == {
        H100_BUS: "535.129.03", "0000:63:00.0": firmware.GSP_OFF, "0000:64:00.0": None}


def test_gsp_firmware_as_nvidias_readme_prints_it() -> None:
    line = f"/proc/driver/nvidia/gpus/{H100_BUS}/information:   GSP Firmware:    580.65.06"
    assert firmware.gsp_firmware(line) == {H100_BUS: "580.65.06"}


@pytest.mark.parametrize(("parse", "text", "expected"), [
    (firmware.hca_firmware, "/etc/passwd:root:x:0:0", "/sys/class/infiniband/DEV/FILE"),
    (firmware.hca_firmware, "", "an RDMA device"),
    (firmware.dmi_bios, "/sys/class/dmi/id/product_serial:1234", "BIOS and board"),
    (firmware.dmi_bios, "/sys/class/dmi/id/bios_vendor:AMI", "a bios_version line"),
    (firmware.gsp_firmware, "/proc/driver/nvidia/gpus/x/information:Model: A", "BUS"),
    (firmware.hca_firmware, "/sys/class/infiniband/mlx5_0/fw_ver:" + "1" * 200,
     "at most 128 characters"),
    (firmware.dmi_bios, "x" * (firmware.LIMIT + 1), "at most 65536 characters"),
])
def test_the_parsers_refuse_what_they_cannot_read(parse: Any, text: str, expected: str) -> None:
    with pytest.raises(ParseError, match=expected):
        parse(text)


def test_the_parsers_are_bounded_in_devices() -> None:
    lines = "\n".join(f"/sys/class/infiniband/mlx5_{n}/fw_ver:{CX7}"
                      for n in range(firmware.MAX_DEVICES + 1))
    with pytest.raises(ParseError, match="at most 64 devices"):
        firmware.hca_firmware(lines)


def test_a_line_outside_the_root_is_refused() -> None:
    with pytest.raises(ParseError, match="under /lab"):
        firmware.hca_firmware(f"/sys/class/infiniband/mlx5_0/fw_ver:{CX7}", "/lab")


def test_the_gpu_query_asks_for_the_vbios() -> None:
    assert "vbios_version" in catalog.GPU_QUERY.split(",")
    text = ("index, pci.bus_id, vbios_version\n"
            "0, 00000000:00:06.0, 96.00.A5.00.1A\n")
    assert nvidia_smi.nvidia_smi_query(text)[0]["vbios_version"] == "96.00.A5.00.1A"


# ---- consistency and pins ---------------------------------------------------------------


def inventory(tmp_path: Path, hosts: dict[str, dict[str, Any]],
              group_vars: dict[str, Any] | None = None) -> Inventory:
    members = {name: {"ansible_host": f"192.0.2.{n + 1}", **values}
               for n, (name, values) in enumerate(hosts.items())}
    (tmp_path / "hosts.json").write_text(json.dumps(
        {"all": {"children": {"train": {"hosts": members, "vars": group_vars or {}}}}}))
    return load_inventory(tmp_path / "hosts.json")


def node_facts(name: str, hca: str = CX7, vbios: str = "96.00.A5.00.1A",
               bios: str = "2.1.V1") -> Facts:
    return Facts(name, values={
        "kernel": "6.8.0-45-generic",
        "hca_firmware": {f"mlx5_{n}": {"fw_ver": CX7 if n else hca, "board_id": "MT_0000000838",
                                      "hca_type": "MT4129"} for n in range(2)},
        "gpus": [{"index": n, "pci.bus_id": f"00000000:0{6 + n}:00.0", "vbios_version": vbios,
                  "name": "NVIDIA H200"} for n in range(2)],
        "gsp_firmware": {"0000:06:00.0": "580.159.04", "0000:07:00.0": "580.159.04"},
        "bios": {"bios_vendor": "AMI", "bios_version": bios, "bios_date": "03/14/2024",
                 "board_vendor": "Supermicro", "board_name": "X13DEG-OAD",
                 "product_name": None}})


def drift_of(inv: Inventory, facts: dict[str, Facts]) -> dict[str, HostDrift]:
    hosts = {name: HostDrift(name, "clean") for name in facts}
    add_consistency_items(hosts, check_consistency(inv, facts), {})
    return hosts


def test_a_node_whose_firmware_differs_from_its_group_is_named_alone(tmp_path: Path) -> None:
    inv = inventory(tmp_path, {"n1": {}, "n2": {}, "n3": {}})
    drift = drift_of(inv, {"n1": node_facts("n1"), "n2": node_facts("n2", vbios="96.00.A5.00.1B"),
                           "n3": node_facts("n3", hca="28.37.1014")})
    assert drift["n1"].items == []
    (vbios,) = drift["n2"].items
    assert (vbios.resource, vbios.desired, vbios.actual, vbios.finding_class) == (
        "gpu_vbios in group train", "96.00.A5.00.1A", "96.00.A5.00.1B", "configuration")
    (hca,) = drift["n3"].items
    assert hca.resource == "hca_firmware in group train"
    assert (hca.desired, hca.actual) == (CX7, f"28.37.1014 (mlx5_0), {CX7} (mlx5_1)")


def test_pins_are_checked_before_any_host_is_contacted(tmp_path: Path) -> None:
    for pins, expected in (({"nic": "1"}, "unknown key 'nic'"),
                           ({"vbios": "96.00; reboot"}, "bad vbios version"),
                           ({"hca": {"MT4129": ["28.39.1002"]}}, "an hca pin that maps"),
                           ("28.39.1002", "a mapping")):
        inv = inventory(tmp_path, {"n1": {"firmware_pins": pins}})
        with pytest.raises(BadVariables) as failed:
            validate(list(inv.hosts.values()), [ROLE])
        message = str(failed.value)
        assert message.startswith("host n1: variable firmware_pins must be ")
        assert expected in message and "\n" not in message


def test_a_node_that_misses_its_pin_is_named_with_device_seen_and_pinned(
        tmp_path: Path) -> None:
    pins = {"hca": {"MT4129": "28.39.1002"}, "vbios": "96.00.A5.00.1A", "gsp": "580.159.04",
            "bios": "2.1.V1"}
    inv = inventory(tmp_path, {"n1": {}, "n2": {}}, {"firmware_pins": pins})
    validate(list(inv.hosts.values()), [ROLE])
    host = inv.hosts["n2"]
    v = ROLE.vars(host)
    facts = node_facts("n2", hca="28.39.1002", vbios="96.00.A5.00.1B", bios="2.0")
    changes = ROLE.plan(facts, v, PlanContext(inv, host))
    shown = [(c.resource, c.before, c.after, c.manual, c.finding_class) for c in changes]
    assert shown == [
        ("hca mlx5_1 (MT4129 MT_0000000838)", CX7, "28.39.1002 (firmware_pins.hca)", True,
         "configuration"),
        ("vbios GPU 0 (00000000:06:00.0)", "96.00.A5.00.1B", "96.00.A5.00.1A "
         "(firmware_pins.vbios)", True, "configuration"),
        ("vbios GPU 1 (00000000:07:00.0)", "96.00.A5.00.1B", "96.00.A5.00.1A "
         "(firmware_pins.vbios)", True, "configuration"),
        ("bios", "2.0", "2.1.V1 (firmware_pins.bios)", True, "configuration")]
    assert ROLE.plan(node_facts("n1", hca="28.39.1002", vbios="96.00.A5.00.1A"),
                     ROLE.vars(inv.hosts["n1"]), PlanContext(inv, inv.hosts["n1"])) == \
        [changes[0]]


def test_a_pin_on_a_host_without_that_firmware_says_why(tmp_path: Path) -> None:
    inv = inventory(tmp_path, {"n1": {"firmware_pins": {"hca": CX7}}})
    host = inv.hosts["n1"]
    facts = Facts("n1", absent={"hca_firmware": "no RDMA devices (nothing in "
                                                "/sys/class/infiniband)"})
    (change,) = ROLE.plan(facts, ROLE.vars(host), PlanContext(inv, host))
    assert (change.resource, change.before) == (
        "hca", "unknown (no RDMA devices (nothing in /sys/class/infiniband))")


def test_the_facts_summary_shows_the_firmware() -> None:
    assert summarize_facts(node_facts("n1"))["firmware"] == (
        f"HCA {CX7}, VBIOS 96.00.A5.00.1A, GSP 580.159.04, BIOS 2.1.V1 (Supermicro X13DEG-OAD)")
    assert summarize_facts(Facts("n1"))["firmware"] is None


def test_the_fixtures_are_described() -> None:
    readme = (HERE / "README.md").read_text()
    for path in HERE.iterdir():
        if path.name != "README.md":
            assert path.name in readme


def test_a_bad_pin_stops_drift_with_one_line_and_exit_2(tmp_path: Path) -> None:
    """Before any host is contacted: the inventory's one host is an address nothing answers."""
    inventory(tmp_path, {"n1": {"firmware_pins": {"vbios": "96.00.A5.00.1A\nx"}}})
    environment = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_")}
    done = subprocess.run([sys.executable, "-m", "gpufleet", "drift", "-i",
                           str(tmp_path / "hosts.json"), "--report-dir", str(tmp_path / "h")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env=environment, check=False)
    assert done.returncode == exitcodes.USAGE, done
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("error: host n1: variable firmware_pins must be "), line
    assert "bad vbios version '96.00.A5.00.1A\\nx'" in line
    assert not (tmp_path / "h").exists()
