"""The Redfish reader against the lab's BMC server on loopback (sushy-tools' static handler
behind HTTPS and basic authentication): paging by @odata.nextLink, collections listed by
link, a refused account and a certificate that is not trusted, with no secret in any
message."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufleet.bmc import redfish
from gpufleet.bmc.target import BmcError, BmcTarget
from gpufleet.conformance.checks.power import reading
from gpufleet.lab.bmc import CHASSIS, SEL, LabBmcs, running

PASSWORD = "unit-Redfish-pa55"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def bmc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabBmcs]:
    with running(tmp_path_factory.mktemp("bmc"), {"n1": _free_port()}, "ro", PASSWORD) as lab:
        yield lab


def _target(lab: LabBmcs, password: str = PASSWORD, ca: str | None = "lab") -> BmcTarget:
    found = lab.inventory_vars("n1")
    return BmcTarget("n1", f"https://{found['bmc_address']}", "ro", password,
                     found["bmc_ca_file"] if ca == "lab" else ca)


def test_entries_on_a_second_page_are_read(bmc: LabBmcs) -> None:
    lab = bmc.bmcs["n1"]
    first = lab.load(SEL)
    page2 = f"{SEL}/Page2"
    lab.store(page2, {"@odata.id": f"/redfish/v1/{page2}", "Members": [
        {"@odata.id": f"/redfish/v1/{SEL}/9"}]})
    lab.store(f"{SEL}/9", {"@odata.id": f"/redfish/v1/{SEL}/9", "Id": "9",
                           "Severity": "Critical", "Created": "2026-12-02T07:00:00Z",
                           "Message": "PSU4 input lost"})
    lab.store(SEL, {**first, "@odata.nextLink": f"/redfish/v1/{page2}"})
    try:
        docs = redfish.read(_target(bmc))
    finally:
        lab.store(SEL, first)
    found = reading(docs.power, docs.thermal, docs.log_entries)
    assert [(e.id, e.severity, e.message) for e in found.events] == [
        ("1", "OK", "Power supply PSU1 presence detected"),
        ("2", "Critical", "Inlet temperature upper critical going high (cleared since)"),
        ("9", "Critical", "PSU4 input lost")]
    assert len(found.psus) == 4 and found.power_peak_w == 6100


def test_a_refused_account_and_an_untrusted_certificate_are_named(bmc: LabBmcs,
                                                                  tmp_path: Path) -> None:
    with pytest.raises(BmcError) as refused:
        redfish.read(_target(bmc, password="not-" + PASSWORD))
    assert str(refused.value).endswith("the BMC refused the credentials of 'ro' (HTTP 401/403)")
    with pytest.raises(BmcError) as untrusted:
        redfish.read(_target(bmc, ca=None))
    assert "its TLS certificate is not trusted (unable to get local issuer certificate): " \
           "set bmc_ca_file" in str(untrusted.value)
    assert PASSWORD not in str(refused.value) + str(untrusted.value)


def test_a_bmc_with_only_the_newer_subsystems_is_read_through_them(bmc: LabBmcs) -> None:
    lab = bmc.bmcs["n1"]
    chassis = lab.load(CHASSIS)
    base = f"/redfish/v1/{CHASSIS}"
    newer = {k: v for k, v in chassis.items() if k not in ("Power", "Thermal")}
    newer.update(PowerSubsystem={"@odata.id": f"{base}/PowerSubsystem"},
                 ThermalSubsystem={"@odata.id": f"{base}/ThermalSubsystem"},
                 EnvironmentMetrics={"@odata.id": f"{base}/EnvironmentMetrics"})
    lab.store(f"{CHASSIS}/PowerSubsystem", {"PowerSupplies": {
        "@odata.id": f"{base}/PowerSubsystem/PowerSupplies"}})
    lab.store(f"{CHASSIS}/PowerSubsystem/PowerSupplies", {"Members": [
        {"@odata.id": f"{base}/PowerSubsystem/PowerSupplies/{i}"} for i in (1, 2)]})
    for i, health in ((1, "OK"), (2, "Critical")):
        lab.store(f"{CHASSIS}/PowerSubsystem/PowerSupplies/{i}", {
            "Name": f"PSU{i}", "PowerCapacityWatts": 3000,
            "Status": {"State": "Enabled", "Health": health}})
    lab.store(f"{CHASSIS}/EnvironmentMetrics", {"PowerWatts": {"Reading": 2500}})
    lab.store(f"{CHASSIS}/ThermalSubsystem", {
        "ThermalMetrics": {"@odata.id": f"{base}/ThermalSubsystem/ThermalMetrics"},
        "Fans": {"@odata.id": f"{base}/ThermalSubsystem/Fans"}})
    lab.store(f"{CHASSIS}/ThermalSubsystem/ThermalMetrics", {
        "TemperatureSummaryCelsius": {"Intake": {"Reading": 27}}})
    lab.store(f"{CHASSIS}/ThermalSubsystem/Fans", {"Members": []})
    lab.store(CHASSIS, newer)
    try:
        docs = redfish.read(_target(bmc))
    finally:
        lab.store(CHASSIS, chassis)
    found = reading(docs.power, docs.thermal, docs.log_entries)
    assert [(p.name, p.health) for p in found.psus] == [("PSU1", "OK"), ("PSU2", "Critical")]
    assert found.power_now_w == 2500
    assert [(t.name, t.celsius, t.inlet) for t in found.temperatures] == [
        ("Intake (summary)", 27, True)]
