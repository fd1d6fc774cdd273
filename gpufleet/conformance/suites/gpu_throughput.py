"""The gpu_throughput suite: every GPU's bf16 matrix-multiply rate in a short run, against a
floor per GPU model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpufleet.conformance.checks import gpu_throughput as checks
from gpufleet.conformance.registry import Settings, Suite, setting
from gpufleet.provision.role import RoleVars

MIN_SECONDS = 4.0


@dataclass(frozen=True, kw_only=True)
class GpuThroughputSettings(Settings):
    """What the gpu_throughput suite reads."""

    gpu_bf16_tflops: dict[Any, Any] = setting(
        dict(checks.REFERENCE_TFLOPS), "mapping",
        "GPU model (as nvidia-smi names it) -> the bf16 TFLOP/s a healthy GPU sustains")
    gpu_bf16_min_fraction: float = setting(
        checks.MIN_FRACTION, "number",
        "a GPU fails under this fraction of its model's gpu_bf16_tflops, or of the median of "
        "the node's GPUs of its model")
    gpu_bf16_seconds: float = setting(10, "number", "load time of the short run (at least 4)")


def _check(v: RoleVars) -> None:
    for model, tflops in v.mapping("gpu_bf16_tflops").items():
        if isinstance(tflops, bool) or not isinstance(tflops, int | float) or tflops <= 0:
            raise v.fail("gpu_bf16_tflops", f"a mapping of GPU model -> TFLOP/s above 0 "
                                            f"({model!r} has {tflops!r})",
                         v.get("gpu_bf16_tflops"))
    if not 0 < v.number("gpu_bf16_min_fraction") <= 1:
        raise v.fail("gpu_bf16_min_fraction", "a number above 0 and at most 1",
                     v.get("gpu_bf16_min_fraction"))
    if not v.number("gpu_bf16_seconds") >= MIN_SECONDS:
        raise v.fail("gpu_bf16_seconds", f"a number of seconds of at least {MIN_SECONDS:g}",
                     v.get("gpu_bf16_seconds"))


SUITE = Suite(
    "gpu_throughput", ("conformance",),
    "every GPU's bf16 matmul rate in a short run against a floor per GPU model",
    order=62,
    settings=GpuThroughputSettings,
    check=_check)
