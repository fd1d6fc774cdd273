"""The thermal probe: parsing, scoring and verdicts on synthetic samples, its sampler against a
stand-in nvidia-smi, and the skip without a GPU."""

from __future__ import annotations

import csv
import datetime
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gpufleet.suites.probes import thermal
from gpufleet.suites.probes.thermal import mirror_score, parse_sample_line, thermal_verdict
from tests.conftest import FIXTURES
from tests.probe_runs import needs_torch, run_without_gpu

STAMP = "2025/03/04 05:06:07.890"
IDLE = "Not Active, Not Active, Not Active"
LINE = f"{STAMP}, 3, 71, 652.31, 1980, 0x0000000000000004, {IDLE}"


def series(gpu: int, temps: list[float], clocks: list[float], **flags: Any) -> list[dict[str, Any]]:
    """Sample lines one second apart; ``flags`` maps a flag to the indices where it is set."""
    return [
        {
            "event": "sample",
            "t": float(i),
            "gpu": gpu,
            "temp_c": temp,
            "power_w": 650.0,
            "sm_mhz": clocks[i],
            "reasons": 0,
            **{
                key: i in flags.get(key, ())
                for key in ("hw_thermal", "hw_power_brake", "sw_thermal")
            },
        }
        for i, temp in enumerate(temps)
    ]


def ramp(first: float, last: float, count: int) -> list[float]:
    return [first + (last - first) * i / (count - 1) for i in range(count)]


def healthy(gpu: int = 0) -> list[dict[str, Any]]:
    """Warms from 35 to 62 C and holds; the clock wobbles by a boost bin and dips under 1%."""
    temps = ramp(35, 62, 30) + [62.0] * 30
    clocks = [1980.0 - 15 * (i % 2) - (i > 40) * 15 for i in range(60)]
    return series(gpu, temps, clocks)


def throttled(gpu: int = 0) -> list[dict[str, Any]]:
    """Runs into the hardware thermal limit: 92 C, and the clock halves in the last 10 samples."""
    temps = ramp(40, 92, 50) + [92.0] * 10
    clocks = [1980.0] * 50 + [990.0] * 10
    return series(gpu, temps, clocks, hw_thermal=range(50, 60), sw_thermal=range(45, 60))


def mirrored(gpu: int = 0) -> list[dict[str, Any]]:
    """Heat climbs to 84 C while the clock sinks in step, with no slowdown flagged."""
    return series(gpu, ramp(40, 84, 60), ramp(1980, 1700, 60))


# --------------------------------------------------------------------------- parsing


def test_parse_sample_line() -> None:
    sample = parse_sample_line(LINE)
    stamp = datetime.datetime(2025, 3, 4, 5, 6, 7, 890000).timestamp()
    assert sample == {
        "timestamp": pytest.approx(stamp),
        "gpu": 3,
        "temp_c": 71.0,
        "power_w": 652.31,
        "sm_mhz": 1980.0,
        "reasons": 0x4,
        "hw_thermal": False,
        "hw_power_brake": False,
        "sw_thermal": False,
    }


def test_parse_sample_line_flags_and_missing_values() -> None:
    line = f"{STAMP}, 0, 93, [N/A], 1020, 0x00000000000000E8, Active, Not Active, Active"
    sample = parse_sample_line(line + "\n")
    assert sample["power_w"] is None
    assert sample["reasons"] == 0xE8
    assert (sample["hw_thermal"], sample["hw_power_brake"], sample["sw_thermal"]) == (
        True,
        False,
        True,
    )
    # Flags the GPU does not report come from the bitmask.
    line = f"{STAMP}, 1, 50, 300.00, 1410, 0x00000000000000C0, [N/A], [N/A], [N/A]"
    sample = parse_sample_line(line)
    assert (sample["hw_thermal"], sample["hw_power_brake"], sample["sw_thermal"]) == (
        True,
        True,
        False,
    )
    line = f"{STAMP}, 1, [N/A], [Not Supported], [N/A], [N/A], [N/A], [N/A], [N/A]"
    sample = parse_sample_line(line)
    assert (sample["temp_c"], sample["sm_mhz"], sample["reasons"]) == (None, None, 0)


@pytest.mark.parametrize(
    "line",
    [
        "",
        LINE.rsplit(",", 1)[0],
        LINE + ", 1",
        LINE.replace("Not Active", "Maybe", 1),
        LINE.replace("2025/03/04", "04-03-2025"),
        LINE.replace(" 71,", " hot,"),
    ],
)
def test_parse_sample_line_rejects(line: str) -> None:
    with pytest.raises(ValueError):
        parse_sample_line(line)


# --------------------------------------------------------------------------- scoring


def test_mirror_score() -> None:
    assert mirror_score([40, 50, 60, 70], [1980, 1900, 1820, 1740]) == pytest.approx(-1.0)
    assert mirror_score([40, 50, 60, 70], [1, 2, 3, 4]) == pytest.approx(1.0)
    assert mirror_score([40, 50, 40, 50], [1, 1, 2, 2]) == pytest.approx(0.0)
    assert mirror_score([60, 60, 60], [1980, 1900, 1800]) == 0.0
    assert mirror_score([40, 50, 60], [1980, 1980, 1980]) == 0.0
    assert mirror_score([40], [1980]) == 0.0
    assert mirror_score([], []) == 0.0
    with pytest.raises(ValueError):
        mirror_score([1, 2], [1, 2, 3])


def test_verdict_healthy_is_empty() -> None:
    samples = healthy(0) + healthy(1)
    temps = [s["temp_c"] for s in samples[:60]]
    clocks = [s["sm_mhz"] for s in samples[:60]]
    assert mirror_score(temps, clocks) < -0.3  # warming while a boost bin drops ...
    assert thermal_verdict(samples, max_temp_c=85) == []  # ... is no problem


def test_verdict_throttled() -> None:
    problems = thermal_verdict(healthy(0) + throttled(1), max_temp_c=85)
    assert problems[:3] == [
        "GPU1 reached 92 C, above the 85 C limit",
        "GPU1 hardware thermal slowdown in 10 of 60 samples",
        "GPU1 software thermal slowdown in 15 of 60 samples",
    ]
    assert all(problem.startswith("GPU1 ") for problem in problems)
    assert thermal_verdict(throttled(0), max_temp_c=95)[0].startswith("GPU0 hardware thermal")


def test_verdict_power_brake() -> None:
    samples = series(2, [50.0] * 6, [1980.0, 1980.0, 600.0, 1980.0, 1980.0, 1980.0])
    samples[2]["hw_power_brake"] = True
    assert thermal_verdict(samples, max_temp_c=85) == [
        "GPU2 hardware power brake slowdown in 1 of 6 samples"
    ]


def test_verdict_mirror_image() -> None:
    samples = list(reversed(healthy(0) + mirrored(1)))  # order by time is restored per GPU
    assert thermal_verdict(samples, max_temp_c=85, warmup_s=0) == [
        "GPU1 SM clock mirrors its temperature (r = -1.00) and fell 14% from 1980 to 1700 MHz: "
        "the cooling cannot keep up"
    ]
    assert thermal_verdict(mirrored(1), max_temp_c=85, mirror_threshold=-1.01, warmup_s=0) == []
    assert thermal_verdict(mirrored(1), max_temp_c=85, min_clock_drop=0.2, warmup_s=0) == []


def test_verdict_ignores_missing_values() -> None:
    samples = mirrored(0)
    for sample in samples[::2]:
        sample["temp_c"] = None
    assert len(thermal_verdict(samples, max_temp_c=85, warmup_s=0)) == 1
    for sample in samples:
        sample["sm_mhz"] = None
    assert thermal_verdict(samples, max_temp_c=85, warmup_s=0) == []
    assert thermal_verdict([], max_temp_c=85) == []


def _h200_trace(name: str) -> list[dict[str, Any]]:
    rows = list(csv.DictReader((FIXTURES / "h200x2" / "gpufleet" / name).open()))
    return [{"t": float(r["t"]), "gpu": int(r["gpu"]), "temp_c": float(r["temp_c"]),
             "power_w": float(r["power_w"]), "sm_mhz": float(r["sm_mhz"]),
             "reasons": int(r["reasons"]), "hw_thermal": r["hw_thermal"] == "True",
             "hw_power_brake": r["hw_power_brake"] == "True",
             "sw_thermal": r["sw_thermal"] == "True"} for r in rows]


def test_a_real_power_capped_h200_soak_is_healthy() -> None:
    """2x H200, 120 s of bf16 matmuls: clocks fall from the 1980 MHz idle boost to ~1430 MHz
    in the first seconds (SW power cap at 700 W, reasons 0x4) while the GPUs warm up, then
    hold. Past the warm-up that is healthy; counted from t=0 it would look like mirroring."""
    samples = _h200_trace("thermal.csv")
    assert len(samples) == 242
    assert thermal_verdict(samples, max_temp_c=85) == []
    assert len(thermal_verdict(samples, max_temp_c=85, warmup_s=0)) == 2


def test_a_second_h200_soak_passes_and_fails_on_a_low_temperature_limit() -> None:
    """The run after the warm-up fix, on another 2x H200 host: healthy at 85 C; a limit
    under its peak (61 C on GPU 0) names that GPU."""
    samples = _h200_trace("thermal-pass.csv")
    assert thermal_verdict(samples, max_temp_c=85) == []
    problems = thermal_verdict(samples, max_temp_c=58)
    assert problems == ["GPU0 reached 61 C, above the 58 C limit"]


# --------------------------------------------------------------------------- sampler

FAKE_SMI = """#!{python}
import datetime, os, sys, time
args = sys.argv[1:]
if os.environ.get("FAKE_SMI_OLD") and "clocks_event_reasons" in args[0]:
    sys.stderr.write("Field is not a valid field to query.\\n")
    sys.exit(2)
def lines():
    now = datetime.datetime.now().strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]
    for gpu in range(2):
        idle = ", ".join(["Not Active"] * 3)
        print(f"{{now}}, {{gpu}}, {{60 + gpu}}, 500.00, 1980, 0x0, {{idle}}")
    sys.stdout.flush()
lines()
if "-lms" in args:
    while True:
        time.sleep(int(args[args.index("-lms") + 1]) / 1000)
        lines()
"""


@pytest.fixture
def fake_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    script = tmp_path / "nvidia-smi"
    script.write_text(FAKE_SMI.format(python=sys.executable))
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    return script


@pytest.mark.parametrize("old", [False, True])
def test_sampler_prints_samples(
    fake_smi: Path, old: bool, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    if old:
        monkeypatch.setenv("FAKE_SMI_OLD", "1")
    command, problem = thermal._working_query()
    assert problem == ""
    assert command is not None
    assert ("clocks_throttle_reasons.active" in command[1]) is old
    sampler = thermal._Sampler(command, 0.05, time.time())
    sampler.start()
    time.sleep(1.0)
    sampler.stop()
    samples = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(samples) == sampler.count >= 4
    assert {sample["gpu"] for sample in samples} == {0, 1}
    assert all(sample["event"] == "sample" and 0 <= sample["t"] < 5 for sample in samples)
    assert samples[0]["temp_c"] == 60.0
    assert set(samples[0]) == {
        "event",
        "t",
        "gpu",
        "temp_c",
        "power_w",
        "sm_mhz",
        "reasons",
        "hw_thermal",
        "hw_power_brake",
        "sw_thermal",
    }


def test_query_reports_a_missing_nvidia_smi(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert thermal._working_query() == (None, "nvidia-smi is not on PATH")


# --------------------------------------------------------------------------- the program


@needs_torch
def test_without_a_gpu_it_skips() -> None:
    code = (
        "import sys, gpufleet.suites.probes.thermal as t; loaded = 'torch' in sys.modules; "
        "code = t.main(['--seconds', '1']); print(loaded, code)"
    )
    done = run_without_gpu(code)
    assert done.returncode == 0, done.stderr
    skip, last = done.stdout.splitlines()
    assert json.loads(skip) == {"event": "skip", "reason": "no CUDA GPU"}
    assert last == "False 0"



def test_window_tflops_splits_the_load_after_the_warm_up() -> None:
    from gpufleet.suites.probes.thermal import window_tflops

    steady = [(t * 0.5, t * 10) for t in range(41)]  # 20 matmuls a second for 20 s
    flops = 2 * 1000**3 * 20 / 1e12
    assert window_tflops(steady, 1000, 5.0, 3) == pytest.approx([flops] * 3)
    halved = [(float(t), 10 * t if t <= 10 else 100 + 5 * (t - 10)) for t in range(21)]
    assert window_tflops(halved, 1000, 0.0, 4) == pytest.approx(
        [2 * 1000**3 * n / 1e12 for n in (10, 10, 5, 5)])
    assert window_tflops([], 1000, 0.0, 3) == []
    assert window_tflops([(1.0, 5)], 1000, 0.0, 3) == []  # one mark: no rate
    assert window_tflops(steady, 1000, 30.0, 3) == []  # the load ended in the warm-up


def test_clock_mirror_gives_the_window_the_verdict_judges() -> None:
    """The real power-capped soak: counted from t=0 both GPUs' clocks mirror their
    temperature (the warm-up fall), past the warm-up neither does."""
    samples = _h200_trace("thermal.csv")
    from_start = thermal.clock_mirror(samples, warmup_s=0)
    assert sorted(from_start) == [0, 1]
    assert all(m["mirrored"] and m["r"] <= -0.8 for m in from_start.values())
    after = thermal.clock_mirror(samples)
    assert not any(m["mirrored"] for m in after.values())
    assert all(m["from_s"] >= 15 and m["to_s"] > 100 for m in after.values())


def test_the_curves_kept_in_the_report_are_bounded_and_end_at_the_last_sample() -> None:
    from gpufleet.suites.test_thermal import curves, mirror_windows

    samples = _h200_trace("thermal.csv")
    kept = curves(samples, points=50)
    assert sorted(kept) == ["GPU0", "GPU1"]
    last = max(s["t"] for s in samples if s["gpu"] == 0)
    assert len(kept["GPU0"]["t"]) <= 51 and kept["GPU0"]["t"][-1] == round(last, 1)
    assert len(kept["GPU0"]["temp_c"]) == len(kept["GPU0"]["sm_mhz"]) == len(kept["GPU0"]["t"])
    assert len(curves(samples)["GPU1"]["t"]) == sum(s["gpu"] == 1 for s in samples)
    windows = mirror_windows(samples, -0.8, 0.05, 0)
    assert windows["GPU0"]["mirrored"] is True and isinstance(windows["GPU0"]["r"], float)
