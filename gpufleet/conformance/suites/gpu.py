"""The gpu suite: the GPUs' health and the CUDA stack against their generation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpufleet.conformance.checks import gpu_generations
from gpufleet.conformance.registry import Settings, Suite, setting
from gpufleet.facts.gather import FactRequest, Facts
from gpufleet.inventory.model import Host


@dataclass(frozen=True, kw_only=True)
class GpuSettings(Settings):
    """What the gpu suite reads."""

    gpu_count: int | None = setting(None, "integer", "GPUs the node must have")
    gpu_model: str | None = setting(None, "string", "the model every GPU must be")
    gpu_nvlink: bool | None = setting(None, "boolean", "NVLink between every GPU pair "
                                                       "(default: when any pair has it)")
    gpu_pcie_gen: int | None = setting(None, "integer", "PCIe generation of every GPU's link")
    gpu_pcie_width: int | None = setting(None, "integer", "PCIe width of every GPU's link "
                                                          "(default: its maximum)")
    gpu_max_temp_c: float = setting(85, "number", "highest temperature allowed")
    gpu_critical_xids: list[Any] = setting([], "list", "Xids that fail the node, whatever "
                                                       "NVIDIA's catalogue says")
    gpu_xid_policy: dict[Any, Any] | None = setting(None, "mapping", "Xid -> fail, warn or "
                                                                     "ignore, over the catalogue")
    gpu_xid_window_h: float | None = setting(None, "number", "only Xids of the last N hours "
                                                             "count (default: since boot)")
    gpu_dcgm_diag_level: int = setting(1, "integer", "dcgmi diag level (0: off)")
    gpu_mixed_models: bool = setting(False, "boolean", "GPUs of several models on a node or "
                                                       "in a group are meant")


def _has_gpus(host: Host, facts: Facts | None) -> bool:
    return bool(host.vars.get("gpu_count") or (facts and facts.get("pci_gpus")))


def _facts(host: Host) -> FactRequest:
    return FactRequest(custom=frozenset({gpu_generations.DRIVER_CUDA}))


SUITE = Suite(
    "gpu", ("conformance",),
    "GPU count, model, NVLink, PCIe, ECC, Xid, slowdowns, fabric, DCGM, and the "
    "CUDA stack against the GPUs' generation",
    order=60,
    settings=GpuSettings, cross_node=frozenset({"one_gpu_model_per_group"}),
    required_when=_has_gpus, facts=_facts)
