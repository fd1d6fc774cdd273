"""Stable verdicts for performance checks: warm-up plus k trials, a gate on the median, the
spread reported, and a median just under the gate re-measured once with more trials before
it fails a node.

A check hands :func:`judge` the figures it gates (name, unit, inventory floor) and a
function that measures all of them ``k`` times in one probe run. Each figure's gate is the
larger of its floor and ``baseline_fraction`` x the node's own baseline (``baseline``).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpufleet.inventory.model import Host
from gpufleet.provision.role import RoleVars, Var

VARIABLES = {
    "perf_trials": Var(5, "integer", "timed trials of every performance figure (at least 3)"),
    "perf_remeasure_trials": Var(None, "integer",
                                 "trials of the re-measurement near the gate (default 2 x "
                                 "perf_trials)"),
    "perf_remeasure_margin": Var(0.1, "number",
                                 "a median this fraction under its gate is re-measured"),
    "baseline_fraction": Var(0.9, "number",
                             "--compare-baseline gates at this fraction of the node's baseline"),
}
MIN_TRIALS = 3
MAX_TRIALS = 100

Measure = Callable[[int], Mapping[str, list[float]]]


@dataclass(frozen=True)
class Settings:
    """A host's verdict variables, validated."""

    trials: int = 5
    remeasure_trials: int = 10
    margin: float = 0.1
    fraction: float = 0.9


def settings(host: Host) -> Settings:
    """The host's verdict variables; raises VarError naming the host, key and place."""
    v = RoleVars(host, {k: var.default for k, var in VARIABLES.items()})
    trials = v.integer("perf_trials")
    if not MIN_TRIALS <= trials <= MAX_TRIALS:
        raise v.fail("perf_trials", f"an integer from {MIN_TRIALS} to {MAX_TRIALS}", trials)
    again = v.integer("perf_remeasure_trials") if "perf_remeasure_trials" in v else 2 * trials
    if not MIN_TRIALS <= again <= MAX_TRIALS:
        raise v.fail("perf_remeasure_trials", f"an integer from {MIN_TRIALS} to {MAX_TRIALS}",
                     again)
    margin = v.number("perf_remeasure_margin")
    if not 0 <= margin < 1:
        raise v.fail("perf_remeasure_margin", "a number from 0 to under 1", margin)
    fraction = v.number("baseline_fraction")
    if not 0 < fraction <= 1:
        raise v.fail("baseline_fraction", "a number above 0 and at most 1", fraction)
    return Settings(trials, again, margin, fraction)


def median(values: list[float]) -> float:
    """The median of ``values`` (at least one)."""
    return float(statistics.median(values))


def spread(values: list[float]) -> float:
    """(max - min) / median: how far apart the trials were, as a fraction of the median."""
    middle = median(values)
    return (max(values) - min(values)) / middle if middle else 0.0


def iqr(values: list[float]) -> float:
    """The interquartile range (inclusive quartiles); 0 for a single value."""
    if len(values) < 2:
        return 0.0
    low, _, high = statistics.quantiles(values, n=4, method="inclusive")
    return float(high - low)


@dataclass(frozen=True)
class Figure:
    """A figure a check gates: higher is better; ``floor`` is the inventory's minimum."""

    name: str
    unit: str
    floor: float | None = None


@dataclass(frozen=True)
class Gate:
    """The minimum a figure's median must reach, and where it comes from."""

    value: float | None
    source: str  # floor | baseline | none
    baseline: float | None = None
    floor: float | None = None

    @classmethod
    def of(cls, floor: float | None, baseline: float | None, fraction: float) -> Gate:
        """max(floor, fraction x baseline), whichever of them is known."""
        scaled = None if baseline is None else fraction * baseline
        if scaled is not None and (floor is None or scaled > floor):
            return cls(scaled, "baseline", baseline, floor)
        return cls(floor, "floor" if floor is not None else "none", baseline, floor)


def _number(value: float) -> str:
    return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"


@dataclass
class Verdict:
    """One figure's trials, its median against its gate, and whether it was re-measured."""

    figure: Figure
    trials: list[float]
    gate: Gate
    remeasured: list[float] = field(default_factory=list)
    note: str = ""

    @property
    def values(self) -> list[float]:
        return self.trials + self.remeasured

    @property
    def median(self) -> float:
        return median(self.values)

    @property
    def passed(self) -> bool:
        return self.gate.value is None or self.median >= self.gate.value

    def near(self, margin: float) -> bool:
        """Under the gate by less than ``margin`` of it."""
        gate = self.gate.value
        return gate is not None and gate * (1 - margin) <= self.median < gate

    def message(self) -> str:
        """``NAME median X UNIT of k trials (spread Y%), gate Z (source)`` and the
        re-measurement, if any."""
        f = self.figure
        unit = f" {f.unit}" if f.unit else ""
        text = (f"{f.name} median {_number(self.median)}{unit} of {len(self.values)} "
                f"trials (spread {spread(self.values):.0%})")
        gate = self.gate
        if gate.value is not None:
            origin = (f"{gate.value / gate.baseline:.0%} of baseline {_number(gate.baseline)}"
                      if gate.source == "baseline" and gate.baseline else "floor")
            text += f", gate {_number(gate.value)} ({origin})"
        if self.remeasured:
            text += f", re-measured with {len(self.remeasured)} more trials"
        return text + (f"; {self.note}" if self.note else "")

    def to_dict(self) -> dict[str, Any]:
        """Every trial, the median, spread and IQR, the gate and the trend to the baseline."""
        values = self.values
        out: dict[str, Any] = {
            "unit": self.figure.unit, "trials": [round(x, 4) for x in self.trials],
            "median": round(self.median, 4), "spread": round(spread(values), 4),
            "iqr": round(iqr(values), 4), "gate": self.gate.value, "gate_source": self.gate.source,
            "floor": self.gate.floor, "passed": self.passed}
        if self.remeasured:
            out["remeasured"] = [round(x, 4) for x in self.remeasured]
        if self.gate.baseline is not None:
            out["baseline"] = self.gate.baseline
            out["ratio"] = round(self.median / self.gate.baseline, 4) if self.gate.baseline \
                else None
        if self.note:
            out["note"] = self.note
        return out


BaselineOf = Callable[[str], float | None]


def judge(figures: list[Figure], measure: Measure, setting: Settings, *,
          baseline_of: BaselineOf | None = None, can_remeasure: Callable[[], str] | None = None,
          first: Mapping[str, list[float]] | None = None) -> dict[str, Verdict]:
    """Measure ``figures`` with ``setting.trials`` trials (or take ``first``, already
    measured), gate each median, and re-measure once, with ``setting.remeasure_trials``
    trials, when a median is under its gate by less than the margin. ``can_remeasure``
    returns why a re-measurement cannot run ("" when it can). A figure the measurement did
    not report is left out of the result."""
    trials = first if first is not None else measure(setting.trials)
    verdicts = {}
    for figure in figures:
        values = list(trials.get(figure.name) or [])
        if not values:
            continue
        base = baseline_of(figure.name) if baseline_of else None
        verdicts[figure.name] = Verdict(figure, values,
                                        Gate.of(figure.floor, base, setting.fraction))
    near = [v for v in verdicts.values() if v.near(setting.margin)]
    if near:
        refused = can_remeasure() if can_remeasure else ""
        if refused:
            for v in near:
                v.note = f"not re-measured: {refused}"
        else:
            again = measure(setting.remeasure_trials)
            for v in near:
                v.remeasured = list(again.get(v.figure.name) or [])
                if not v.remeasured:
                    v.note = "the re-measurement did not report it"
    return verdicts


def failures(verdicts: Mapping[str, Verdict]) -> list[str]:
    """The message of every verdict that failed its gate."""
    return [v.message() for v in verdicts.values() if not v.passed]


def properties(verdicts: Mapping[str, Verdict]) -> dict[str, dict[str, Any]]:
    """Every verdict as a JSON report property value, by figure name."""
    return {name: v.to_dict() for name, v in verdicts.items()}
