"""thermal: a sustained bf16 matrix-product load on every GPU while temperature, power, SM
clock and clock event reasons are sampled every second; fails above the temperature limit,
on any thermal or power slowdown, or when clock and temperature move as mirror images (the
cooling cannot keep up). The curves are saved as CSV and PNG beside the report, and kept in
its data (at most ``CURVE_POINTS`` samples per GPU) with each GPU's clock/temperature
window, for the HTML report's plots.

Variables: thermal_seconds (300), thermal_size (8192), thermal_max_temp_c (85, or
gpu_max_temp_c), thermal_mirror_threshold (-0.8), thermal_min_clock_drop (0.05),
thermal_warmup_s (15: clocks fall from idle boost to their power-capped level first),
thermal_min_tflops (none): each GPU's matmul TFLOPS in ``perf_trials`` equal windows after
the warm-up, gated on their median (and, with --compare-baseline, on the node's baseline).
"""

from __future__ import annotations

import csv
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from gpufleet.conformance.baseline import judge_node
from gpufleet.conformance.launch import NodeOutput, run_script
from gpufleet.conformance.session import ConformanceSession, Node, RecordProperty
from gpufleet.conformance.suites.thermal import ThermalSettings
from gpufleet.conformance.verdict import Figure, failures, properties, settings
from gpufleet.suites.probes.thermal import clock_mirror, thermal_verdict

PLOTTING = threading.Lock()  # pyplot is not thread-safe, and every node's soak ends at once
COLUMNS = ("t", "gpu", "temp_c", "power_w", "sm_mhz", "reasons", "hw_thermal",
           "hw_power_brake", "sw_thermal")
CURVES = ("temp_c", "power_w", "sm_mhz")
CURVE_POINTS = 300


def save_curves(samples: list[dict[str, Any]], directory: Path, name: str) -> list[Path]:
    """The samples as CSV and as a PNG of temperature, SM clock and power per GPU."""
    directory.mkdir(parents=True, exist_ok=True)
    csv_path = directory / f"thermal-{name}.csv"
    with csv_path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(samples)
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, axes = plt.subplots(3, 1, figsize=(10, 8), sharex=True)
    for gpu in sorted({s["gpu"] for s in samples}):
        series = [s for s in samples if s["gpu"] == gpu]
        times = [s["t"] for s in series]
        for ax, key in zip(axes, ("temp_c", "sm_mhz", "power_w"), strict=True):
            ax.plot(times, [s.get(key) for s in series], label=f"GPU{gpu}")
    for ax, label in zip(axes, ("temperature (C)", "SM clock (MHz)", "power (W)"), strict=True):
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(loc="lower right", ncol=4)
    axes[-1].set_xlabel("seconds under load")
    fig.suptitle(f"{name}: sustained bf16 matmul load")
    png_path = directory / f"thermal-{name}.png"
    fig.savefig(png_path, dpi=100)
    plt.close(fig)
    return [csv_path, png_path]


def curves(samples: list[dict[str, Any]], points: int = CURVE_POINTS
           ) -> dict[str, dict[str, list[Any]]]:
    """Each GPU's temperature, power and SM clock over the soak, by ``GPU<i>``: columns of
    at most ``points`` samples (every k-th, the last kept, when the soak sampled more)."""
    out: dict[str, dict[str, list[Any]]] = {}
    for gpu in sorted({s["gpu"] for s in samples}):
        series = sorted((s for s in samples if s["gpu"] == gpu), key=lambda s: s["t"])
        step = -(-len(series) // points)
        kept = series[::step]
        if kept[-1] is not series[-1]:
            kept.append(series[-1])
        out[f"GPU{gpu}"] = {"t": [round(s["t"], 1) for s in kept],
                            **{key: [s.get(key) for s in kept] for key in CURVES}}
    return out


def mirror_windows(samples: list[dict[str, Any]], threshold: float, min_drop: float,
                   warmup_s: float) -> dict[str, dict[str, Any]]:
    """Each GPU's clock/temperature window after the warm-up (``clock_mirror``), rounded
    for the report, by ``GPU<i>``."""
    return {f"GPU{gpu}": {k: round(v, 4) if isinstance(v, float) else v for k, v in m.items()}
            for gpu, m in clock_mirror(samples, threshold, min_drop, warmup_s).items()}


def gpu_peak_power(samples: list[dict[str, Any]]) -> float | None:
    """The sum of every GPU's highest power draw during the soak (W); None when no GPU
    reported its power. The bmc suite counts it toward the node's measured peak."""
    peaks: dict[Any, float] = {}
    for s in samples:
        if isinstance(s.get("power_w"), (int, float)):
            peaks[s["gpu"]] = max(peaks.get(s["gpu"], 0.0), float(s["power_w"]))
    return round(sum(peaks.values()), 1) if peaks else None


def _soak(node: Node, trials: int) -> NodeOutput:
    settings = node.typed(ThermalSettings)
    seconds = settings.thermal_seconds
    return run_script(node, "thermal", [
        "--seconds", str(seconds), "--size", str(settings.thermal_size),
        "--trials", str(trials), "--warmup-s", str(_warmup(node))], seconds + 300)


def _warmup(node: Node) -> float:
    return node.typed(ThermalSettings).thermal_warmup_s


def _tflops(output: NodeOutput) -> dict[str, list[float]]:
    """Each GPU's TFLOPS in every window of the soak, by figure name."""
    summary = next((e for e in output.events if e.get("event") == "summary"), {})
    return {f"thermal.tflops.GPU{gpu}": [float(x) for x in windows]
            for gpu, windows in enumerate(summary.get("tflops_trials") or []) if windows}


def test_thermal_soak(node: Node, conformance: ConformanceSession,
                      record_property: RecordProperty) -> None:
    if not node.known.get("gpus"):
        pytest.skip(f"no NVIDIA GPU: {node.known.why_absent('gpus')}")
    start = time.monotonic()
    output = _soak(node, settings(node.host).trials)
    cost = time.monotonic() - start
    skip = next((e for e in output.events if e.get("event") == "skip"), None)
    if skip:
        pytest.skip(skip["reason"])
    samples = [e for e in output.events if e.get("event") == "sample"]
    if output.rc != 0 or not samples:
        error = next((e.get("message") for e in output.events if e.get("event") == "error"),
                     output.stderr_tail)
        pytest.fail(f"unknown: the thermal probe failed (exit {output.rc}): {error}")
    with PLOTTING:
        files = save_curves(samples, conformance.options.artifacts, node.name)
    summary = next((e for e in output.events if e.get("event") == "summary"), {})
    typed = node.typed(ThermalSettings)
    limit = typed.thermal_max_temp_c or typed.gpu_max_temp_c
    threshold = typed.thermal_mirror_threshold
    min_drop = typed.thermal_min_clock_drop
    conformance.add_report("thermal", node.name, {
        "summary": summary, "files": [str(f) for f in files], "curves": curves(samples),
        "mirror": mirror_windows(samples, threshold, min_drop, _warmup(node)),
        "max_temp_c": limit, "mirror_threshold": threshold, "min_clock_drop": min_drop,
        "warmup_s": _warmup(node), "gpu_peak_power_w": gpu_peak_power(samples)})
    record_property("files", [str(f) for f in files])
    record_property("tflops_per_gpu", summary.get("tflops_per_gpu"))
    record_property("max_temp_c", max(s["temp_c"] for s in samples if s.get("temp_c")))
    record_property("temp_limit_c", limit)
    problems = thermal_verdict(samples, limit, threshold, min_drop, _warmup(node))
    first = _tflops(output)
    floor = typed.thermal_min_tflops
    figures = [Figure(name, "TFLOPS", floor) for name in first]
    verdicts = judge_node(node, conformance.options.baseline, figures,
                          lambda trials: _tflops(_soak(node, trials)), first=first, cost_s=cost)
    record_property("verdicts", properties(verdicts))
    problems += failures(verdicts)
    assert not problems, "; ".join(problems)
