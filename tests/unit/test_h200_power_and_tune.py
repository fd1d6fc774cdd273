"""The thermal, bmc and tune runs on the 1x H200 machine (2026-12-02), held to what their
captures say: the soak's GPU peak power from its own samples, the rack budget it fed, the
BMC checks of a machine without a BMC, and the tuning table in docs/benchmarks.md."""

from __future__ import annotations

import csv
import json
from typing import Any

from gpufleet.suites.test_thermal import gpu_peak_power
from tests.conftest import ROOT

RUNS = ROOT / "tests" / "fixtures" / "h200x1" / "gpufleet"


def _report() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((RUNS / "conformance-thermal-bmc-2026-12-02.json")
                                     .read_text())
    return doc


def test_the_soak_s_gpu_peak_is_the_highest_power_its_samples_show() -> None:
    with (RUNS / "thermal-gpu-local-2026-12-02.csv").open() as fh:
        samples = [{"gpu": int(row["gpu"]), "power_w": float(row["power_w"])}
                   for row in csv.DictReader(fh)]
    assert len(samples) > 100
    peak = gpu_peak_power(samples)
    assert peak == _report()["data"]["thermal"]["gpu-local"]["gpu_peak_power_w"] == 694.1
    assert peak == round(max(s["power_w"] for s in samples), 1)


def test_the_rack_budget_ran_on_the_measured_soak_peak_and_no_bmc_was_not_passed() -> None:
    doc = _report()
    outcomes = {r["check"]: (r["outcome"], r["message"]) for r in doc["results"]}
    assert outcomes["test_rack_power_budget"] == ("pass", "")
    assert doc["data"]["racks"]["budgets"]["rack-h200"] == {
        "supply_w": 8000.0, "margin": 0.8, "budget_w": 6400.0, "cooling": "air",
        "used_w": 694.1, "use": 0.1085, "nodes": {"gpu-local": 694.1}}
    for check in ("test_power_supplies", "test_inlet_temperature_and_fans",
                  "test_no_new_critical_events"):
        assert outcomes[check] == ("skip", "not checked: no BMC (declare bmc_address, "
                                           "bmc_user and bmc_password)")


def test_the_benchmarks_show_the_tuning_table_of_the_real_run() -> None:
    table = [line for line in (RUNS / "tune-2026-12-02.txt").read_text().splitlines()
             if not line.startswith(("tune:", "  round"))]
    assert table[0].startswith("candidate") and table[-1].startswith("no winner")
    benchmarks = (ROOT / "docs" / "benchmarks.md").read_text()
    assert "\n".join(table) in benchmarks
