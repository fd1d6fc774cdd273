"""The Redfish reader on documents recorded from real BMCs (Dell iDRAC 9, HPE iLO 5, Cisco
CIMC, Supermicro, Lenovo XCC, NVIDIA's DGX H100 and GB200 BMCs; provenance in
tests/fixtures/redfish/README.md): each chassis is read as ``redfish.read`` reads it, the
newer PowerSubsystem and ThermalSubsystem resources where the BMC has no older ones."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpufleet.bmc import redfish
from gpufleet.bmc.reading import BmcReading, reading
from gpufleet.bmc.target import BmcError, BmcTarget
from gpufleet.conformance.checks.bmc import cooling_problems, psu_problems
from tests.conftest import ROOT

CAPTURES = ROOT / "tests" / "fixtures" / "redfish"


class _Recorded(redfish.RedfishReader):
    """A reader answering from a recorded tree (``Chassis/1/Power/index.json``) instead of
    the network: a document that was not recorded is not found."""

    def __init__(self, root: Path) -> None:
        super().__init__(BmcTarget("n1", "https://bmc.invalid", "ro", "unused"))
        self.root = root

    def get(self, path: str) -> dict[str, Any]:
        found = self.root / path.removeprefix("/redfish/v1/") / "index.json"
        if not found.is_file():
            raise BmcError(f"{path} not found")
        doc: dict[str, Any] = json.loads(found.read_text())
        return doc


def _captured(name: str, older: bool = True) -> BmcReading:
    """The recorded BMC's reading; ``older=False`` reads it as if its chassis had no
    ``Power`` or ``Thermal``, from the newer resources alone."""
    reader = _Recorded(CAPTURES / name)
    docs = redfish.BmcDocuments()
    for chassis in sorted((CAPTURES / name / "Chassis").iterdir()):
        path = f"/redfish/v1/Chassis/{chassis.name}"
        doc = reader.get(path)
        if not older:
            doc = {key: value for key, value in doc.items() if key not in ("Power", "Thermal")}
        redfish._read_chassis(reader, doc, path, docs)
    return reading(docs.power, docs.thermal, {}, parts=docs.parts)


@pytest.mark.parametrize(("capture", "inlets"), [
    ("dell-r650-idrac9-5.10", [("System Board Inlet Temp", 18)]),
    ("dell-r750-idrac9-7.10", [("System Board Inlet Temp", 20)]),
    ("hpe-dl360-gen10plus-ilo5-2.55", [("01-Inlet Ambient", 23)]),
    ("cisco-c220-m4s-cimc-4.1.2g", [("FP_TEMP_SENSOR", 19)]),
    ("cisco-c220-m5sx-cimc-4.1.3d", [("TEMP_SENS_FRONT", 24)]),
    ("supermicro-x13deg-oad-11.01", [("Inlet Temp", 21)]),
    ("lenovo-xcc-tgbt42s-2.83", [("Ambient Temp", 19)]),
    ("nvidia-dgx-h100-23.11", [("TEMP_AMBIENT", 22), ("TEMP_MB_INLET", 25),
                               ("TEMP_GB1_INLET2", 31), ("TEMP_GB1_INLET1", 31),
                               ("InletSensor_0", None), ("InletSensor_1", None)]),
])
def test_the_inlet_is_the_air_coming_into_the_server(
        capture: str, inlets: list[tuple[str, float | None]]) -> None:
    """Where the BMC places sensors at the intake (HPE's Intake, Cisco's Front) only those
    are inlets; a PSU's, a riser's or a GPU's inlet is inside the server (HPE's P/S inlets
    at 35 C, a Cisco C220 M5's riser inlets at 47 and 54 C). NVIDIA's DGX places all of
    its 120 sensors at the intake, which places none: its inlets are those so named."""
    bmc = _captured(capture)
    assert [(t.name, t.celsius) for t in bmc.inlets()] == inlets
    assert cooling_problems(bmc, 35) == []


def test_a_bmc_naming_no_inlet_leaves_the_inlet_unknown() -> None:
    """GB200's compute tray reports one front I/O board temperature and nothing it calls an
    inlet: the inlet is unknown, never passed."""
    assert cooling_problems(_captured("nvidia-gb200-nvl-24.12"), 35) == [
        "unknown: the BMC reports no inlet temperature"]


def _dgx_unknown(index: int) -> str:
    return f"unknown: power supply PSU{index} [/redfish/v1/Chassis/DGX] reports no health"


@pytest.mark.parametrize(("capture", "psus", "power", "problems"), [
    ("dell-r650-idrac9-5.10", [("PS1 Status", 1400, "OK", "Enabled"),
                               ("PS2 Status", 1400, "OK", "Enabled")], (396, 399, 1), []),
    ("dell-r750-idrac9-7.10", [("PS1 Status", 1400, "OK", "Enabled"),
                               ("PS2 Status", 1400, "OK", "Enabled")], (252, 276, 1), []),
    ("hpe-dl360-gen10plus-ilo5-2.55", [
        ("HpeServerPowerSupply (MemberId 0)", 800, "OK", "Enabled"),
        ("HpeServerPowerSupply (MemberId 1)", 800, "OK", "Enabled")], (165, 270, 20), []),
    ("cisco-c220-m5sx-cimc-4.1.3d", [("PSU1", 770, "OK", "Enabled"),
                                     ("PSU2", 770, "OK", "Enabled")], (252, 366, None), []),
    ("cisco-c220-m4s-cimc-4.1.2g", [("PSU1", 770, None, "Enabled"),
                                    ("PSU2", 770, None, "Enabled")], (0, None, None),
     ["unknown: power supply PSU1 reports no health",
      "unknown: power supply PSU2 reports no health"]),
    ("supermicro-x13deg-oad-11.01", [
        *[(f"Power Supply Bay {i}", 3000, "OK", "Enabled") for i in range(1, 6)],
        ("Power Supply Bay 6", None, "OK", "Enabled"),
        ("Power Supply Bay 7", None, "OK", "Enabled"),
        ("Power Supply Bay 8", 3000, "OK", "Enabled")], (2161, 2165, 5),
     ["the BMC reports no rating (PowerCapacityWatts) for Power Supply Bay 6, "
      "Power Supply Bay 7"]),
    ("lenovo-xcc-tgbt42s-2.83", [(f"PSU{i}", 2400, "OK", "Enabled") for i in range(1, 5)],
     (708, 639, 1), []),
    ("nvidia-dgx-h100-23.11", [(f"PSU{i} [/redfish/v1/Chassis/DGX]", None, None, None)
                               for i in range(6)], (None, None, None),
     [_dgx_unknown(i) for i in range(6)]),
    ("nvidia-gb200-nvl-24.12", [], (1073.190183, None, None),
     ["healthy PSUs are rated 0 W in all, under 1.3 x the measured peak of 1000 W (1300 W)"]),
])
def test_power_supplies_and_power_as_each_bmc_reports_them(
        capture: str, psus: list[tuple[str, float | None, str | None, str | None]],
        power: tuple[float | None, float | None, float | None], problems: list[str]) -> None:
    """Each PSU by a name that tells it from the others (HPE's iLO names both
    ``HpeServerPowerSupply``), rated by ``PowerCapacityWatts`` or, on Cisco's CIMC, its
    input range's ``OutputWattage``; a PSU that reports no health (the C220 M4's, the DGX's)
    is unknown, never passed. The DGX's older Power resource lists no PSU: they are read
    from its PowerSubsystem. Its only power readings are those of the HGX baseboard's zone
    (825 W) and of each GPU (~72 W): parts' power, not the node's, so the node's is
    unknown. GB200's compute tray has no PSU of its own (the rack's power shelves feed it):
    no PSU is listed, and none is made up."""
    bmc = _captured(capture)
    assert [(p.name, p.capacity_w, p.health, p.state) for p in bmc.psus] == psus
    assert (bmc.power_now_w, bmc.power_peak_w, bmc.power_interval_min) == power
    assert psu_problems(bmc.psus, 1000.0, 1.3, None) == problems


def test_a_sensor_the_bmc_reports_absent_has_no_reading() -> None:
    """HPE's iLO reports the sensors of its empty DIMM and PCIe bays ``Absent``, reading
    0 C: no reading, not 0 C."""
    hpe = {t.name: t.celsius for t in _captured("hpe-dl360-gen10plus-ilo5-2.55").temperatures}
    assert (hpe["04-P1 DIMM 1-8"], hpe["39-PCI 2"], hpe["06-P1 DIMM 9-16"]) == (None, None, 31)


@pytest.mark.parametrize(("capture", "psus", "power_w", "inlets", "exhaust_and_fans"), [
    ("lenovo-xcc-tgbt42s-2.83", [(f"Power Supply {i}", 2400, "OK") for i in range(1, 5)], 700,
     [("Intake (summary)", 19), ("Ambient (summary)", 19)], ([25], 10)),
    ("dell-r750-idrac9-7.10", [("PS1 Status", 1400, "OK"), ("PS2 Status", 1400, "OK")], 254,
     [("Intake (summary)", 20)], ([26], 6)),
    ("nvidia-dgx-h100-23.11", [(f"PSU{i} [/redfish/v1/Chassis/DGX]", None, None)
                               for i in range(6)], None,
     [("TEMP_AMBIENT", 22), ("TEMP_MB_INLET", 25), ("TEMP_GB1_INLET2", 32),
      ("TEMP_GB1_INLET1", 31), ("InletSensor_0", None), ("InletSensor_1", None)], ([47], 36)),
    ("nvidia-gb200-nvl-24.12", [], 1073.190183, [], ([], 0)),
])
def test_the_newer_resources_of_real_bmcs_read_as_their_older_ones(
        capture: str, psus: list[tuple[str, float | None, str | None]], power_w: float | None,
        inlets: list[tuple[str, float | None]],
        exhaust_and_fans: tuple[list[float], int]) -> None:
    """PowerSubsystem, EnvironmentMetrics and ThermalSubsystem alone, as a BMC that has only
    them answers: the same PSUs, power, inlet, exhaust and fans as the older resources of
    the same recording (Lenovo's and Dell's: the power a second apart, 700 and 708 W, 254
    and 252 W), all fans healthy. A PSU that reports no health stays unknown."""
    bmc = _captured(capture, older=False)
    assert [(p.name, p.capacity_w, p.health) for p in bmc.psus] == psus
    assert (bmc.power_now_w, bmc.power_peak_w) == (power_w, None)
    assert [(t.name, t.celsius) for t in bmc.inlets()] == inlets
    exhaust, fans = exhaust_and_fans
    assert [t.celsius for t in bmc.temperatures if t.exhaust] == exhaust
    assert (len(bmc.fans), [f.name for f in bmc.fans if f.failed]) == (fans, [])
    assert all(f.units == "RPM" and f.reading for f in bmc.fans)
