"""The BMC's power and cooling readings from DMTF's public rackmount mockup, and the
verdicts on PSUs, cooling, event logs and rack budgets."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from gpufleet import app, bootstrap
from gpufleet.bmc.reading import (
    BmcReading,
    Psu,
    ipmi_reading,
    power_from_subsystem,
    reading,
    sel_events,
    thermal_from_subsystem,
)
from gpufleet.bmc.target import bmc_url, target_of
from gpufleet.conformance.checks.bmc import (
    RackUse,
    cooling_problems,
    measured_peak,
    new_critical_events,
    parse_redundancy,
    psu_problems,
    rack_problems,
)
from gpufleet.errors import GpufleetError
from gpufleet.inventory.load import load_inventory
from gpufleet.inventory.model import Host, Inventory
from tests.conftest import ROOT

MOCKUP = ROOT / "tests" / "fixtures" / "redfish" / "public-rackmount1"


def _doc(path: str) -> Any:
    return json.loads((MOCKUP / path / "index.json").read_text())


def _rackmount() -> BmcReading:
    return reading({"/redfish/v1/Chassis/1U": _doc("Chassis/1U/Power")},
                   {"/redfish/v1/Chassis/1U": _doc("Chassis/1U/Thermal")},
                   {log: _doc(log)["Members"] for log in (
                       "Systems/437XR1138R2/LogServices/Log1/Entries",
                       "Managers/BMC/LogServices/Log/Entries")})


def test_the_rackmount_mockup_reads_as_its_documents_say() -> None:
    bmc = _rackmount()
    assert (bmc.power_now_w, bmc.power_peak_w, bmc.power_interval_min) == (344, 489, 30)
    assert bmc.psus == [Psu("Power Supply Bay", 800, "Warning", "Enabled", 325)]
    inlet = [t for t in bmc.temperatures if t.inlet]
    assert [(t.name, t.celsius, t.upper_critical) for t in inlet] == [
        ("Chassis Intake Temp", 25, 40)]
    assert [f.name for f in bmc.fans] == ["BaseBoard System Fan", "BaseBoard System Fan Backup"]
    assert not any(f.failed for f in bmc.fans)
    assert len(bmc.events) == 3
    assert {e.severity for e in bmc.events} == {"Critical"}
    assert [(e.log.split("/")[0], e.id, e.created) for e in bmc.events] == [
        ("Managers", "1", datetime(2012, 3, 7, 14, 44, tzinfo=timezone.utc)),
        ("Systems", "1", datetime(2012, 3, 7, 14, 44, tzinfo=timezone.utc)),
        ("Systems", "2", datetime(2012, 3, 7, 14, 45, tzinfo=timezone.utc))]


def test_the_mockup_s_psu_in_warning_fails_and_leaves_no_healthy_capacity() -> None:
    bmc = _rackmount()
    assert psu_problems(bmc.psus, 489, 1.3, None) == [
        "power supply Power Supply Bay (Enabled, health Warning)",
        "healthy PSUs are rated 0 W in all, under 1.3 x the measured peak of 489 W (636 W)"]


def _psus(*healths: str, watts: float = 3000) -> list[Psu]:
    return [Psu(f"PSU{i + 1}", watts, h, "Enabled") for i, h in enumerate(healths)]


def test_headroom_and_redundancy_against_the_measured_peak() -> None:
    four = _psus("OK", "OK", "OK", "OK")
    assert psu_problems(four, 6100, 1.3, "N+1") == []
    assert psu_problems(four, 9300, 1.3, None) == [
        "healthy PSUs are rated 12000 W in all, under 1.3 x the measured peak of 9300 W "
        "(12090 W)"]
    assert psu_problems(four, 6100, 1.3, "2N") == [
        "2N redundancy: after losing 2 of the 4 healthy PSUs, 6000 W is left for a measured "
        "peak of 6100 W"]
    one_failed = _psus("OK", "Critical", "OK", "OK")
    assert psu_problems(one_failed, 6100, 1.3, "N+1") == [
        "power supply PSU2 (Enabled, health Critical)",
        "N+1 redundancy: after losing 1 of the 3 healthy PSUs, 6000 W is left for a measured "
        "peak of 6100 W"]
    absent = [*four[:3], Psu("PSU4", None, None, "Absent")]
    assert psu_problems(absent, 6100, 1.3, None) == []


@pytest.mark.parametrize(("text", "lose"), [(None, None), ("N", 0), ("n+1", 1), ("N+2", 2),
                                            ("2N", -1)])
def test_redundancy_is_read(text: str | None, lose: int | None) -> None:
    assert parse_redundancy(text) == lose


@pytest.mark.parametrize("text", ["N+", "3N", "N-1", "one"])
def test_an_unreadable_redundancy_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="N, N\\+M or 2N"):
        parse_redundancy(text)


def test_cooling_a_hot_inlet_a_failed_fan_and_no_inlet() -> None:
    bmc = _rackmount()
    assert cooling_problems(bmc, 35) == []
    assert cooling_problems(bmc, 20) == ["Chassis Intake Temp reads 25 C, above 20 C "
                                         "(bmc_max_inlet_c)"]
    bmc.temperatures = [t for t in bmc.temperatures if not t.inlet]
    assert cooling_problems(bmc, 35) == ["unknown: the BMC reports no inlet temperature"]


def test_only_critical_entries_after_the_window_start_are_new() -> None:
    events = _rackmount().events
    assert new_critical_events(events, datetime(2020, 1, 1, tzinfo=timezone.utc)) == []
    found = new_critical_events(events, datetime(2012, 3, 7, 14, 44, 30, tzinfo=timezone.utc))
    assert [e.message for e in found] == ["Temperature threshold exceeded"]


def test_the_measured_peak_is_the_highest_measurement_never_a_rating() -> None:
    bmc = _rackmount()
    assert measured_peak(bmc) == (489, "the BMC's highest over its interval")
    assert measured_peak(bmc, gpu_soak_w=1400.0) == (1400.0, "the GPUs during the thermal soak")
    assert measured_peak(bmc, recorded_w=2000.0)[1] == "the peak recorded in the node's baseline"
    assert measured_peak(None) == (None, "no power was measured")


def test_a_rack_over_its_budget_a_node_without_a_peak_and_air_past_15_kw() -> None:
    full = RackUse("rack1", 20000, 0.8, "air", {"a": 6100.0, "b": 6100.0, "c": 4000.0})
    assert full.budget_w == 16000
    problems, warnings = rack_problems(full)
    assert problems == ["rack rack1: measured peaks add up to 16200 W, over its budget of "
                        "16000 W (0.8 x the 20000 W supply)"]
    assert warnings == ["rack rack1 is air cooled and its nodes draw 16200 W at peak: air "
                        "cooling tops out at 15-20 kW per rack"]
    assert full.to_dict()["use"] == 1.0125
    liquid = RackUse("rack2", 40000, 0.8, "liquid", {"a": 6100.0, "b": None})
    assert rack_problems(liquid) == ([
        "unknown: rack rack2: no measured peak power for b (certify them with the bmc suite "
        "and --record-baseline)"], [])


def test_bmc_addresses_are_https_without_credentials_or_paths() -> None:
    assert bmc_url("10.0.5.17", "n") == "https://10.0.5.17"
    assert bmc_url("bmc-n1:8443", "n") == "https://bmc-n1:8443"
    assert bmc_url("https://[fd00::5]:443/", "n") == "https://[fd00::5]:443"
    for bad in ("http://10.0.5.17", "https://admin:hunter22@10.0.5.17", "https://b/redfish"):
        with pytest.raises(GpufleetError, match="host 'n': bmc_address must be"):
            bmc_url(bad, "n")


def test_a_bmc_needs_its_account_and_none_means_not_declared() -> None:
    assert target_of(Host("n", {}, frozenset({"all"}))) is None
    with pytest.raises(GpufleetError, match="bmc_user or bmc_password is not"):
        target_of(Host("n", {"bmc_address": "10.0.5.17", "bmc_user": "ro"}, frozenset()))
    target = target_of(Host("n", {"bmc_address": "10.0.5.17", "bmc_user": "ro",
                                  "bmc_password": "pw-secret-1"}, frozenset()))
    assert target is not None and "pw-secret-1" not in repr(target)


def test_the_mockup_files_are_dmtf_s() -> None:
    for path in MOCKUP.rglob("index.json"):
        assert "DMTF" in json.loads(path.read_text())["@Redfish.Copyright"], path


@pytest.mark.parametrize(("line", "message"), [
    ("bmc_address: http://10.0.5.17",
     "host 'gpu1': bmc_address must be a host name, an address, host:port or "
     "https://host[:port], got 'http://10.0.5.17' ({inv}:5)"),
    ("psu_redundancy: 3N", "host gpu1: variable psu_redundancy must be N, N+M or 2N, got '3N' "
                           "({inv}:5)"),
    ("rack_cooling: water", "host gpu1: variable rack_cooling must be air or liquid, got "
                            "'water' ({inv}:5)"),
    ("rack_power_margin: 1.5", "host gpu1: variable rack_power_margin must be a number above "
                               "0, at most 1, got 1.5 ({inv}:5)"),
])
def test_a_bad_bmc_variable_is_refused_before_any_host_is_contacted(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], line: str, message: str) -> None:
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  hosts:\n    gpu1:\n      ansible_host: 192.0.2.1\n"
                   f"      {line}\n      bmc_user: ro\n      bmc_password: hunter2-secret-7\n")
    assert app.conformance_cmd(str(inv), suites="bmc") == 2
    err = capsys.readouterr().err
    assert err == f"error: {message.format(inv=inv)}\n"
    assert "hunter2-secret-7" not in err


IPMI = ROOT / "tests" / "fixtures" / "ipmi"


def _ipmi(sdr: str, sel: str = "ipmi_sim_sel_elist_psu2_failed.txt",
          dcmi: str = "ipmi_sim_dcmi_power_reading.txt") -> BmcReading:
    dcmi_text = (IPMI / dcmi).read_text()
    return ipmi_reading((IPMI / sdr).read_text(), (IPMI / sel).read_text(),
                        None if "DCMI request failed" in dcmi_text else dcmi_text, 3000.0)


def test_ipmitool_s_sensors_read_as_psus_temperatures_fans_and_power() -> None:
    bmc = _ipmi("ipmi_sim_sdr_elist.txt")
    assert [(p.name, p.capacity_w, p.health, p.state) for p in bmc.psus] == [
        (f"PS{i} Status", 3000.0, "OK", "Enabled") for i in range(1, 5)]
    assert [(t.name, t.celsius, t.inlet, t.exhaust) for t in bmc.temperatures] == [
        ("Inlet Temp", 24.0, True, False), ("Exhaust Temp", 41.0, False, True)]
    assert [(f.name, f.reading, f.failed) for f in bmc.fans] == [("Fan1", 9000.0, False)]
    assert (bmc.power_now_w, bmc.power_peak_w) == (5200.0, None)
    assert psu_problems(bmc.psus, 5200.0, 1.3, "N+1") == []
    assert cooling_problems(bmc, 35) == []


def test_a_failed_psu_and_a_hot_inlet_from_ipmitool() -> None:
    bmc = _ipmi("ipmi_sim_sdr_elist_psu2_failed_inlet_41.txt")
    assert psu_problems(bmc.psus, 5200.0, 1.3, None) == [
        "power supply PS2 Status (Enabled, health Critical)"]
    assert cooling_problems(bmc, 35) == ["Inlet Temp reads 41 C, above 35 C (bmc_max_inlet_c)"]


def test_the_sel_s_failure_is_critical_and_dated_and_presence_is_not() -> None:
    events = _ipmi("ipmi_sim_sdr_elist.txt").events
    assert [(e.id, e.severity, e.created) for e in events] == [
        ("1", "OK", None), ("2", "OK", None), ("3", "OK", None), ("4", "OK", None),
        ("5", "Critical", datetime(2026, 12, 2, 7, 23, 33, tzinfo=timezone.utc))]
    found = new_critical_events(events, datetime(2026, 12, 1, tzinfo=timezone.utc))
    assert [e.describe() for e in found] == [
        "2026-12-02T07:23:33Z Power Supply PS2 Status: Failure detected (entry 5 of SEL)"]
    assert new_critical_events(events, datetime(2026, 12, 3, tzinfo=timezone.utc)) == []


def test_dcmi_gives_the_power_now_and_the_peak_of_its_period() -> None:
    bmc = _ipmi("ipmi_sim_sdr_elist.txt", dcmi="dcmi_power_reading_format.txt")
    assert (bmc.power_now_w, bmc.power_peak_w, bmc.power_interval_min) == (5230, 6120, 30)
    assert measured_peak(bmc) == (6120, "the BMC's highest over its interval")
    off = (IPMI / "dcmi_power_reading_format.txt").read_text().replace(
        "is:                   activated", "is:                   deactivated")
    idle = ipmi_reading((IPMI / "ipmi_sim_sdr_elist.txt").read_text(), "", off, None)
    assert (idle.power_now_w, idle.power_peak_w) == (5200.0, None), "the SDR's sensor instead"
    assert idle.psus[0].capacity_w is None


def test_ipmi_addresses_and_protocols() -> None:
    def target(**extra: object) -> object:
        return target_of(Host("n", {"bmc_address": "10.0.5.17", "bmc_user": "ro",
                                    "bmc_password": "pw-secret-1", **extra}, frozenset()))

    found = target(bmc_protocol="ipmi")
    assert found is not None and found.url == "ipmi://10.0.5.17"  # type: ignore[attr-defined]
    assert found.host_port == ("10.0.5.17", 623)  # type: ignore[attr-defined]
    assert target(bmc_protocol="ipmi", bmc_address="bmc7:6230").host_port == (  # type: ignore[attr-defined]
        "bmc7", 6230)
    for extra, message in (({"bmc_protocol": "snmp"}, "bmc_protocol must be redfish or ipmi"),
                           ({"bmc_protocol": "ipmi", "bmc_address": "https://b"},
                            "bmc_address of an IPMI BMC must be"),
                           ({"bmc_protocol": "ipmi", "bmc_ipmi_cipher_suite": 42},
                            "bmc_ipmi_cipher_suite must be an IPMI cipher suite"),
                           ({"bmc_protocol": "ipmi", "bmc_password": "x" * 21},
                            r"bmc_password is longer than IPMI allows \(20 bytes\)$")):
        with pytest.raises(GpufleetError, match=message):
            target(**extra)


def _subsystem_reading() -> BmcReading:
    base = "Chassis/1U"
    supplies = [_doc(f"{base}/PowerSubsystem/PowerSupplies/{bay}") for bay in ("Bay1", "Bay2")]
    fans = [_doc(f"{base}/ThermalSubsystem/Fans/{fan}")
            for fan in ("Bay1", "Bay2", "CPU1", "CPU2")]
    return reading(
        {"/redfish/v1/Chassis/1U": power_from_subsystem(
            supplies, _doc(f"{base}/EnvironmentMetrics"))},
        {"/redfish/v1/Chassis/1U": thermal_from_subsystem(
            _doc(f"{base}/ThermalSubsystem/ThermalMetrics"), fans)}, {})


def test_the_newer_power_and_thermal_subsystems_read_as_the_older_resources() -> None:
    bmc = _subsystem_reading()
    assert [(p.name, p.capacity_w, p.health, p.state) for p in bmc.psus] == [
        ("Power Supply Bay 1", 400, "Warning", "Enabled"),
        ("Power Supply Bay 2", None, None, "Absent")]
    assert (bmc.power_now_w, bmc.power_peak_w) == (374, None)
    assert [(t.name, t.celsius, t.inlet, t.exhaust) for t in bmc.temperatures] == [
        ("Intake (summary)", 24.8, True, False), ("Ambient (summary)", 22.5, True, False),
        ("Exhaust (summary)", 40.5, False, True)]
    assert [(f.name, f.reading, f.failed) for f in bmc.fans] == [
        ("Fan Bay 1", 2200, False), ("Fan Bay 2", 2400, False), ("Fan for CPU 1", None, False),
        ("Fan for CPU 2", 1490, False)]
    assert psu_problems(bmc.psus, 374, 1.3, None)[0] == (
        "power supply Power Supply Bay 1 (Enabled, health Warning)")
    assert cooling_problems(bmc, 35) == []


def test_a_sel_of_44_records_with_hexadecimal_ids_is_read_whole() -> None:
    """ipmitool numbers SEL records in hexadecimal: records 0xa-0xf, 0x1a-0x1f and 0x2a-0x2c
    (PS3's failure in record a among them) are records like the others."""
    events, unknown = sel_events((IPMI / "ipmi_sim_sel_elist_44_records.txt").read_text())
    assert unknown is None
    assert [e.id for e in events] == [f"{i:x}" for i in range(1, 0x2d)]
    record_a = events[9]
    assert (record_a.id, record_a.severity, record_a.message) == (
        "a", "OK", "Power Supply PS3 Status: Failure detected")
    critical = [e.id for e in new_critical_events(events, datetime(2026, 12, 3,
                                                                  tzinfo=timezone.utc))]
    assert critical == [f"{i:x}" for i in range(5, 0x2d, 2)]
    assert "b" in critical and "1f" in critical


@pytest.mark.parametrize(("capture", "records", "critical"), [
    ("openpower_op_build_594_sel_list.txt", 12, 0),
    ("ibm_openbmc_3638_sel_elist.txt", 17, 0),
    ("facebook_openbmc_273_sel_list.txt", 7, 4),
    ("sos_2015_sel_elist.txt", 3, 0),
    ("ipmitool_346_sel_elist_start.txt", 4, 0),
])
def test_public_sel_captures_are_read_whole(capture: str, records: int, critical: int) -> None:
    events, unknown = sel_events((IPMI / capture).read_text())
    assert unknown is None
    assert len(events) == records
    assert len([e for e in events if e.severity == "Critical"]) == critical


def test_a_twelve_hour_sel_time_is_read_as_such() -> None:
    events, _ = sel_events((IPMI / "ipmitool_346_sel_elist_start.txt").read_text())
    assert events[-1].id == "1b5b"
    assert events[-1].created == datetime(2022, 5, 27, 18, 12, 15, tzinfo=timezone.utc)


def test_a_sel_line_that_is_not_a_record_makes_the_log_unknown() -> None:
    text = (IPMI / "ipmi_sim_sel_elist_44_records.txt").read_text()
    lines = text.splitlines()
    garbled = "\n".join([*lines[:9], "  0x0a | garbled", *lines[9:]])
    bmc = ipmi_reading((IPMI / "ipmi_sim_sdr_elist.txt").read_text(), garbled, None, None)
    assert bmc.events_unknown == "SEL line 10 is not a record: '0x0a | garbled'"
    assert sel_events("SEL has no entries\n") == ([], None)


@pytest.mark.parametrize(("capture", "now", "peak", "interval_min"), [
    ("dcmi_lovoo_ipmi_exporter_18.txt", 215, 276, 18857.77),
    ("dcmi_home_assistant_ipmi_13_supermicro.txt", 109, 242, 1092.17),
    ("dcmi_rabe_zabbix_101.txt", 197, 242, 2064.88),
])
def test_dcmi_captures_of_both_layouts(capture: str, now: float, peak: float,
                                       interval_min: float) -> None:
    """ipmitool 1.8.18 prints the IPMI timestamp on its own line; later versions leave the
    newline out, so the sampling period follows it on the same line."""
    bmc = ipmi_reading("", "", (IPMI / capture).read_text(), None)
    assert (bmc.power_now_w, bmc.power_peak_w, bmc.power_interval_min) == (
        now, peak, interval_min)


def test_a_deactivated_dcmi_reading_is_not_used() -> None:
    bmc = ipmi_reading((IPMI / "ipmi_sim_sdr_elist.txt").read_text(), "",
                       (IPMI / "dcmi_openbmc_3257_deactivated.txt").read_text(), None)
    assert (bmc.power_now_w, bmc.power_peak_w) == (5200.0, None)


def test_no_event_log_and_a_log_read_in_part_are_unknown() -> None:
    power = {"/redfish/v1/Chassis/1U": _doc("Chassis/1U/Power")}
    assert reading(power, {}, {}).events_unknown == (
        "the BMC lists no event log (no LogServices with Entries)")
    cut = reading(power, {}, {"log": []}, ["log read in part: more than 20 pages"])
    assert cut.events_unknown == "log read in part: more than 20 pages"
    assert _rackmount().events_unknown is None


def _rack_inventory(tmp_path: Path, allow: bool | None) -> Inventory:
    extra = "" if allow is None else f"    rack_power_allow_unknown: {str(allow).lower()}\n"
    inv = tmp_path / "hosts.yml"
    inv.write_text(
        "all:\n  vars:\n    rack: rackA\n    rack_power_w: 20000\n    rack_cooling: liquid\n"
        f"{extra}"
        "  hosts:\n    new1: {ansible_host: 192.0.2.1}\n    old1: {ansible_host: 192.0.2.2}\n"
        "    old2: {ansible_host: 192.0.2.3}\n")
    return load_inventory(inv)


@pytest.mark.parametrize("allow", [None, False, True])
def test_bootstrap_refuses_a_node_while_rack_members_peaks_are_unknown(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, allow: bool | None) -> None:
    inventory = _rack_inventory(tmp_path, allow)
    peaks = {"new1": (6000.0, ""), "old1": (5000.0, ""),
             "old2": (None, "unreachable (no route to host)")}
    monkeypatch.setattr(bootstrap, "_recorded_peak", lambda host, conn, fleet: peaks[host.name])
    host = inventory.hosts["new1"]
    if allow:
        detail, _ = bootstrap.power_budget(inventory, host, "rackA", None,  # type: ignore[arg-type]
                                              None)  # type: ignore[arg-type]
        assert detail == "rack rackA: 11000 W of its 16000 W budget with new1; not counted: old2"
        return
    with pytest.raises(GpufleetError) as refused:
        bootstrap.power_budget(inventory, host, "rackA", None, None)  # type: ignore[arg-type]
    assert str(refused.value) == (
        "unknown: rack rackA: no peak power readable for old2 (unreachable (no route to host)) "
        "(set rack_power_allow_unknown: true to admit the node without counting them)")


@pytest.mark.parametrize(("capture", "power_w", "inlets"), [
    ("dell_idrac_sdr_elist_all_tigerblue77_36.txt", None, [("Ambient Temp", 19.0)]),
    ("dell_sdr_type_current_home_assistant_ipmi_13.txt", 98.0, []),
    ("ibm_sdr_elist_power_in_home_assistant_ipmi_13.txt", 292.0, []),
    ("sdr_type_current_home_assistant_ipmi_13.txt", None, []),
    ("ibm_rainier_sdr_elist_3625.txt", None, []),
])
def test_public_sdr_captures(capture: str, power_w: float | None,
                             inlets: list[tuple[str, float]]) -> None:
    """Sensors of the PSU entity that are temperatures or currents are not PSUs; the PSUs'
    input sensors add up to the node's power."""
    bmc = ipmi_reading((IPMI / capture).read_text(), "", None, None)
    assert bmc.power_now_w == power_w
    assert [(t.name, t.celsius) for t in bmc.temperatures if t.inlet] == inlets
    assert bmc.psus == []


REDFISH = ROOT / "tests" / "fixtures" / "redfish"


@pytest.mark.parametrize(("capture", "ids", "critical"), [
    ("idrac_sel_entries_check_redfish_4.json", ["27", "26"],
     ["2018-12-19T10:04:14Z Power supply redundancy is lost. (entry 26 of Sel)"]),
    ("idrac8_sel_entry_idrac_exporter_26.json", ["13"],
     ["2020-07-13T22:26:58Z The chassis is open while the power is off. (entry 13 of Sel)"]),
])
def test_idrac_log_entries_of_two_schema_layouts(capture: str, ids: list[str],
                                                 critical: list[str]) -> None:
    entries = json.loads((REDFISH / capture).read_text())
    bmc = reading({}, {}, {"Sel": entries})
    assert [e.id for e in bmc.events] == ids and bmc.events_unknown is None
    found = new_critical_events(bmc.events, datetime(2018, 1, 1, tzinfo=timezone.utc))
    assert [e.describe() for e in found] == critical
