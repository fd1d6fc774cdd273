"""The roce_qos role (its fact, its plan per port, its boot unit) and the health check's
roce_qos check, whose copy of the mlnx_qos and dcb readers is held to the controller's on
every capture."""

from __future__ import annotations

import base64
import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from gpufleet.errors import ParseError, VarError
from gpufleet.facts.formats import FileState
from gpufleet.facts.gather import Facts
from gpufleet.facts.parsers import qos
from gpufleet.inventory.load import load_inventory
from gpufleet.inventory.model import Inventory
from gpufleet.node import healthcheck as program
from gpufleet.provision.plan import Change, Fail, Run
from gpufleet.provision.role import PlanContext, RoleVars
from gpufleet.roles.roce_qos import CONFIG, ROLE, SCRIPT, UNIT, UNIT_LINK
from tests.conftest import FIXTURES

MLNX_QOS = [FIXTURES / "published" / name for name in (
    "mlnx-qos-i-connectx7-mlnx-ofed-23.10-ets-strict-pfc5.txt",
    "mlnx-qos-i-connectx5-firmware-dcbx-doca-3.2.txt")] + \
    [FIXTURES / "samples" / name for name in (
        "mlnx_qos_dscp_trust_prio3.txt", "mlnx_qos_blank_lines.txt",
        "synthetic_mlnx_qos_buffers_ets.txt", "synthetic_mlnx_qos_pcp_trust.txt")]
DCB_JSON = [FIXTURES / "samples" / "synthetic_dcb_pfc_json.txt",
            FIXTURES / "published" / "dcb-j-pfc-show-veth-iproute2-6.1.txt",
            FIXTURES / "published" / "dcb-j-pfc-show-missing-dev-iproute2-6.1.txt"]
CX7 = MLNX_QOS[0].read_text()


# ---- the node program's copy of the readers ------------------------------------------------

@pytest.mark.parametrize("path", MLNX_QOS, ids=lambda p: p.name)
def test_the_node_program_reads_mlnx_qos_as_the_controller_does(path: Path) -> None:
    text = path.read_text()
    parsed = qos.mlnx_qos(text)
    assert program.parse_mlnx_qos(text) == (parsed["trust"], parsed["pfc_enabled"])


@pytest.mark.parametrize("path", DCB_JSON, ids=lambda p: p.name)
def test_the_node_program_reads_dcb_as_the_controller_does(path: Path) -> None:
    text = path.read_text()
    try:
        expected: list[int] | None = qos.dcb_pfc_json(text)["prio_pfc"]
    except ParseError:
        expected = None
    try:
        found: list[int] | None = program.parse_dcb_pfc(text)
    except ValueError:
        found = None
    assert found == expected


@pytest.mark.parametrize("document", [
    '{"pfc_cap":8,"delay":0,"prio_pfc":{"0":false,"1":false,"2":false,"3":true,"4":false,'
    '"5":false,"6":false,"7":false}}',
    '[{"pfc_cap":8,"delay":0,"prio_pfc":[{"0":"off"},{"1":"off"},{"2":"off"},{"3":"on"},'
    '{"4":"off"},{"5":"off"},{"6":"off"},{"7":"off"}]}]',
    '{"pfc_cap":8,"delay":0,"prio_pfc":[false,true]}',
])
def test_both_dcb_readers_agree_on_every_shape(document: str) -> None:
    try:
        expected: list[int] | None = qos.dcb_pfc_json(document)["prio_pfc"]
    except ParseError:
        expected = None
    try:
        found: list[int] | None = program.parse_dcb_pfc(document)
    except ValueError:
        found = None
    assert found == expected


@pytest.mark.parametrize("text", [
    CX7.replace("Priority trust state: dscp", "Priority trust state: vlan"),
    CX7.replace("enabled     0   0   0   0   0   1   0   0", "enabled     0   1"),
    "",
])
def test_both_mlnx_qos_readers_refuse_what_they_cannot_read(text: str) -> None:
    with pytest.raises(ParseError):
        qos.mlnx_qos(text)
    with pytest.raises(ValueError, match="mlnx_qos"):
        program.parse_mlnx_qos(text)


# ---- the fact --------------------------------------------------------------------------------

def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def test_the_fact_reads_each_port_and_its_ecn() -> None:
    text = "\n".join([
        "tool mlnx_qos",
        f"port fab0 0 {b64(CX7)}",
        "ecn fab0 roce_np 5 1", "ecn fab0 roce_rp 5 0",
        f"port fab1 1 {b64('Netlink error: No such device')}",
    ])
    state = qos.roce_qos_fact(text)
    assert state["tool"] == "mlnx_qos"
    assert state["ports"]["fab0"] == {"trust": "dscp", "pfc": [5], "ecn": {5: (True, False)},
                                      "error": None}
    assert qos.roce_qos_fact("tool dcb\necn eth2 roce_rp 3 1\n")["ports"]["eth2"]["ecn"] == \
        {3: (None, True)}
    assert state["ports"]["fab1"]["error"] == \
        "mlnx_qos failed (exit 1): Netlink error: No such device"


def test_the_fact_under_dcb_and_without_a_tool() -> None:
    dcb = (FIXTURES / "samples" / "synthetic_dcb_pfc_json.txt").read_text()
    state = qos.roce_qos_fact(f"tool dcb\nport eth2 0 {b64(dcb)}\n")
    assert state["ports"]["eth2"]["pfc"] == [3] and state["ports"]["eth2"]["trust"] is None
    none = qos.roce_qos_fact("tool none\nport eth2 127\n")
    assert none["ports"]["eth2"]["error"] == "neither mlnx_qos nor dcb on the node"
    with pytest.raises(ParseError, match="a 'tool' line"):
        qos.roce_qos_fact("")


# ---- the plan --------------------------------------------------------------------------------

DECLARED = "roce_qos: true\nrdma: {pfc_priority: 5, trust: dscp, ecn: true}\n"


def inventory(tmp_path: Path, host_vars: str = DECLARED) -> Inventory:
    head = "all:\n  hosts:\n    gpu01:\n      ansible_host: 10.0.0.11\n"
    (tmp_path / "hosts.yml").write_text(head + textwrap.indent(host_vars, " " * 6))
    return load_inventory(tmp_path / "hosts.yml")


def port(trust: str | None = "dscp", pfc: list[int] | None = None,
         ecn: tuple[bool, bool] | None = (True, True), error: str | None = None
         ) -> dict[str, Any]:
    return {"trust": trust, "pfc": [5] if pfc is None else pfc,
            "ecn": {} if ecn is None else {5: ecn}, "error": error}


def facts(ports: dict[str, dict[str, Any]], tool: str = "mlnx_qos",
          files: dict[str, str] | None = None, systemd: bool = True) -> Facts:
    values: dict[str, Any] = {"roce_qos": {"tool": tool, "ports": ports}, "systemd": systemd,
                              f"link:{UNIT_LINK}": "../gpufleet-roce-qos.service"}
    for path in (SCRIPT, CONFIG, UNIT):
        content = (files or {}).get(path)
        values[f"file:{path}"] = FileState(path, content is not None, (content or "").encode(),
                                           "755" if path == SCRIPT else "644", "root:root")
    return Facts("gpu01", values=values)


def plan(inv: Inventory, f: Facts) -> list[Change]:
    h = inv.hosts["gpu01"]
    return ROLE.plan(f, RoleVars(h, ROLE.defaults), PlanContext(inv, h))


def files_of(inv: Inventory, f: Facts) -> dict[str, str]:
    return {c.resource.removeprefix("file "): c.steps[0].content.decode()  # type: ignore[attr-defined]
            for c in plan(inv, f) if c.resource.startswith("file ")}


def test_a_port_whose_pfc_a_reboot_cleared_is_set_again(tmp_path: Path) -> None:
    inv = inventory(tmp_path)
    good = {"fab0": port(), "fab1": port()}
    files = files_of(inv, facts(good))
    assert plan(inv, facts(good, files=files)) == []
    rebooted = {"fab0": port(), "fab1": port(trust="pcp", pfc=[], ecn=(False, False))}
    changes = plan(inv, facts(rebooted, files=files))
    assert [(c.item, c.before, c.after) for c in changes] == [
        ("roce_qos/qos fab1", "trust pcp, PFC off, ECN off", "trust dscp, PFC 5, ECN on")]
    step = changes[0].steps[0]
    assert isinstance(step, Run)
    assert step.command == (
        "mlnx_qos -i fab1 --trust dscp --pfc 0,0,0,0,0,1,0,0 >/dev/null && "
        "echo 1 > /sys/class/net/fab1/ecn/roce_np/enable/5 && "
        "echo 1 > /sys/class/net/fab1/ecn/roce_rp/enable/5")


def test_the_boot_unit_waits_for_its_ports_and_the_script_runs_each(tmp_path: Path) -> None:
    inv = inventory(tmp_path, DECLARED + "kernel_state_root: /run/lab\n")
    files = files_of(inv, facts({"fab0": port(), "ib-rail1": port()}))
    unit = files[UNIT]
    assert "Wants=sys-subsystem-net-devices-fab0.device " \
           "sys-subsystem-net-devices-ib\\x2drail1.device" in unit
    assert f"ExecStart=/bin/sh {SCRIPT}" in unit
    script = files[SCRIPT]
    assert "{ mlnx_qos -i fab0 --trust dscp --pfc 0,0,0,0,0,1,0,0 >/dev/null && echo 1 > " \
           "/run/lab/sys/class/net/fab0/ecn/roce_np/enable/5" in script
    assert 'echo "gpufleet-roce-qos: ib-rail1 failed" >&2; rc=1; }' in script
    config = json.loads(files[CONFIG])
    assert config | {"_comment": ""} == {"_comment": "", "ports": ["fab0", "ib-rail1"],
                                          "root": "/run/lab", "pfc_priority": 5,
                                          "trust": "dscp", "ecn": True}


def test_dcb_sets_pfc_and_cannot_set_trust(tmp_path: Path) -> None:
    inv = inventory(tmp_path, "roce_qos: true\nrdma: {pfc_priority: 3}\n")
    changes = plan(inv, facts({"eth2": port(trust=None, pfc=[])}, tool="dcb"))
    step = next(c for c in changes if c.resource == "qos eth2").steps[0]
    assert isinstance(step, Run)
    assert step.command == \
        "dcb pfc set dev eth2 prio-pfc 0:off 1:off 2:off 3:on 4:off 5:off 6:off 7:off"
    trust = inventory(tmp_path, "roce_qos: true\nrdma: {pfc_priority: 3, trust: dscp}\n")
    change = next(c for c in plan(trust, facts({"eth2": port(trust=None)}, tool="dcb"))
                  if c.resource == "qos eth2")
    assert isinstance(change.steps[0], Fail)
    assert "only be set with mlnx_qos" in change.steps[0].message


def test_a_node_without_a_tool_or_ecn_fails_naming_the_port(tmp_path: Path) -> None:
    inv = inventory(tmp_path)
    none = plan(inv, facts({"fab0": port(error="x")}, tool="none"))
    assert [c.resource for c in none] == [f"file {CONFIG}", "qos fab0"]
    assert "neither mlnx_qos" in none[-1].steps[0].message  # type: ignore[attr-defined]
    no_ecn = plan(inv, facts({"fab0": port(ecn=None)}))[-1]
    assert "fab0: no ECN settings in sysfs" in no_ecn.steps[0].message  # type: ignore[attr-defined]


def test_opt_in_and_the_declaration_is_checked(tmp_path: Path) -> None:
    assert not ROLE.active(RoleVars(inventory(tmp_path, "rdma: {pfc_priority: 3}\n")
                                    .hosts["gpu01"], ROLE.defaults))
    for bad in ("rdma: {pfc_priority: 9}", "rdma: {trust: vlan}", "rdma: {ecn: true}",
                "rdma: {pfc_priority: 3, mtu: 4200}", "rdma: {}",
                "rdma: {pfc_priority: 3}\nroce_qos_ports: ['eth0; reboot']"):
        inv = inventory(tmp_path, f"roce_qos: true\n{bad}\n")
        with pytest.raises(VarError):
            ROLE.check(RoleVars(inv.hosts["gpu01"], ROLE.defaults))


# ---- the health check ------------------------------------------------------------------------

@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A node whose roce_qos.json declares fab0 and fab1 (PFC 5, trust dscp, ECN), its
    stand-in sysfs under tmp_path, ECN on for both."""
    config = tmp_path / "roce-qos.json"
    config.write_text(json.dumps({"ports": ["fab0", "fab1"], "pfc_priority": 5,
                                  "trust": "dscp", "ecn": True, "root": str(tmp_path)}))
    monkeypatch.setattr(program, "ROCE_QOS_CONFIG", str(config))
    for name in ("fab0", "fab1"):
        for kind in ("roce_np", "roce_rp"):
            enable = tmp_path / "sys" / "class" / "net" / name / "ecn" / kind / "enable"
            enable.mkdir(parents=True)
            (enable / "5").write_text("1\n")
    return tmp_path


def check(outputs: dict[str, program.Output | None]) -> program.Result:
    run = program.Run("periodic", dict(program.DEFAULTS), program.Deadline(6.0))

    def fake(argvs: list[list[str]], deadline: program.Deadline,
             cap: float) -> list[program.Output | None]:
        return [outputs.get(argv[0]) if argv[0] in ("mlnx_qos", "dcb") else None
                for argv in argvs]

    original = program.run_all
    program.run_all = fake
    try:
        return program.check_roce_qos(run)
    finally:
        program.run_all = original


def test_the_health_check_passes_ports_as_declared(node: Path) -> None:
    result = check({"mlnx_qos": program.Output(0, CX7)})
    assert (result.status, result.message) == ("PASS", "2 port(s) as declared (mlnx_qos)")


def test_the_health_check_names_the_port_a_reboot_cleared(node: Path) -> None:
    (node / "sys/class/net/fab1/ecn/roce_rp/enable/5").write_text("0\n")
    cleared = CX7.replace("enabled     0   0   0   0   0   1   0   0",
                          "enabled     0   0   0   0   0   0   0   0")
    result = check({"mlnx_qos": program.Output(0, cleared)})
    assert result.status == "FAIL"
    assert result.message.startswith("fab0: PFC on no priority, expected 5; fab1: PFC on no "
                                     "priority, expected 5, ECN roce_rp off on priority 5")


def test_the_health_check_falls_back_to_dcb_and_skips_without_a_declaration(
        node: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dcb = (FIXTURES / "samples" / "synthetic_dcb_pfc_json.txt").read_text()
    result = check({"dcb": program.Output(0, dcb)})
    assert (result.status, result.message) == ("FAIL", "fab0: PFC on 3, expected 5; fab1: PFC "
                                                       "on 3, expected 5")
    assert check({}).message == "neither mlnx_qos nor dcb is installed"
    monkeypatch.setattr(program, "ROCE_QOS_CONFIG", str(node / "absent.json"))
    assert check({}).status == "SKIP"


def test_the_health_check_runs_in_the_periodic_context_only() -> None:
    entry = next(c for c in program.CATALOGUE if c.name == "roce_qos")
    assert entry.contexts == ("periodic",)


def test_run_all_bounds_every_port_by_one_deadline() -> None:
    outputs = program.run_all([["sleep", "5"], ["true"], ["no-such-tool-gpufleet"]],
                              program.Deadline(0.5), 3.0)
    assert outputs[0] is not None and outputs[0].rc is None
    assert outputs[1] == program.Output(0, "")
    assert outputs[2] is None
