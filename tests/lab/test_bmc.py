"""Power and cooling from BMCs: a Redfish service per lab node on the controller's loopback
(sushy-tools' static mockup server behind HTTPS and basic authentication, gpufleet.lab.bmc),
and an IPMI BMC (OpenIPMI's simulator, read with ipmitool, gpufleet.lab.ipmi).
node05 and node06 share rack A; node08 declares no BMC. Each fault of the issue is injected
in the mockup files and fails the right node or rack; the password never appears in any
output."""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpufleet import app
from gpufleet.lab import ipmi as ipmi_lab
from gpufleet.lab.bmc import LabBmcs, running
from gpufleet.lab.cluster import Lab
from gpufleet.lab.ipmi import LabIpmiBmc
from tests.lab.conftest import TEST_NET, node_sh

WITH_BMC = ("node05", "node06", "node07")
NODES = (*WITH_BMC, "node08")
RACK = {"rack": "rackA", "rack_power_w": 20000, "rack_cooling": "liquid"}
PASSWORD = "lab-bmc-Pa55-w0rd-9d1f"
IPMI_PASSWORD = "lab-Ipmi-Pa55-7c1e"  # IPMI 2.0 passwords are at most 20 bytes
BASELINE = "/etc/gpufleet/baseline.json"


@pytest.fixture(scope="module")
def bmcs(lab: Lab) -> Iterator[LabBmcs]:
    ports = {node: 20000 + TEST_NET * 10 + i for i, node in enumerate(WITH_BMC)}
    with running(lab.config.root / "bmc", ports, "gfmonitor", PASSWORD) as found:
        yield found


@contextlib.contextmanager
def host_vars(inventory: Path, values: dict[str, dict[str, Any]]) -> Iterator[None]:
    """host_vars files for the nodes while the context lasts."""
    (inventory / "host_vars").mkdir(exist_ok=True)
    paths = []
    try:
        for node, variables in values.items():
            path = inventory / "host_vars" / f"{node}.yml"
            assert not path.exists(), path
            path.write_text(yaml.safe_dump(variables))
            paths.append(path)
        yield
    finally:
        for path in paths:
            path.unlink()


def declared(bmcs: LabBmcs, **overrides: dict[str, Any]) -> dict[str, dict[str, Any]]:
    values: dict[str, dict[str, Any]] = {n: {**bmcs.inventory_vars(n), "psu_redundancy": "N+1"}
                                         for n in WITH_BMC}
    for node in ("node05", "node06"):
        values[node].update(RACK)
    for node, extra in overrides.items():
        values.setdefault(node, {}).update(extra)
    return values


def run(inventory: Path, tmp_path: Path, name: str, **options: Any
        ) -> tuple[int, dict[tuple[str, str], tuple[str, str]], str, dict[str, Any]]:
    report, junit = tmp_path / f"{name}.json", tmp_path / f"{name}.xml"
    console = io.StringIO()
    code = app.conformance_cmd(str(inventory), limit=":".join(NODES), suites="bmc",
                               json_path=str(report), junit_path=str(junit), out=console,
                               **options)
    doc = json.loads(report.read_text())
    found = {(r["host"], r["check"].removeprefix("test_")): (r["outcome"], r.get("message") or "")
             for r in doc["results"]}
    output = report.read_text() + junit.read_text() + console.getvalue()
    return code, found, output, doc


def test_a_clean_lab_passes_and_no_bmc_is_never_passed(lab: Lab, bmcs: LabBmcs,
                                                       tmp_path: Path) -> None:
    inventory = lab.config.inventory_dir
    with host_vars(inventory, declared(bmcs)):
        code, found, output, doc = run(inventory, tmp_path, "clean")
    assert code == 0, found
    for node in WITH_BMC:
        for check in ("power_supplies", "inlet_temperature_and_fans",
                      "no_new_critical_events"):
            assert found[(node, check)] == ("pass", ""), (node, check)
    for check in ("power_supplies", "inlet_temperature_and_fans", "no_new_critical_events"):
        assert found[("node08", check)] == ("skip", "not checked: no BMC (declare bmc_address, "
                                                    "bmc_user and bmc_password)")
    assert found[("fleet", "rack_power_budget")] == ("pass", "")
    rack = doc["data"]["racks"]["budgets"]["rackA"]
    assert rack == {"supply_w": 20000.0, "margin": 0.8, "budget_w": 16000.0,
                    "cooling": "liquid", "used_w": 12200.0, "use": 0.7625,
                    "nodes": {"node05": 6100.0, "node06": 6100.0}}
    assert doc["data"]["bmc"]["node05"]["psus"][0] == {
        "name": "PSU1", "capacity_w": 3000.0, "health": "OK", "state": "Enabled",
        "output_w": 1300.0}
    assert PASSWORD not in output


def test_each_fault_fails_its_node_or_rack(lab: Lab, bmcs: LabBmcs, tmp_path: Path) -> None:
    inventory = lab.config.inventory_dir
    bmcs.bmcs["node05"].fail_psu(1)
    bmcs.bmcs["node05"].set_power(9000, 9800)
    bmcs.bmcs["node06"].rate_psus(1500)
    bmcs.bmcs["node07"].set_inlet(41)
    bmcs.bmcs["node07"].add_event("Critical", "PSU3 AC lost")
    try:
        with host_vars(inventory, declared(bmcs)):
            code, found, output, _ = run(inventory, tmp_path, "faults")
    finally:
        for bmc in bmcs.bmcs.values():
            bmc.set_power(5200, 6100)
            bmc.rate_psus(3000)
            bmc.set_inlet(24)
        reset = bmcs.bmcs["node05"].load("Chassis/GPU-Server/Power")
        reset["PowerSupplies"][1]["Status"] = {"State": "Enabled", "Health": "OK"}
        bmcs.bmcs["node05"].store("Chassis/GPU-Server/Power", reset)
        sel = bmcs.bmcs["node07"].load("Managers/BMC/LogServices/SEL/Entries")
        sel["Members"] = sel["Members"][:2]
        bmcs.bmcs["node07"].store("Managers/BMC/LogServices/SEL/Entries", sel)
    assert code == 1
    assert found[("node05", "power_supplies")] == ("fail", (
        "power supply PSU2 (UnavailableOffline, health Critical); healthy PSUs are rated "
        "9000 W in all, under 1.3 x the measured peak of 9800 W (12740 W); N+1 redundancy: "
        "after losing 1 of the 3 healthy PSUs, 6000 W is left for a measured peak of 9800 W "
        "(measured peak from the BMC's highest over its interval)"))
    assert found[("node06", "power_supplies")] == ("fail", (
        "healthy PSUs are rated 6000 W in all, under 1.3 x the measured peak of 6100 W "
        "(7930 W); N+1 redundancy: after losing 1 of the 4 healthy PSUs, 4500 W is left for "
        "a measured peak of 6100 W (measured peak from the BMC's highest over its interval)"))
    assert found[("node07", "power_supplies")][0] == "pass"
    assert found[("node07", "inlet_temperature_and_fans")] == ("fail", (
        "Inlet Temp reads 41 C, above 35 C (bmc_max_inlet_c)"))
    outcome, message = found[("node07", "no_new_critical_events")]
    assert outcome == "fail"
    assert message.startswith("1 critical event(s) in the BMC's logs in the last 24 h: "), message
    assert message.endswith(" PSU3 AC lost (entry 3 of /redfish/v1/Managers/BMC/LogServices/"
                            "SEL/Entries)"), message
    assert {n for n in NODES if found[(n, "no_new_critical_events")][0] == "fail"} == {"node07"}
    assert found[("node05", "inlet_temperature_and_fans")][0] == "pass"
    assert found[("fleet", "rack_power_budget")] == ("pass", ""), "15900 W of 16000 W"
    assert PASSWORD not in output


def test_a_rack_over_budget_fails_and_air_past_15_kw_warns(lab: Lab, bmcs: LabBmcs,
                                                          tmp_path: Path) -> None:
    inventory = lab.config.inventory_dir
    bmcs.bmcs["node06"].set_power(8000, 10900)
    try:
        with host_vars(inventory, declared(bmcs, node05={"rack_cooling": "air"},
                                           node06={"rack_cooling": "air"})):
            code, found, _, doc = run(inventory, tmp_path, "rack")
    finally:
        bmcs.bmcs["node06"].set_power(5200, 6100)
    assert code == 1
    assert found[("fleet", "rack_power_budget")] == ("fail", (
        "rack rackA: measured peaks add up to 17000 W, over its budget of 16000 W (0.8 x the "
        "20000 W supply)"))
    fleet = next(r for r in doc["results"] if r["check"] == "test_rack_power_budget")
    assert fleet["properties"]["warnings"] == [
        "rack rackA is air cooled and its nodes draw 17000 W at peak: air cooling tops out "
        "at 15-20 kW per rack"]


def test_the_recorded_peak_stands_in_for_an_unreachable_bmc_and_credentials_stay_secret(
        lab: Lab, bmcs: LabBmcs, tmp_path: Path) -> None:
    inventory = lab.config.inventory_dir
    try:
        with host_vars(inventory, declared(bmcs)):
            code, found, _, _ = run(inventory, tmp_path, "record", record_baseline=True)
        assert code == 0, found
        recorded = json.loads(node_sh(lab, "node06", f"cat {BASELINE}"))
        assert recorded["figures"]["power.peak_w"]["value"] == 6100
        wrong = "not-the-Pa55-of-this-bmc"
        with host_vars(inventory, declared(
                bmcs, node05={"bmc_password": wrong},
                node06={"bmc_address": f"127.0.0.1:{20000 + TEST_NET * 10 + 9}"})):
            code, found, output, _ = run(inventory, tmp_path, "broken")
    finally:
        for node in NODES:
            node_sh(lab, node, f"rm -f {BASELINE}", check=False)
    assert code == 1
    port = bmcs.bmcs["node05"].port
    assert found[("node05", "power_supplies")] == ("fail", (
        f"unknown: node05's BMC (https://127.0.0.1:{port}): the BMC refused the credentials "
        f"of 'gfmonitor' (HTTP 401/403)"))
    bad = 20000 + TEST_NET * 10 + 9
    assert found[("node06", "inlet_temperature_and_fans")] == ("fail", (
        f"unknown: node06's BMC (https://127.0.0.1:{bad}): unreachable: connection refused"))
    assert found[("fleet", "rack_power_budget")] == ("pass", "")
    assert PASSWORD not in output and wrong not in output


@pytest.fixture
def ipmi_bmc(lab: Lab) -> Iterator[LabIpmiBmc]:
    """node07's BMC as an IPMI BMC: OpenIPMI's simulator, spoken to with ipmitool."""
    port = 21000 + TEST_NET * 10
    with ipmi_lab.running(lab.config.root / "ipmi", {"node07": port}, "gfmonitor",
                          IPMI_PASSWORD) as found:
        yield found.bmcs["node07"]


def _over_ipmi(bmc: LabIpmiBmc, password: str = IPMI_PASSWORD) -> dict[str, Any]:
    return {"bmc_address": f"127.0.0.1:{bmc.port}", "bmc_protocol": "ipmi",
            "bmc_ipmi_cipher_suite": 3, "bmc_user": "gfmonitor", "bmc_password": password,
            "psu_rating_w": 3000, "psu_redundancy": "N+1"}


def test_an_ipmi_bmc_passes_then_its_failed_psu_hot_inlet_and_sel_entry_fail(
        lab: Lab, bmcs: LabBmcs, ipmi_bmc: LabIpmiBmc, tmp_path: Path) -> None:
    inventory = lab.config.inventory_dir
    values = declared(bmcs)
    values["node07"] = _over_ipmi(ipmi_bmc)
    with host_vars(inventory, values):
        code, clean, _, doc = run(inventory, tmp_path, "ipmi-clean")
        ipmi_bmc.fail_psu(1)
        ipmi_bmc.set_inlet(41)
        _, faults, output, _ = run(inventory, tmp_path, "ipmi-faults")
    assert code == 0, clean
    assert {clean[("node07", c)] for c in ("power_supplies", "inlet_temperature_and_fans",
                                           "no_new_critical_events")} == {("pass", "")}
    assert doc["data"]["bmc"]["node07"]["power_now_w"] == 5200.0
    assert faults[("node07", "power_supplies")] == ("fail", (
        "power supply PS2 Status (Enabled, health Critical) (measured peak from the BMC's "
        "chassis input power now)"))
    assert faults[("node07", "inlet_temperature_and_fans")] == ("fail", (
        "Inlet Temp reads 41 C, above 35 C (bmc_max_inlet_c)"))
    outcome, message = faults[("node07", "no_new_critical_events")]
    assert outcome == "fail"
    assert message.endswith(" Power Supply PS2 Status: Failure detected (entry 5 of SEL)"), message
    assert {n for n in WITH_BMC if faults[(n, "power_supplies")][0] == "fail"} == {"node07"}
    assert PASSWORD not in output and IPMI_PASSWORD not in output


def test_an_ipmi_bmc_that_refuses_the_password_is_unknown_without_the_secret(
        lab: Lab, bmcs: LabBmcs, ipmi_bmc: LabIpmiBmc, tmp_path: Path) -> None:
    inventory = lab.config.inventory_dir
    wrong = "not-this-Pa55word"
    values = declared(bmcs)
    values["node07"] = _over_ipmi(ipmi_bmc, wrong)
    with host_vars(inventory, values):
        code, found, output, _ = run(inventory, tmp_path, "ipmi-wrong")
    assert code == 1
    assert found[("node07", "power_supplies")] == ("fail", (
        f"unknown: node07's BMC (ipmi://127.0.0.1:{ipmi_bmc.port}): the BMC refused the "
        f"password of 'gfmonitor'"))
    assert wrong not in output and IPMI_PASSWORD not in output
