"""The PCIe fact, the pcie suite's verdicts and the pcie role: the parser on real captures
(tests/fixtures/pcie), the fact's own shell run here over the lab's stand-in tree
(tests/lab/fakepci.py) with each fault, and the role's plan."""

from __future__ import annotations

import os
import re
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest

from gpufleet.conformance import registry
from gpufleet.conformance.checks import pcie as checks
from gpufleet.conformance.suites.pcie import PcieSettings
from gpufleet.errors import ParseError, VarError
from gpufleet.facts import pcie, script
from gpufleet.facts.formats import FileState
from gpufleet.facts.gather import Facts
from gpufleet.facts.parsers import pcie as parser
from gpufleet.facts.pcie import NAME, pcie_fact
from gpufleet.inventory.load import load_inventory
from gpufleet.inventory.model import Inventory
from gpufleet.provision.plan import MANUAL, Change, Fail, Run
from gpufleet.provision.role import PlanContext, RoleVars
from gpufleet.roles.pcie import ROLE, SCRIPT, UNIT, UNIT_LINK
from tests.conftest import FIXTURES
from tests.lab import fakepci

CAPTURES = FIXTURES / "pcie"
_ACSCTL = re.compile(r"ACSCtl:\s+((?:\w+[+-] ?){7})$")


def capture(name: str) -> str:
    return (CAPTURES / name).read_text()


# ---- the registers, on real captures ---------------------------------------------------------

def acsctl_lines(name: str) -> list[dict[str, bool]]:
    """Each ``ACSCtl:`` line of a capture as lspci printed its flags."""
    lines = []
    for line in capture(name).splitlines():
        match = _ACSCTL.search(line.strip())
        assert match, line
        lines.append({flag[:-1]: flag.endswith("+") for flag in match.group(1).split()})
    return lines


@pytest.mark.parametrize("name", ["lspci-acsctl-nccl-issue-304.txt",
                                  "lspci-acsctl-nccl-issue-523.txt",
                                  "lspci-acsctl-nccl-issue-629.txt"])
def test_acs_bits_are_lspci_s(name: str) -> None:
    lines = acsctl_lines(name)
    assert lines
    for flags in lines:
        assert tuple(flags) == pcie.ACS_BITS  # lspci names bits 0-6 in this order
        word = sum(1 << bit for bit, on in enumerate(flags.values()) if on)
        assert pcie.acs_flags(word) == flags
        assert bool(pcie.acs_redirects(word)) == (flags["ReqRedir"] or flags["CmpltRedir"])


def test_acs_on_and_off_as_the_nccl_issue_shows_them() -> None:
    on, off = acsctl_lines("lspci-acsctl-nccl-issue-304.txt")
    assert pcie.acs_redirects(0x1d) == ["ReqRedir", "CmpltRedir"]
    assert pcie.acs_flags(0x1d) == on and pcie.acs_flags(0) == off
    assert pcie.acs_redirects(0x20) == ["EgressCtrl"]
    assert pcie.acs_redirects(0x13) == []  # SrcValid, TransBlk, UpstreamFwd: no redirect


def test_setpci_words_of_acs_off() -> None:
    words = [line.split()[-1] for line in capture("setpci-v-acs-nccl-issue-606.txt").splitlines()]
    assert len(words) == 31
    assert {parser._word(w) for w in words} == {0}
    assert all(pcie.acs_redirects(0) == [] for _ in words)


def test_device_control_as_lspci_decodes_it() -> None:
    text = capture("lspci-devctl-a100-hwloc-issue-653.txt")
    assert "RlxdOrd+" in text and "MaxReadReq 512 bytes" in text
    word = 2 << 12 | 1 << 4 | 1 << 5 | 7  # MaxReadReq 512, RlxdOrd, MaxPayload 256 ...
    assert pcie.device_control(word) == {"relaxed_ordering": True, "max_read_request": 512}
    assert pcie.device_control(0x5957) == {"relaxed_ordering": True, "max_read_request": 4096}
    assert pcie.device_control(0x2947) == {"relaxed_ordering": False, "max_read_request": 512}


def test_sysfs_link_speeds() -> None:
    files = dict(re.findall(r"==> \S+/(\w+) <==\n(.*)\n", capture(
        "sysfs-link-nokyan-resources-512.txt")))
    assert parser.link_speed(files["current_link_speed"]) == 16.0
    assert parser.link_speed(files["max_link_speed"]) == 32.0
    for line in capture("sysfs-link-h100-vm.txt").splitlines():
        if "speed:" in line:
            assert parser.link_speed(line.rsplit(":", 1)[1]) == 32.0
    assert parser.link_speed("8.0 GT/s") == 8.0
    assert parser.link_speed("Unknown") is None and parser.link_speed("") is None
    with pytest.raises(ParseError, match="sysfs link speed"):
        parser.link_speed("fast")


# ---- the fact's parser -----------------------------------------------------------------------

def test_the_h100_machine_s_own_fact() -> None:
    state = parser.pcie_state(capture("pcie-fact-h100-vm.txt"))
    assert state["cmdline"].startswith("mitigations=auto")
    assert state["iommus"] == [] and state["acs"] is None and state["acs_unknown"] is None
    (gpu,) = state["devices"]
    assert gpu == {"kind": "gpu", "address": "0000:00:06.0", "vendor": "0x10de",
                   "class": "0x030200", "width": 16, "max_width": 16, "speed": 32.0,
                   "max_speed": 32.0, "iommu_group_type": None, "path": []}
    assert pcie.gpu_nic_paths(state["devices"]) == []
    assert checks.acs_problems(state) == ([], [])
    assert checks.iommu_problem(state) == (None, None)
    assert checks.link_problems(state) == []


def test_the_parser_refuses_what_it_cannot_place() -> None:
    with pytest.raises(ParseError, match="@cmdline"):
        parser.pcie_state("@iommu dmar0\n")
    with pytest.raises(ParseError, match="@cmdline, @iommu"):
        parser.pcie_state("@cmdline ro\nsomething else\n")
    with pytest.raises(ParseError, match="@dev"):
        parser.pcie_state("@cmdline ro\n@dev|gpu|0000:00:06.0|0x10de\n")
    with pytest.raises(ParseError, match="a sysfs path ending in"):
        parser.pcie_state("@cmdline ro\n@dev|gpu|0000:00:06.0|0x10de|0x030200|16|16|||"
                        "|/sys/devices/pci0000:00/0000:00:07.0\n")
    with pytest.raises(ParseError, match="a PCI address"):
        parser.pcie_state("@cmdline ro\n@acs $(reboot) 0000\n")
    with pytest.raises(ParseError, match="at most"):
        parser.pcie_state("@cmdline ro\n" + "@iommu x\n" * (parser.LIMIT // 8))


def test_a_device_behind_a_vmd_domain() -> None:
    state = parser.pcie_state("@cmdline ro\n@dev|nic|10000:01:00.0|0x15b3|0x020700|16|16|||"
                              "|/sys/devices/pci0000:00/0000:00:0e.0/pci10000:00/"
                              "10000:00:02.0/10000:01:00.0\n")
    assert state["devices"][0]["path"] == ["0000:00:0e.0", "10000:00:02.0"]


def test_setpci_answers() -> None:
    assert parser._word("001d") == 0x1d
    assert parser._word("setpci: 0000:01:00.0: Instance #0 of Extended capability 000d not "
                      "found - there are no capabilities with that id.") is None
    assert parser._word("setpci: Unable to read 2 bytes") == "setpci: Unable to read 2 bytes"
    assert str(parser._word("FFFF")).startswith("ffff: the device does not answer")


def device(kind: str, address: str, path: list[str], **fields: Any) -> dict[str, Any]:
    values = {"kind": kind, "address": address, "vendor": "0x10de", "class": "0x030200",
              "width": 16, "max_width": 16, "speed": 32.0, "max_speed": 32.0,
              "iommu_group_type": "identity", "path": path}
    values.update(fields)
    return values


def test_each_gpu_s_nearest_nics_through_the_deepest_shared_bridge() -> None:
    sw = ["0000:15:01.0", "0000:16:00.0"]
    devices = [device("gpu", "0000:18:00.0", [*sw, "0000:17:00.0"]),
               device("nic", "0000:19:00.0", [*sw, "0000:17:01.0"]),
               device("nic", "0000:1a:00.0", [*sw, "0000:17:02.0"]),
               device("nic", "0000:2a:00.0", ["0000:15:02.0", "0000:26:00.0"]),
               device("gpu", "0000:b8:00.0", ["0000:b0:01.0", "0000:b7:00.0"])]
    paths = pcie.gpu_nic_paths(devices)
    assert [(p["gpu"], p["nic"], p["shared"], p["bridges"]) for p in paths] == [
        ("0000:18:00.0", "0000:19:00.0", "0000:16:00.0",
         ["0000:16:00.0", "0000:17:00.0", "0000:17:01.0"]),
        ("0000:18:00.0", "0000:1a:00.0", "0000:16:00.0",
         ["0000:16:00.0", "0000:17:00.0", "0000:17:02.0"])]  # not the NIC under the root port
    state = {"devices": devices, "acs": {"0000:17:02.0": 0x1d}, "acs_unknown": None}
    assert pcie.path_bridges(state) == ["0000:16:00.0", "0000:17:00.0", "0000:17:01.0",
                                        "0000:17:02.0"]
    assert checks.acs_problems(state) == ([
        "GPU 0000:18:00.0 -> switch 0000:16:00.0 -> NIC 0000:1a:00.0: ACS ReqRedir+ "
        "CmpltRedir+ on port 0000:17:02.0"], [])
    assert checks.acs_problems({**state, "acs": None, "acs_unknown": "setpci not found "
                                "(pciutils)"}) == ([], ["ACS: setpci not found (pciutils)"])


# ---- the fact's shell, over the lab's stand-in tree -----------------------------------------

@pytest.fixture
def tree(tmp_path: Path) -> Path:
    fakepci.materialise(tmp_path)
    return tmp_path


def gather(root: Path, devctl: bool = False) -> dict[str, Any]:
    fact = pcie_fact(str(root), devctl)
    proc = subprocess.run(["sh", "-c", fact.shell], capture_output=True, text=True, check=False,
                          env={**os.environ, "PATH": f"{root}/bin:{os.environ['PATH']}"},
                          timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result: dict[str, Any] = fact.parse(proc.stdout)
    return result


def put(root: Path, address: str, name: str, value: str) -> None:
    (root / fakepci.device_dir(address) / name).write_text(value + "\n")


def test_the_healthy_tree_passes(tree: Path) -> None:
    state = gather(tree, devctl=True)
    assert [(d["kind"], d["address"]) for d in state["devices"]] == [
        ("gpu", "0000:03:00.0"), ("nic", "0000:04:00.0"), ("gpu", "0000:83:00.0"),
        ("nic", "0000:84:00.0")]
    assert state["iommus"] == ["dmar0"] and "iommu=pt" in state["cmdline"]
    assert [(p["gpu"], p["nic"], p["shared"]) for p in pcie.gpu_nic_paths(state["devices"])] \
        == [("0000:03:00.0", "0000:04:00.0", "0000:01:00.0"),
            ("0000:83:00.0", "0000:84:00.0", "0000:81:00.0")]
    if os.geteuid() == 0:
        assert state["acs"]["0000:01:00.0"] is None  # the switch's upstream port has no ACS
        assert state["acs"]["0000:02:01.0"] == 0
    assert checks.acs_problems(state) == ([], [])
    assert checks.iommu_problem(state) == (None, None)
    assert checks.link_problems(state) == []
    assert checks.devctl_problems(state, 4096, True) == ([], [])
    assert "@devctl" not in pcie_fact(str(tree)).shell


@pytest.mark.skipif(os.geteuid() != 0, reason="ACS is read as root only")
def test_acs_on_a_switch_port_between_a_gpu_and_its_nic(tree: Path) -> None:
    put(tree, "0000:82:01.0", "lab-acs-ctl", fakepci.ACS_ON)
    assert checks.acs_problems(gather(tree)) == ([
        "GPU 0000:83:00.0 -> switch 0000:81:00.0 -> NIC 0000:84:00.0: ACS ReqRedir+ "
        "CmpltRedir+ on port 0000:82:01.0"], [])


def test_the_iommu_translating(tree: Path) -> None:
    put(tree, "0000:04:00.0", "iommu_group/type", "DMA-FQ")
    (tree / "proc" / "cmdline").write_text("BOOT_IMAGE=/boot/vmlinuz ro intel_iommu=on\n")
    assert checks.iommu_problem(gather(tree)) == (
        "IOMMU in translation mode for NIC 0000:04:00.0 (DMA-FQ) (kernel command line: "
        "intel_iommu=on), expected passthrough (iommu=pt)", None)


def test_iommu_without_group_types() -> None:
    state = {"cmdline": "ro quiet", "iommus": ["dmar0"], "devices": [
        device("gpu", "0000:03:00.0", [], iommu_group_type=None)]}
    assert checks.iommu_problem(state) == (None, "IOMMU dmar0 on, no IOMMU group type "
                                                 "readable, kernel command line: no iommu "
                                                 "option")
    assert checks.iommu_problem({**state, "cmdline": "ro iommu=pt"}) == (None, None)
    assert checks.iommu_problem({**state, "iommus": []}) == (None, None)


def test_a_nic_at_x8_and_slow_links(tree: Path) -> None:
    put(tree, "0000:84:00.0", "current_link_width", "8")
    put(tree, "0000:04:00.0", "current_link_speed", "16.0 GT/s PCIe")
    put(tree, "0000:03:00.0", "current_link_speed", "2.5 GT/s PCIe")  # an idle GPU
    assert checks.link_problems(gather(tree)) == [
        "NIC 0000:04:00.0: link 16 GT/s, capable of 32 GT/s",
        "NIC 0000:84:00.0: link x8, capable of x16"]
    put(tree, "0000:03:00.0", "current_link_width", "8")
    assert checks.link_problems(gather(tree))[0] == "GPU 0000:03:00.0: link x8, capable of x16"


def test_nic_device_control(tree: Path) -> None:
    put(tree, "0000:84:00.0", "lab-devctl", "2947")
    state = gather(tree, devctl=True)
    assert checks.devctl_problems(state, 4096, True) == ([
        "NIC 0000:84:00.0: MaxReadReq 512 bytes, expected 4096 (pcie_nic_max_read_request)",
        "NIC 0000:84:00.0: relaxed ordering off, expected on (pcie_nic_relaxed_ordering)"], [])
    state["devctl"].pop("0000:04:00.0")
    assert checks.devctl_problems(state, None, True)[1] == [
        "NIC 0000:04:00.0: Device Control: not read"]


def test_the_fact_in_the_composed_round_trip(tree: Path) -> None:
    fact = pcie_fact(str(tree))
    nonce = script.new_nonce()
    composed = script.compose([script.Snippet(fact.name, fact.shell, fact.guard)], nonce)
    proc = subprocess.run(["sh", "-c", composed], capture_output=True, text=True, check=True,
                          env={**os.environ, "PATH": f"{tree}/bin:{os.environ['PATH']}"},
                          timeout=60)
    section = script.split(proc.stdout, nonce)[NAME]
    assert section.rc == 0
    assert len(fact.parse(section.text)["devices"]) == 4


def test_no_acs_read_without_nics(tree: Path) -> None:
    for name in ("class", "vendor"):
        for nic in fakepci.NICS:
            put(tree, nic, name, "0x8086" if name == "vendor" else "0x010802")
    state = gather(tree)
    assert {d["kind"] for d in state["devices"]} == {"gpu"} and state["acs"] is None


# ---- the suite's variables -------------------------------------------------------------------

def inventory(tmp_path: Path, host_vars: str = "") -> Inventory:
    (tmp_path / "hosts.yml").write_text("all:\n  hosts:\n    gpu01:\n      ansible_host: "
                                        "10.0.0.11\n" + textwrap.indent(
                                            textwrap.dedent(host_vars), " " * 6))
    return load_inventory(tmp_path / "hosts.yml")


def test_suite_variables(tmp_path: Path) -> None:
    suite = registry.suite("pcie")
    host = inventory(tmp_path, "pcie_nic_max_read_request: 4096\n").hosts["gpu01"]
    assert PcieSettings.read(host).pcie_nic_max_read_request == 4096
    assert suite.facts is not None
    assert suite.facts(host).custom == frozenset({pcie_fact("", True)})
    assert suite.check is not None
    with pytest.raises(VarError, match="pcie_nic_max_read_request must be one of 128"):
        suite.check(suite.vars(inventory(tmp_path, "pcie_nic_max_read_request: 3000\n")
                               .hosts["gpu01"]))
    with pytest.raises(VarError, match="pcie_sys_root must be an absolute path"):
        suite.check(suite.vars(inventory(tmp_path, "pcie_sys_root: 'x; reboot'\n")
                               .hosts["gpu01"]))


# ---- the role --------------------------------------------------------------------------------

def role_facts(state: dict[str, Any], files: dict[str, str] | None = None) -> Facts:
    values: dict[str, Any] = {NAME: state, "systemd": True,
                              f"link:{UNIT_LINK}": "../gpufleet-pcie-acs.service"}
    for path in (SCRIPT, UNIT):
        content = (files or {}).get(path)
        values[f"file:{path}"] = FileState(path, content is not None, (content or "").encode(),
                                           "755" if path == SCRIPT else "644", "root:root")
    return Facts("gpu01", values=values)


def role_plan(inv: Inventory, facts: Facts) -> list[Change]:
    host = inv.hosts["gpu01"]
    return ROLE.plan(facts, RoleVars(host, ROLE.defaults), PlanContext(inv, host))


def test_the_role_is_opt_in(tmp_path: Path) -> None:
    def active(inv: Inventory) -> bool:
        return ROLE.active(RoleVars(inv.hosts["gpu01"], ROLE.defaults))

    assert not active(inventory(tmp_path))
    assert active(inventory(tmp_path, "pcie_acs_disable: true\n"))
    with pytest.raises(VarError, match="pcie_sys_root"):
        ROLE.check(RoleVars(inventory(tmp_path, "pcie_acs_disable: true\npcie_sys_root: "
                                                "relative\n").hosts["gpu01"], ROLE.defaults))


def test_the_role_clears_acs_on_the_gpu_nic_bridges_now_and_at_boot(tmp_path: Path,
                                                                     tree: Path) -> None:
    inv = inventory(tmp_path, f"pcie_acs_disable: true\npcie_sys_root: {tree}\n")
    put(tree, "0000:02:01.0", "lab-acs-ctl", fakepci.ACS_ON)
    state = gather(tree)
    if os.geteuid() != 0:
        pytest.skip("ACS is read as root only")
    changes = role_plan(inv, role_facts(state))
    files = {c.resource.removeprefix("file "): c.steps[0].content.decode()  # type: ignore[attr-defined]
             for c in changes if c.kind == "file"}
    acs = [c for c in changes if c.kind == "acs"]
    assert [(c.resource, c.before, c.after) for c in acs] == [
        ("acs 0000:02:01.0", "ReqRedir+ CmpltRedir+ (ACSCtl 001d)", "redirects off")]
    (step,) = acs[0].steps
    assert isinstance(step, Run)
    assert step.command == (f"[ ! -e {tree}/sys/bus/pci/devices/0000:02:01.0 ] || "
                            "setpci -s 0000:02:01.0 ECAP_ACS+6.w=0000:002c")
    assert set(files) == {SCRIPT, UNIT}
    assert files[SCRIPT].count("setpci -s ") == 6  # both switches: upstream and both ports
    assert f"ExecStart=/bin/sh {SCRIPT}" in files[UNIT]
    subprocess.run(["sh", "-c", step.command], check=True,
                   env={**os.environ, "PATH": f"{tree}/bin:{os.environ['PATH']}"})
    assert role_plan(inv, role_facts(gather(tree), files)) == []


def test_the_role_reports_the_iommu_and_never_writes_it(tmp_path: Path) -> None:
    inv = inventory(tmp_path, "pcie_acs_disable: true\n")
    state = {"cmdline": "ro intel_iommu=on", "iommus": ["dmar0"], "acs": None,
             "acs_unknown": None, "devctl": {},
             "devices": [device("gpu", "0000:00:06.0", [], iommu_group_type="DMA")]}
    (change,) = role_plan(inv, role_facts(state))
    assert (change.resource, change.action, change.steps) == ("cmdline iommu", MANUAL, [])
    assert change.before == "translation: GPU 0000:00:06.0 (DMA); kernel command line " \
                            "'ro intel_iommu=on'"
    inv = inventory(tmp_path, "pcie_acs_disable: true\npcie_iommu_passthrough: false\n")
    assert role_plan(inv, role_facts(state)) == []


def test_the_role_fails_where_acs_cannot_be_read(tmp_path: Path) -> None:
    inv = inventory(tmp_path, "pcie_acs_disable: true\n")
    sw = ["0000:15:01.0", "0000:16:00.0"]
    state = {"cmdline": "ro iommu=pt", "iommus": [], "acs": None,
             "acs_unknown": "setpci not found (pciutils)", "devctl": {},
             "devices": [device("gpu", "0000:18:00.0", [*sw, "0000:17:00.0"]),
                         device("nic", "0000:19:00.0", [*sw, "0000:17:01.0"])]}
    acs = [c for c in role_plan(inv, role_facts(state)) if c.kind == "acs"]
    (step,) = acs[0].steps
    assert isinstance(step, Fail) and step.message == "setpci not found (pciutils)"
