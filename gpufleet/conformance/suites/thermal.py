"""The thermal suite: a sustained GPU load."""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.conformance.registry import Suite, declared, setting
from gpufleet.conformance.suites.common import Performance, check_performance
from gpufleet.conformance.suites.gpu import GpuSettings


@dataclass(frozen=True, kw_only=True)
class ThermalSettings(Performance):
    """What the thermal suite reads."""

    gpu_max_temp_c: float = declared(GpuSettings.variables()["gpu_max_temp_c"])
    thermal_seconds: float = setting(300, "number", "length of the soak")
    thermal_size: int = setting(8192, "integer", "matmul size")
    thermal_warmup_s: float = setting(15, "number", "seconds before the windows")
    thermal_max_temp_c: float | None = setting(None, "number",
                                               "highest temperature (default: gpu_max_temp_c)")
    thermal_mirror_threshold: float = setting(-0.8, "number",
                                              "clock/temperature correlation that fails")
    thermal_min_clock_drop: float = setting(0.05, "number",
                                            "clock drop that counts as throttling")
    thermal_min_tflops: float | None = setting(None, "number", "TFLOPS floor per GPU")

SUITE = Suite(
    "thermal", ("acceptance",),
    "a sustained GPU load: temperature, clocks against temperature, TFLOPS",
    order=80,
    settings=ThermalSettings,
    records_baseline=True, check=check_performance)
