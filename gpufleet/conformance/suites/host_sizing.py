"""The host_sizing suite: the host sized for its GPUs."""

from __future__ import annotations

from gpufleet.conformance.checks import host_sizing as host_sizing_checks
from gpufleet.conformance.registry import Suite
from gpufleet.conformance.suites import gpu
from gpufleet.facts.gather import FactRequest
from gpufleet.inventory.model import Host
from gpufleet.provision.role import Var


def _facts(host: Host) -> FactRequest:
    return FactRequest(custom=frozenset({host_sizing_checks.SHM}))


SUITE = Suite(
    "host_sizing", ("acceptance",),
    "memory, CPUs, /dev/shm, NUMA affinity and PCIe links sized for the GPUs",
    order=100,
    variables={"host_memory_multiple": Var(1.5, "number", "memory per total GPU memory"),
               "host_min_memory_gb": Var(None, "number", "memory floor"),
               "host_min_cpus": Var(None, "integer", "CPU floor"),
               "host_min_cpus_per_gpu": Var(4, "number", "CPUs per GPU"),
               "host_gpu_numa": Var(None, "mapping", "{GPU0: NUMA node, ...}"),
               "host_min_shm_gb": Var(1, "number", "size of /dev/shm"),
               "gpu_pcie_gen": gpu.VARIABLES["gpu_pcie_gen"],
               "gpu_pcie_width": gpu.VARIABLES["gpu_pcie_width"]},
    facts=_facts)
