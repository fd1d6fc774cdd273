"""gpu_throughput: a short bf16 matrix-multiply load on every GPU of the node at once (the
thermal probe's, for gpu_bf16_seconds), each GPU's rate the median of its windows after a
warm-up, held against its model's floor (gpu_bf16_min_fraction x gpu_bf16_tflops[model])
and against the median of the node's GPUs of its model: a GPU that is power-capped,
clock-locked or degraded fails on a node of one GPU or eight, named with its rate, its
clock and power under load, the floor and the variables that set it.

Skips on a node without NVIDIA GPUs, and where no GPU can be judged: each model has no
reference and no peer on the node. Variables: gpu_bf16_tflops (H100 80GB HBM3 680, H200
667), gpu_bf16_min_fraction (0.75), gpu_bf16_seconds (10).
"""

from __future__ import annotations

from typing import Any

import pytest

from gpufleet.conformance.checks.gpu_throughput import (
    SIZE,
    WARMUP_S,
    WINDOWS,
    readings,
    unjudgeable,
    unjudged_reason,
    verdict,
)
from gpufleet.conformance.launch import run_script
from gpufleet.conformance.session import ConformanceSession, Node, RecordProperty
from gpufleet.conformance.suites.gpu_throughput import GpuThroughputSettings

START_BUDGET_S = 180  # torch's import and CUDA's start on every GPU, beside the load


def test_bf16_throughput_floor(node: Node, conformance: ConformanceSession,
                               record_property: RecordProperty) -> None:
    facts = node.known
    gpus: list[dict[str, Any]] | None = facts.get("gpus")
    if gpus is None:
        pytest.skip(f"no NVIDIA GPU: {facts.why_absent('gpus')}")
    if not gpus:
        pytest.skip("no NVIDIA GPU: nvidia-smi lists none")
    typed = node.typed(GpuThroughputSettings)
    reference = {str(k): float(v) for k, v in typed.gpu_bf16_tflops.items()}
    lacking = unjudgeable(gpus, reference)
    if set(lacking) == {str(g.get("name")) for g in gpus}:
        pytest.skip(unjudged_reason(lacking))
    seconds = typed.gpu_bf16_seconds
    output = run_script(node, "thermal", [
        "--seconds", str(seconds), "--size", str(SIZE), "--trials", str(WINDOWS),
        "--warmup-s", str(WARMUP_S), "--interval-s", "0.5"], seconds + START_BUDGET_S)
    skip = next((e for e in output.events if e.get("event") == "skip"), None)
    if skip:
        pytest.skip(skip["reason"])
    found = readings(output.events)
    if not found:
        error = next((e.get("message") for e in output.events if e.get("event") == "error"),
                     output.stderr_tail)
        pytest.fail(f"unknown: the matmul probe failed (exit {output.rc}): {error}")
    outcome = verdict(node.name, gpus, found, reference, typed.gpu_bf16_min_fraction)
    tflops = {f"GPU{g}": None if r.tflops is None else round(r.tflops, 1)
              for g, r in found.items()}
    record_property("tflops", tflops)
    record_property("floors", outcome.floors)
    record_property("sm_mhz", {f"GPU{g}": r.sm_mhz for g, r in found.items()})
    record_property("power_w", {f"GPU{g}": r.power_w for g, r in found.items()})
    if outcome.unjudged:
        record_property("unjudged_models", outcome.unjudged)
    conformance.add_report("gpu_throughput", node.name, {
        "tflops": tflops, "floors": outcome.floors, "seconds": seconds,
        "fraction": typed.gpu_bf16_min_fraction})
    if outcome.problems:
        record_property("finding_class", "performance")
    assert not outcome.problems, "; ".join(outcome.problems)
