"""The bmc suite's verdicts on a ``BmcReading`` (``gpufleet/bmc/reading.py``): PSU health,
headroom and redundancy against the node's measured peak, inlet temperature and fans,
critical events in the system event log, and each rack's power budget.

A node's measured peak is the highest of what was measured, never a nameplate: the BMC's
chassis input power now, the highest it saw over its own interval
(``PowerMetrics.MaxConsumedWatts``), the GPUs' summed peak power during this run's
thermal soak, and the peak the node's baseline recorded at certification.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gpufleet.bmc.reading import BmcReading, Event, Psu

AIR_COOLED_LIMIT_W = 15000.0
PEAK_FIGURE = "power.peak_w"  # the measured peak's name in a node's baseline
_REDUNDANCY = re.compile(r"^(?:N(?:\+(\d+))?|2N)\Z")


def measured_peak(bmc: BmcReading | None, gpu_soak_w: float | None = None,
                  recorded_w: float | None = None) -> tuple[float | None, str]:
    """The node's measured peak power and where it came from."""
    sources = {"the BMC's chassis input power now": bmc.power_now_w if bmc else None,
               "the BMC's highest over its interval": bmc.power_peak_w if bmc else None,
               "the GPUs during the thermal soak": gpu_soak_w,
               "the peak recorded in the node's baseline": recorded_w}
    known = {k: v for k, v in sources.items() if v is not None and v > 0}
    if not known:
        return None, "no power was measured"
    source = max(known, key=lambda k: known[k])
    return known[source], source


def parse_redundancy(text: str | None) -> int | None:
    """The PSUs a node must be able to lose: ``N`` 0, ``N+M`` M, ``2N`` half of them
    (returned as -1); None when nothing is declared. ValueError when unreadable."""
    if text in (None, ""):
        return None
    match = _REDUNDANCY.match(str(text).strip().upper())
    if not match:
        raise ValueError(f"N, N+M or 2N, got {text!r}")
    if str(text).strip().upper() == "2N":
        return -1
    return int(match[1] or 0)


def psu_problems(psus: Sequence[Psu], peak_w: float, headroom: float,
                 redundancy: str | None) -> list[str]:
    """Failed PSUs; healthy capacity under ``headroom`` x the peak; and, with a declared
    redundancy, a peak the PSUs left after losing the ones it allows cannot carry. A PSU
    that reports no health is unknown, and so is the capacity the node can count on."""
    unknown = [p for p in psus if p.present and p.health is None and p.state in (None, "Enabled")]
    problems = [f"power supply {p.describe()}" for p in psus
                if p.present and not p.healthy and not any(p is u for u in unknown)]
    if unknown:
        return problems + [f"unknown: power supply {p.name} reports no health" for p in unknown]
    healthy = sorted((p.capacity_w or 0.0 for p in psus if p.healthy), reverse=True)
    unrated = [p.name for p in psus if p.healthy and not p.capacity_w]
    if unrated:
        problems.append(f"the BMC reports no rating (PowerCapacityWatts) for {', '.join(unrated)}")
    total = sum(healthy)
    if total < headroom * peak_w:
        problems.append(f"healthy PSUs are rated {total:.0f} W in all, under {headroom:g} x the "
                        f"measured peak of {peak_w:.0f} W ({headroom * peak_w:.0f} W)")
    lose = parse_redundancy(redundancy)
    if lose is not None:
        count = len(healthy) // 2 if lose == -1 else lose
        left = sum(healthy[count:])
        if len(healthy) <= count or left < peak_w:
            problems.append(f"{redundancy} redundancy: after losing {count} of the "
                            f"{len(healthy)} healthy PSUs, {left:.0f} W is left for a "
                            f"measured peak of {peak_w:.0f} W")
    return problems


def cooling_problems(reading: BmcReading, max_inlet_c: float) -> list[str]:
    """An inlet above ``max_inlet_c`` or its critical threshold, a failed fan; an unknown
    when the BMC reports no inlet temperature."""
    inlets = [t for t in reading.inlets() if t.celsius is not None]
    problems = [f"{t.name} reads {t.celsius:g} C, above {max_inlet_c:g} C (bmc_max_inlet_c)"
                for t in inlets if t.celsius is not None and t.celsius > max_inlet_c]
    problems += [f"{t.name} reads {t.celsius:g} C, at or above its critical threshold "
                 f"{t.upper_critical:g} C" for t in reading.temperatures
                 if t.celsius is not None and t.upper_critical is not None
                 and t.celsius >= t.upper_critical]
    problems += [f"fan {f.name} health {f.health}" for f in reading.fans if f.failed]
    if not inlets:
        problems.append("unknown: the BMC reports no inlet temperature")
    return problems


def new_critical_events(events: Iterable[Event], since: datetime) -> list[Event]:
    """Critical entries created after ``since`` (undated critical entries count)."""
    return [e for e in events if e.severity == "Critical"
            and (e.created is None or e.created > since)]


@dataclass(frozen=True)
class RackUse:
    """One rack's budget and its nodes' measured peaks."""

    rack: str
    supply_w: float
    margin: float
    cooling: str
    peaks: Mapping[str, float | None]

    @property
    def budget_w(self) -> float:
        return self.supply_w * self.margin

    @property
    def used_w(self) -> float:
        return sum(v for v in self.peaks.values() if v is not None)

    def to_dict(self) -> dict[str, Any]:
        return {"supply_w": self.supply_w, "margin": self.margin, "budget_w": self.budget_w,
                "cooling": self.cooling, "used_w": round(self.used_w, 1),
                "use": round(self.used_w / self.budget_w, 4) if self.budget_w else None,
                "nodes": dict(sorted(self.peaks.items()))}


def rack_of(variables: Mapping[str, Any], groups: Iterable[str]) -> str | None:
    """A host's rack: its ``rack`` variable, else its first group named rack*."""
    value = variables.get("rack")
    if value:
        return str(value)
    return next((g for g in sorted(groups) if g.startswith("rack")), None)


def rack_problems(use: RackUse, adding: str | None = None) -> tuple[list[str], list[str]]:
    """(problems, warnings) of one rack: measured peaks over the budget, nodes without a
    measured peak (unknown), and air cooling past AIR_COOLED_LIMIT_W (a warning)."""
    problems: list[str] = []
    missing = sorted(n for n, v in use.peaks.items() if v is None)
    if missing:
        problems.append(f"unknown: rack {use.rack}: no measured peak power for "
                        f"{', '.join(missing)} (certify them with the bmc suite and "
                        f"--record-baseline)")
    if use.used_w > use.budget_w:
        who = f" with {adding}" if adding else ""
        problems.append(f"rack {use.rack}{who}: measured peaks add up to {use.used_w:.0f} W, "
                        f"over its budget of {use.budget_w:.0f} W ({use.margin:g} x the "
                        f"{use.supply_w:.0f} W supply)")
    warnings = []
    if use.cooling == "air" and use.used_w > AIR_COOLED_LIMIT_W:
        warnings.append(f"rack {use.rack} is air cooled and its nodes draw {use.used_w:.0f} W "
                        f"at peak: air cooling tops out at 15-20 kW per rack")
    return problems, warnings
