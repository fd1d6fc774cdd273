"""The BMC reading model: power and cooling as a BMC reports them (Redfish ``Power``,
``Thermal`` and log entries as DMTF's schema shapes them, or ipmitool's SDR, SEL and DCMI
output), read into one ``BmcReading`` by pure parsers. The bmc suite's verdicts on it are
``conformance/checks/bmc.py``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

HEALTHY = "OK"
INLET_CONTEXTS = frozenset({"Intake", "Room", "Front"})
PLACE_CONTEXTS = frozenset({"SystemBoard", "Chassis", "Back", "Upper", "Lower"})
INLET_NAME = re.compile(r"inlet|intake|ambient|^temp_(?:sens_)?front$", re.IGNORECASE)
PART_NAME = re.compile(r"riser|p/s|psu|gpu|cpu|pci|dimm|nvme", re.IGNORECASE)
NO_READING_STATES = frozenset({"Absent", "Disabled", "UnavailableOffline"})
PART_CHASSIS = frozenset({"Card", "Cartridge", "Component", "Module", "Zone", "IPBasedDrive"})
EXHAUST_NAME = re.compile(r"exhaust|outlet", re.IGNORECASE)


@dataclass(frozen=True)
class Psu:
    """One power supply: its rated output and Redfish status."""

    name: str
    capacity_w: float | None
    health: str | None
    state: str | None
    output_w: float | None = None

    @property
    def present(self) -> bool:
        return self.state not in ("Absent",)

    @property
    def healthy(self) -> bool:
        return self.present and self.state in (None, "Enabled") and self.health == HEALTHY

    def describe(self) -> str:
        return f"{self.name} ({self.state or 'no state'}, health {self.health or 'unknown'})"


@dataclass(frozen=True)
class Temperature:
    name: str
    celsius: float | None
    context: str | None
    health: str | None
    upper_critical: float | None = None

    @property
    def inlet(self) -> bool:
        """Placed at the air intake by the BMC, or named as the server's inlet: a part's
        inlet (a riser's, a PSU's, a GPU's) is inside the server, past its own heat."""
        if self.context in INLET_CONTEXTS:
            return True
        return (self.context is None or self.context in PLACE_CONTEXTS) \
            and bool(INLET_NAME.search(self.name)) and not PART_NAME.search(self.name)

    @property
    def exhaust(self) -> bool:
        return self.context == "Exhaust" or bool(EXHAUST_NAME.search(self.name))


@dataclass(frozen=True)
class Fan:
    name: str
    reading: float | None
    units: str | None
    health: str | None
    state: str | None

    @property
    def failed(self) -> bool:
        return self.state not in ("Absent", "Disabled") and self.health not in (HEALTHY, None)


@dataclass(frozen=True)
class Event:
    """A log entry of the BMC's logs."""

    log: str
    id: str
    created: datetime | None
    severity: str | None
    message: str

    def describe(self) -> str:
        when = self.created.strftime("%Y-%m-%dT%H:%M:%SZ") if self.created else "undated"
        return f"{when} {self.message} (entry {self.id} of {self.log})"


@dataclass
class BmcReading:
    """What one BMC said about its node's power and cooling."""

    psus: list[Psu] = field(default_factory=list)
    power_now_w: float | None = None
    power_peak_w: float | None = None
    power_interval_min: float | None = None
    temperatures: list[Temperature] = field(default_factory=list)
    fans: list[Fan] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    events_unknown: str | None = None  # why the event logs could not all be read

    def inlets(self) -> list[Temperature]:
        """The temperatures of the air coming in: those the BMC places at the intake where
        it places any there, else those named as the server's inlet."""
        placed = [t for t in self.temperatures if t.context in INLET_CONTEXTS]
        return placed or [t for t in self.temperatures if t.inlet]

    def to_dict(self) -> dict[str, Any]:
        return {
            "power_now_w": self.power_now_w, "power_peak_w": self.power_peak_w,
            "power_interval_min": self.power_interval_min,
            "psus": [{"name": p.name, "capacity_w": p.capacity_w, "health": p.health,
                      "state": p.state, "output_w": p.output_w} for p in self.psus],
            "inlet_c": [t.celsius for t in self.inlets()],
            "exhaust_c": [t.celsius for t in self.temperatures if t.exhaust],
            "fans": [{"name": f.name, "reading": f.reading, "units": f.units,
                      "health": f.health} for f in self.fans],
            "log_entries": len(self.events), "log_unknown": self.events_unknown,
        }


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _reading(item: Mapping[str, Any], key: str, state: str | None) -> float | None:
    """A sensor's reading; none for a sensor that is absent, disabled or offline, whose
    number (HPE's iLO reports 0) was not measured."""
    return None if state in NO_READING_STATES else _number(item.get(key))


def _power_supplies(doc: Mapping[str, Any], where: str) -> list[Psu]:
    """A Power document's PSUs, each by a name that tells it from the others (HPE's iLO
    names each one ``HpeServerPowerSupply``: its MemberId is added)."""
    supplies = _items(doc, "PowerSupplies")
    names = [_name(item, f"PSU {index}") for index, item in enumerate(supplies)]
    found = []
    for index, item in enumerate(supplies):
        health, state = _status(item)
        name = names[index]
        if names.count(name) > 1:
            name += f" (MemberId {item.get('MemberId', item.get('Id', index))})"
        found.append(Psu(name + where,
                         _number(item.get("PowerCapacityWatts")) or _input_rating(item),
                         health, state, _number(item.get("LastPowerOutputWatts"))))
    return found


def _input_rating(item: Mapping[str, Any]) -> float | None:
    """A PSU's rating from its input ranges where it reports no ``PowerCapacityWatts``
    (Cisco's CIMC): ``OutputWattage``, or the newer resource's ``CapacityWatts``. The lowest
    range counts, as which one the PSU runs on is not said; None when a range has none."""
    ratings = [_number(r.get("OutputWattage", r.get("CapacityWatts")))
               for r in _items(item, "InputRanges")]
    known = [r for r in ratings if r]
    return min(known) if known and len(known) == len(ratings) else None


def _status(item: Mapping[str, Any]) -> tuple[str | None, str | None]:
    status = item.get("Status")
    if not isinstance(status, dict):
        return None, None
    health, state = status.get("Health"), status.get("State")
    return (health if isinstance(health, str) else None,
            state if isinstance(state, str) else None)


def _items(doc: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    value = doc.get(key)
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) \
        else []


def _name(item: Mapping[str, Any], fallback: str) -> str:
    name = item.get("Name") or item.get("MemberId")
    return str(name) if name else fallback


def parse_created(value: Any) -> datetime | None:
    """A log entry's ``Created`` (ISO 8601, any offset) in UTC; None when unreadable."""
    if not isinstance(value, str):
        return None
    try:
        stamp = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return stamp.astimezone(timezone.utc) if stamp.tzinfo else stamp.replace(
        tzinfo=timezone.utc)


def reading(power: Mapping[str, Mapping[str, Any]], thermal: Mapping[str, Mapping[str, Any]],
            log_entries: Mapping[str, Sequence[Mapping[str, Any]]],
            logs_cut: Sequence[str] = (), parts: Collection[str] = ()) -> BmcReading:
    """The reading of a BMC from its chassis' Power and Thermal documents (by chassis) and
    its log services' entries (by log). A log read only in part (``logs_cut``: why) or no
    log at all leaves the events unknown: what was not read cannot pass. The power of a
    chassis that is a part (``parts``: a GPU, the HGX baseboard's zone) is not the node's
    input power, and is not taken for it."""
    out = BmcReading()
    if logs_cut:
        out.events_unknown = "; ".join(logs_cut)
    elif not log_entries:
        out.events_unknown = "the BMC lists no event log (no LogServices with Entries)"
    for chassis, doc in sorted(power.items()):
        out.psus += _power_supplies(doc, f" [{chassis}]" if len(power) > 1 else "")
        for item in _items(doc, "PowerControl") if chassis not in parts else []:
            now = _number(item.get("PowerConsumedWatts"))
            if now is None or out.power_now_w is not None:
                continue
            out.power_now_w = now
            metrics = item.get("PowerMetrics")
            if isinstance(metrics, dict):
                out.power_peak_w = _number(metrics.get("MaxConsumedWatts"))
                out.power_interval_min = _number(metrics.get("IntervalInMin"))
    for _, doc in sorted(thermal.items()):
        temperatures = _items(doc, "Temperatures")
        contexts = {item.get("PhysicalContext") for item in temperatures}
        placed = len(temperatures) < 2 or len(contexts) > 1  # one context for all places none
        for index, item in enumerate(temperatures):
            health, state = _status(item)
            context = item.get("PhysicalContext") if placed else None
            out.temperatures.append(Temperature(
                _name(item, f"temperature {index}"), _reading(item, "ReadingCelsius", state),
                context if isinstance(context, str) else None, health,
                _number(item.get("UpperThresholdCritical"))))
        for index, item in enumerate(_items(doc, "Fans")):
            health, state = _status(item)
            units = item.get("ReadingUnits")
            out.fans.append(Fan(_name(item, f"fan {index}"), _reading(item, "Reading", state),
                                units if isinstance(units, str) else None, health, state))
    for log, entries in sorted(log_entries.items()):
        for entry in entries:
            severity = entry.get("Severity")
            message = entry.get("Message") or entry.get("EntryCode") or entry.get("MessageId")
            out.events.append(Event(log, str(entry.get("Id", "?")),
                                    parse_created(entry.get("Created")),
                                    severity if isinstance(severity, str) else None,
                                    " ".join(str(message or "no message").split())[:200]))
    return out


_SDR_LINE = re.compile(r"^(?P<name>[^|]*?)\s*\|\s*(?P<id>[0-9A-Fa-f]+h)\s*\|\s*(?P<status>\w+)\s*"
                       r"\|\s*(?P<entity>\d+\.\d+)\s*\|\s*(?P<reading>.*?)\s*$")
_NUMBER_UNIT = re.compile(r"^(?P<value>-?\d+(?:\.\d+)?)\s+(?P<unit>.+)$")
_DCMI = re.compile(r"(?:^|\s)(?P<key>Instantaneous power reading|"
                   r"Maximum during sampling period|Sampling period|Power reading state is)"
                   r"\s*:\s*(?P<value>.+?)\s*$", re.M)
IPMI_CRITICAL_STATUS = frozenset({"cr", "nr", "lcr", "ucr", "lnr", "unr"})
POWER_SUPPLY_ENTITY = "10"
NOT_A_PSU_STATE = re.compile(r"temp|current|volt|fan", re.IGNORECASE)  # PSUs' other sensors
PSU_FAILED = ("Failure detected", "Power Supply AC lost", "AC lost", "input lost",
              "Config Error")
SEL_CRITICAL = re.compile(
    r"Failure detected|AC lost|input lost|Critical going (?:low|high)|Non-recoverable|"
    r"Uncorrectable ECC|Uncorrectable machine check|IERR|Thermal Trip|Bus Uncorrectable|"
    r"Bus Fatal|Redundancy Lost|"
    r"Transition to Critical|Transition to Non-Recoverable", re.IGNORECASE)


def _sdr_rows(text: str) -> list[re.Match[str]]:
    return [m for m in map(_SDR_LINE.match, text.splitlines()) if m]


def ipmi_reading(sdr: str, sel: str, dcmi: str | None, psu_rating_w: float | None
                 ) -> BmcReading:
    """The reading of a BMC from ipmitool's ``sdr elist``, ``sel elist`` and ``dcmi power
    reading`` (None: the BMC has no DCMI). IPMI reports no PSU rating: ``psu_rating_w``
    stands for each PSU's. Without DCMI the power now is the chassis' power sensor, else
    the sum of the PSUs' input sensors (``PS1 Power In``): one PSU's is not the node's. A
    PSU's temperature, current or voltage sensor is not a PSU."""
    out = BmcReading()
    chassis_power: float | None = None
    psu_inputs: list[float] = []
    for row in _sdr_rows(sdr):
        name, status, reading = row["name"], row["status"].lower(), row["reading"]
        critical = status in IPMI_CRITICAL_STATUS
        number = _NUMBER_UNIT.match(reading)
        unit = number["unit"] if number else ""
        value = float(number["value"]) if number else None
        if unit == "degrees C":
            out.temperatures.append(Temperature(name, value, None, "Critical" if critical
                                                else "OK", value if critical else None))
        elif unit == "RPM" or (unit == "" and name.lower().startswith("fan")
                               and status == "ns"):
            out.fans.append(Fan(name, value, "RPM", "Critical" if critical else
                                ("OK" if status != "ns" else None),
                                "Enabled" if status != "ns" else "Absent"))
        elif unit == "Watts" and re.search(r"pwr|power", name, re.IGNORECASE):
            if row["entity"].split(".")[0] != POWER_SUPPLY_ENTITY:
                chassis_power = value if chassis_power is None else chassis_power
            elif value is not None:
                psu_inputs.append(value)
        elif row["entity"].split(".")[0] == POWER_SUPPLY_ENTITY and not number \
                and not NOT_A_PSU_STATE.search(name):
            present = "Presence detected" in reading
            failed = any(marker in reading for marker in PSU_FAILED) or critical
            out.psus.append(Psu(name, psu_rating_w, "Critical" if failed else
                                ("OK" if present else None),
                                "Enabled" if present else "Absent"))
    readings = {m["key"]: m["value"] for m in _DCMI.finditer(dcmi or "")}
    active = readings.get("Power reading state is", "activated") == "activated"
    if active and "Instantaneous power reading" in readings:
        out.power_now_w = _watts(readings["Instantaneous power reading"])
        out.power_peak_w = _watts(readings.get("Maximum during sampling period", ""))
        period = re.match(r"0*(\d+) Seconds", readings.get("Sampling period", ""))
        out.power_interval_min = round(int(period[1]) / 60, 2) if period else None
    if out.power_now_w is None:
        out.power_now_w = chassis_power if chassis_power is not None else (
            sum(psu_inputs) if psu_inputs else None)
    out.events, out.events_unknown = sel_events(sel)
    return out


def _watts(text: str) -> float | None:
    match = re.match(r"(\d+(?:\.\d+)?) Watts", text)
    return float(match[1]) if match else None


SEL_EMPTY = "SEL has no entries"
_SEL_ID = re.compile(r"^[0-9A-Fa-f]{1,4}$")


def sel_events(text: str) -> tuple[list[Event], str | None]:
    """``ipmitool sel elist`` lines as events, and why the log is unknown (None when every
    line was read). ipmitool prints record IDs in hexadecimal (``a``, ``1f``, ``1b5b``). An
    asserted event that means a failure (a PSU failure or lost input, a critical or
    non-recoverable threshold, an uncorrectable error, a thermal trip, lost redundancy) is
    Critical. A line that is not a record makes the whole log unknown: a record it might
    have been cannot be passed unseen."""
    events: list[Event] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.strip() == SEL_EMPTY:
            continue
        cells = [c.strip() for c in line.split("|")]
        if len(cells) < 5 or not _SEL_ID.match(cells[0]):
            return events, f"SEL line {number} is not a record: {line.strip()[:120]!r}"
        if cells[1] == "Pre-Init":
            created, rest = None, cells[3:]
        else:
            created, rest = _sel_time(cells[1], cells[2]), cells[3:]
        sensor, event = rest[0], rest[1] if len(rest) > 1 else ""
        asserted = len(rest) < 3 or rest[2] != "Deasserted"
        severity = "Critical" if asserted and SEL_CRITICAL.search(event) else "OK"
        events.append(Event("SEL", cells[0], created, severity, f"{sensor}: {event}"))
    return events, None


def _sel_time(day: str, clock: str) -> datetime | None:
    """ipmitool's date (MM/DD/YY or MM/DD/YYYY) and time (HH:MM:SS, or HH:MM:SS AM/PM, with
    a zone it may print) as UTC."""
    words = clock.split()
    twelve = len(words) > 1 and words[1] in ("AM", "PM")
    clock = " ".join(words[:2]) if twelve else (words[0] if words else "")
    for layout in ("%m/%d/%y", "%m/%d/%Y"):
        try:
            return datetime.strptime(f"{day} {clock}", layout + (
                " %I:%M:%S %p" if twelve else " %H:%M:%S")).replace(tzinfo=timezone.utc)
        except ValueError:
            continue
    return None


def power_from_subsystem(supplies: Sequence[Mapping[str, Any]],
                         environment: Mapping[str, Any] | None) -> dict[str, Any]:
    """A chassis' ``PowerSubsystem`` (its PowerSupply resources) and ``EnvironmentMetrics``
    (``PowerWatts``), the Redfish 2020 resources, in the shape of the older ``Power``
    resource that :func:`reading` reads."""
    control = []
    watts = (environment or {}).get("PowerWatts")
    if isinstance(watts, dict) and _number(watts.get("Reading")) is not None:
        control.append({"Name": "EnvironmentMetrics PowerWatts",
                        "PowerConsumedWatts": watts["Reading"]})
    return {"PowerSupplies": list(supplies), "PowerControl": control}


def thermal_from_subsystem(metrics: Mapping[str, Any] | None,
                           fans: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """A chassis' ``ThermalSubsystem`` (``ThermalMetrics`` and its Fan resources) in the
    shape of the older ``Thermal`` resource: the summary's Intake, Ambient and Exhaust,
    then every other named reading."""
    temperatures: list[dict[str, Any]] = []
    summary = (metrics or {}).get("TemperatureSummaryCelsius")
    seen: set[str] = set()
    if isinstance(summary, dict):
        for context in ("Intake", "Ambient", "Exhaust"):
            value = summary.get(context)
            if isinstance(value, dict) and _number(value.get("Reading")) is not None:
                temperatures.append({"Name": f"{context} (summary)", "PhysicalContext":
                                     "Intake" if context == "Ambient" else context,
                                     "ReadingCelsius": value["Reading"]})
                seen.add(str(value.get("DataSourceUri")))
    readings = (metrics or {}).get("TemperatureReadingsCelsius")
    for item in readings if isinstance(readings, list) else []:
        if isinstance(item, dict) and str(item.get("DataSourceUri")) not in seen:
            temperatures.append({"Name": item.get("DeviceName") or "temperature",
                                 "ReadingCelsius": item.get("Reading")})
    converted = []
    for fan in fans:
        speed = fan.get("SpeedPercent")
        rpm = speed.get("SpeedRPM") if isinstance(speed, dict) else None
        converted.append({"Name": fan.get("Name"), "Status": fan.get("Status"),
                          "Reading": rpm, "ReadingUnits": "RPM" if rpm is not None else None})
    return {"Temperatures": temperatures, "Fans": converted}
