"""The thermal suite: a sustained GPU load."""

from __future__ import annotations

from gpufleet.conformance.registry import Suite
from gpufleet.conformance.suites import gpu
from gpufleet.conformance.suites.common import PERFORMANCE, check_performance
from gpufleet.provision.role import Var

SUITE = Suite(
    "thermal", ("acceptance",),
    "a sustained GPU load: temperature, clocks against temperature, TFLOPS",
    order=80,
    variables={**PERFORMANCE,
               "gpu_max_temp_c": gpu.VARIABLES["gpu_max_temp_c"],
               "thermal_seconds": Var(300, "number", "length of the soak"),
               "thermal_size": Var(8192, "integer", "matmul size"),
               "thermal_warmup_s": Var(15, "number", "seconds before the windows"),
               "thermal_max_temp_c": Var(None, "number",
                                         "highest temperature (default: gpu_max_temp_c)"),
               "thermal_mirror_threshold": Var(-0.8, "number",
                                               "clock/temperature correlation that fails"),
               "thermal_min_clock_drop": Var(0.05, "number",
                                             "clock drop that counts as throttling"),
               "thermal_min_tflops": Var(None, "number", "TFLOPS floor per GPU")},
    records_baseline=True, check=check_performance)
