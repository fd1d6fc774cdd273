"""The gpu_throughput suite's verdict, pure: each GPU's bf16 matrix-multiply rate in a short
run of the thermal probe (``conformance/probes/thermal.py``), against a floor per GPU model
and against the other GPUs of its model on the node.

The floor of a model is ``gpu_bf16_min_fraction`` x ``gpu_bf16_tflops[model]``, the rate a
healthy GPU of that model sustained in the same probe (8192 x 8192 bf16 matrices). The
defaults and how the fraction was chosen are in docs/conformance.md (gpu_throughput).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# What a healthy GPU sustained in the probe (TFLOP/s), by nvidia-smi's model name:
# H100 SXM 80GB, 680 on the GPU machine here on 2026-12-07 (tests/fixtures/h100x1);
# H200 SXM, 667 in the 120 s thermal soak of 2026-12-02 (tests/fixtures/h200x1).
REFERENCE_TFLOPS: dict[str, float] = {"NVIDIA H100 80GB HBM3": 680, "NVIDIA H200": 667}
MIN_FRACTION = 0.75
SIZE = 8192  # the matrices' dimension the references were measured with
WARMUP_S = 2.0  # load before the windows: CUDA's start and cuBLAS's first choices
WINDOWS = 3  # equal windows after the warm-up; a GPU's figure is their median
REFERENCE_VAR = "gpu_bf16_tflops"
FRACTION_VAR = "gpu_bf16_min_fraction"


@dataclass(frozen=True)
class Reading:
    """One GPU under the probe's load: its rate (the median of its windows; None when its
    load failed) and the median SM clock and power nvidia-smi sampled after the warm-up."""

    gpu: int
    tflops: float | None
    sm_mhz: float | None = None
    power_w: float | None = None


@dataclass
class Outcome:
    """The verdict on a node: ``problems`` (each fails it), the floor each GPU was held to
    by ``GPU<i>``, and the models that have no reference (``unjudged``)."""

    problems: list[str] = field(default_factory=list)
    floors: dict[str, float] = field(default_factory=dict)
    unjudged: list[str] = field(default_factory=list)


def normalised(model: str) -> str:
    """A model name compared without case or repeated spaces."""
    return " ".join(model.split()).casefold()


def floor_of(model: str, reference: Mapping[str, float], fraction: float) -> float | None:
    """``fraction`` x the reference of ``model`` (matched without case); None when the
    mapping has none."""
    wanted = normalised(model)
    for name, tflops in reference.items():
        if normalised(name) == wanted:
            return fraction * float(tflops)
    return None


def _median(values: Sequence[float]) -> float | None:
    return float(statistics.median(values)) if values else None


def readings(events: Sequence[Mapping[str, Any]], warmup_s: float = WARMUP_S
             ) -> dict[int, Reading]:
    """Each GPU's reading from the probe's ``summary`` (its ``tflops_trials`` windows, else
    its whole-run ``tflops_per_gpu``) and ``sample`` lines, by GPU index; empty without a
    summary."""
    summary = next((e for e in reversed(events) if e.get("event") == "summary"), None)
    if summary is None:
        return {}
    whole = list(summary.get("tflops_per_gpu") or [])
    windows = list(summary.get("tflops_trials") or [])
    samples: dict[int, list[Mapping[str, Any]]] = {}
    for event in events:
        if event.get("event") == "sample" and float(event.get("t", 0.0)) >= warmup_s:
            samples.setdefault(int(event["gpu"]), []).append(event)
    found = {}
    for gpu in range(max(len(whole), len(windows))):
        trials = [float(x) for x in (windows[gpu] if gpu < len(windows) else []) or []]
        overall = whole[gpu] if gpu < len(whole) else None
        if gpu < len(whole) and overall is None:
            tflops = None  # the probe reports a failed load as null
        elif trials:
            tflops = _median(trials)
        else:
            tflops = None if overall is None else float(overall)
        series = samples.get(gpu, [])
        found[gpu] = Reading(
            gpu, tflops,
            _median([float(s["sm_mhz"]) for s in series if s.get("sm_mhz") is not None]),
            _median([float(s["power_w"]) for s in series if s.get("power_w") is not None]))
    return found


def _under_load(reading: Reading) -> str:
    parts = []
    if reading.sm_mhz is not None:
        parts.append(f"SM clock {reading.sm_mhz:.0f} MHz")
    if reading.power_w is not None:
        parts.append(f"{reading.power_w:.0f} W")
    return f" (under load: {', '.join(parts)})" if parts else ""


def _name(node: str, gpu: Mapping[str, Any], model: str) -> str:
    bus = gpu.get("pci.bus_id")
    return f"{node} GPU{gpu.get('index')} ({model}{f', {bus}' if bus else ''})"


def verdict(node: str, gpus: Sequence[Mapping[str, Any]], found: Mapping[int, Reading],
            reference: Mapping[str, float], fraction: float) -> Outcome:
    """Every GPU of the ``gpus`` fact against its model's floor and, where the node has
    several GPUs of its model, against ``fraction`` x their median rate; a GPU the probe did
    not measure fails. Each problem names the node, the GPU, its rate, the floor and the
    variables that set it."""
    outcome = Outcome()
    by_model: dict[str, list[float]] = {}
    for gpu in gpus:
        reading = found.get(int(gpu.get("index", -1)))
        if reading is not None and reading.tflops is not None:
            by_model.setdefault(str(gpu.get("name")), []).append(reading.tflops)
    for gpu in gpus:
        index, model = int(gpu.get("index", -1)), str(gpu.get("name"))
        reading = found.get(index)
        floor = floor_of(model, reference, fraction)
        if floor is not None:
            outcome.floors[f"GPU{index}"] = round(floor, 1)
        elif model not in outcome.unjudged:
            outcome.unjudged.append(model)
        if reading is None or reading.tflops is None:
            outcome.problems.append(f"{_name(node, gpu, model)}: the probe measured no bf16 "
                                    "rate (its load failed or torch did not see it)")
            continue
        rate = f"{reading.tflops:.0f} TFLOP/s bf16{_under_load(reading)}"
        if floor is not None and reading.tflops < floor:
            outcome.problems.append(
                f"{_name(node, gpu, model)}: {rate}, under the floor of {floor:.0f} TFLOP/s "
                f"({FRACTION_VAR} {fraction:g} x {REFERENCE_VAR}['{model}'] "
                f"{floor / fraction:g})")
            continue
        peers = by_model[model]
        middle = _median(peers)
        if len(peers) > 1 and middle is not None and reading.tflops < fraction * middle:
            outcome.problems.append(
                f"{_name(node, gpu, model)}: {rate}, under {fraction * middle:.0f} TFLOP/s, "
                f"{FRACTION_VAR} {fraction:g} x the median {middle:.0f} TFLOP/s of the "
                f"node's {len(peers)} {model} GPUs")
    return outcome


def unjudged_reason(models: Sequence[str]) -> str:
    """Why a node whose GPUs have no reference and no peers of their model is not judged."""
    return (f"no bf16 floor for {', '.join(models)}: set {REFERENCE_VAR} (model -> the "
            "TFLOP/s a healthy GPU sustains)")


def unjudgeable(gpus: Sequence[Mapping[str, Any]], reference: Mapping[str, float]) -> list[str]:
    """The models of ``gpus`` that can be judged neither by a floor nor against a peer (one
    GPU of a model without a reference); empty when every GPU can be."""
    counts: dict[str, int] = {}
    for gpu in gpus:
        counts[str(gpu.get("name"))] = counts.get(str(gpu.get("name")), 0) + 1
    return [model for model, n in counts.items()
            if n < 2 and floor_of(model, reference, 1.0) is None]
