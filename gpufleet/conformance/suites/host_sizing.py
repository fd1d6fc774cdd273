"""The host_sizing suite: the host sized for its GPUs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpufleet.conformance.checks import host_sizing as host_sizing_checks
from gpufleet.conformance.registry import Settings, Suite, declared, setting
from gpufleet.conformance.suites.gpu import GpuSettings
from gpufleet.facts.gather import FactRequest
from gpufleet.inventory.model import Host

_GPU = GpuSettings.variables()


@dataclass(frozen=True, kw_only=True)
class HostSizingSettings(Settings):
    """What the host_sizing suite reads."""

    host_memory_multiple: float = setting(1.5, "number", "memory per total GPU memory")
    host_min_memory_gb: float | None = setting(None, "number", "memory floor")
    host_min_cpus: int | None = setting(None, "integer", "CPU floor")
    host_min_cpus_per_gpu: float = setting(4, "number", "CPUs per GPU")
    host_gpu_numa: dict[Any, Any] | None = setting(None, "mapping", "{GPU0: NUMA node, ...}")
    host_min_shm_gb: float = setting(1, "number", "size of /dev/shm")
    gpu_pcie_gen: int | None = declared(_GPU["gpu_pcie_gen"])
    gpu_pcie_width: int | None = declared(_GPU["gpu_pcie_width"])


def _facts(host: Host) -> FactRequest:
    return FactRequest(custom=frozenset({host_sizing_checks.SHM}))


SUITE = Suite(
    "host_sizing", ("acceptance",),
    "memory, CPUs, /dev/shm, NUMA affinity and PCIe links sized for the GPUs",
    order=100,
    settings=HostSizingSettings,
    facts=_facts)
