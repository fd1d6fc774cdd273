"""Stable verdicts: the statistics, the gate on the median, and the re-measurement near it."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.conformance.verdict import (
    Figure,
    Gate,
    Settings,
    failures,
    iqr,
    judge,
    median,
    properties,
    settings,
    spread,
)
from gpufleet.errors import VarError
from gpufleet.inventory.load import load_inventory
from gpufleet.inventory.model import Host

EFFICIENCY = Figure("ddp.efficiency", "", 0.85)
# The DDP check on one healthy 2x H200 node, four runs in a row (and a fifth like them).
HEALTHY_NOISY = [0.78, 0.91, 0.96, 0.89, 0.90]
DEGRADED = [0.61, 0.58, 0.66, 0.60, 0.63]
NEAR = [0.80, 0.82, 0.79, 0.81, 0.80]


class Probe:
    """A measurement that hands out prepared series and counts how often it ran."""

    def __init__(self, *series: list[float]) -> None:
        self.series = list(series)
        self.asked: list[int] = []

    def __call__(self, trials: int) -> dict[str, list[float]]:
        self.asked.append(trials)
        values = self.series.pop(0)
        assert len(values) == trials
        return {"ddp.efficiency": values}


def test_statistics_of_a_series() -> None:
    assert median([3.0, 1.0, 2.0]) == 2.0
    assert median([1.0, 2.0, 3.0, 10.0]) == 2.5
    assert spread([90.0, 100.0, 110.0]) == pytest.approx(0.2)
    assert spread([5.0]) == 0.0
    assert iqr([1.0, 2.0, 3.0, 4.0, 5.0]) == pytest.approx(2.0)
    assert iqr([7.0]) == 0.0


def test_a_noisy_but_healthy_series_passes_on_its_median() -> None:
    single_shot = HEALTHY_NOISY[0]
    assert single_shot < EFFICIENCY.floor  # type: ignore[operator]  # the old gate failed it
    probe = Probe(HEALTHY_NOISY)
    verdict = judge([EFFICIENCY], probe, Settings())["ddp.efficiency"]
    assert verdict.passed
    assert probe.asked == [5]  # the median is clear of the gate: nothing re-measured
    assert verdict.message() == ("ddp.efficiency median 0.9 of 5 trials (spread 20%), "
                                 "gate 0.85 (floor)")
    report = verdict.to_dict()
    assert report["trials"] == HEALTHY_NOISY
    assert report["median"] == 0.9
    assert report["spread"] == pytest.approx(0.2)
    assert report["iqr"] == pytest.approx(0.02)
    assert report["gate"] == 0.85 and report["gate_source"] == "floor"


def test_a_degraded_series_fails_without_a_second_measurement() -> None:
    probe = Probe(DEGRADED)
    verdicts = judge([EFFICIENCY], probe, Settings())
    assert probe.asked == [5]  # 0.61 is more than 10% under 0.85
    assert failures(verdicts) == ["ddp.efficiency median 0.61 of 5 trials (spread 13%), "
                                  "gate 0.85 (floor)"]


def test_a_median_just_under_the_gate_is_re_measured_before_it_fails() -> None:
    recovered = Probe(NEAR, [0.90, 0.88, 0.91, 0.89, 0.90, 0.87, 0.92, 0.90, 0.89, 0.91])
    verdict = judge([EFFICIENCY], recovered, Settings())["ddp.efficiency"]
    assert recovered.asked == [5, 10]
    assert verdict.passed
    assert verdict.message().endswith(", re-measured with 10 more trials")
    assert len(verdict.to_dict()["remeasured"]) == 10

    still_slow = Probe(NEAR, [0.80] * 10)
    verdict = judge([EFFICIENCY], still_slow, Settings())["ddp.efficiency"]
    assert still_slow.asked == [5, 10]
    assert not verdict.passed
    assert verdict.message() == ("ddp.efficiency median 0.8 of 15 trials (spread 4%), gate 0.85 "
                                 "(floor), re-measured with 10 more trials")


def test_a_re_measurement_the_budget_cannot_afford_is_not_run() -> None:
    probe = Probe(NEAR)
    verdict = judge([EFFICIENCY], probe, Settings(),
                    can_remeasure=lambda: "120s left of the node's budget")["ddp.efficiency"]
    assert probe.asked == [5]
    assert not verdict.passed
    assert verdict.message().endswith("; not re-measured: 120s left of the node's budget")


def test_the_gate_is_the_floor_or_the_fraction_of_the_baseline_whichever_is_higher() -> None:
    assert Gate.of(0.85, None, 0.9) == Gate(0.85, "floor", None, 0.85)
    assert Gate.of(0.85, 1.0, 0.9) == Gate(0.9, "baseline", 1.0, 0.85)
    assert Gate.of(0.85, 0.9, 0.9) == Gate(0.85, "floor", 0.9, 0.85)
    assert Gate.of(None, 500.0, 0.9) == Gate(450.0, "baseline", 500.0, None)
    assert Gate.of(None, None, 0.9).value is None

    seq = Figure("storage.seq_read_mbps", "MB/s", 100.0)
    verdicts = judge([seq], lambda k: {seq.name: [480.0, 500.0, 510.0, 495.0, 505.0][:k]},
                     Settings(), baseline_of=lambda name: 1000.0)
    v = verdicts[seq.name]
    assert not v.passed  # half its own baseline, though five times the floor
    assert v.message() == ("storage.seq_read_mbps median 500 MB/s of 5 trials (spread 6%), "
                           "gate 900 (90% of baseline 1000)")
    assert properties(verdicts)[seq.name]["ratio"] == 0.5


def test_a_figure_without_a_gate_is_reported_and_passes() -> None:
    free = Figure("ddp.throughput_1", "samples/s")
    verdicts = judge([free, EFFICIENCY], lambda k: {free.name: [10.0, 11.0, 12.0]},
                     Settings(trials=3))
    assert list(verdicts) == ["ddp.throughput_1"]  # efficiency not measured: left out
    assert verdicts[free.name].passed
    assert verdicts[free.name].message() == ("ddp.throughput_1 median 11 samples/s of 3 trials "
                                             "(spread 18%)")


def test_settings_default_and_read_from_the_inventory(tmp_path: Path) -> None:
    assert settings(Host("n1", {}, frozenset({"all"}))) == Settings(5, 10, 0.1, 0.9)
    host = Host("n1", {"perf_trials": "7", "perf_remeasure_margin": 0.05,
                       "baseline_fraction": 0.8}, frozenset({"all"}))
    assert settings(host) == Settings(7, 14, 0.05, 0.8)


@pytest.mark.parametrize(("line", "message"), [
    ("perf_trials: 2", r"variable perf_trials must be an integer from 3 to 100, got 2"),
    ("perf_trials: many", r"variable perf_trials must be an integer, got 'many'"),
    ("perf_remeasure_trials: 1000", r"variable perf_remeasure_trials must be an integer from 3"),
    ("perf_remeasure_margin: 1.5", r"variable perf_remeasure_margin must be a number from 0"),
    ("baseline_fraction: 0", r"variable baseline_fraction must be a number above 0 and at "
                             r"most 1, got 0.0"),
])
def test_bad_settings_name_the_host_the_key_and_the_line(tmp_path: Path, line: str,
                                                         message: str) -> None:
    path = tmp_path / "hosts.yml"
    path.write_text(f"all:\n  hosts:\n    gpu01:\n      {line}\n")
    inventory = load_inventory(path)
    with pytest.raises(VarError, match=rf"^host gpu01: {message}.*\(.*hosts.yml:4\)$"):
        for host in inventory.hosts.values():
            settings(host)
    assert VarError("x").exit_code == 2
