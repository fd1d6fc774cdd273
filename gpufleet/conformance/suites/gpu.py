"""The gpu suite: the GPUs' health and the CUDA stack against their generation."""

from __future__ import annotations

from gpufleet.conformance.checks import generations
from gpufleet.conformance.registry import Suite
from gpufleet.facts.gather import FactRequest, Facts
from gpufleet.facts.xids import CRITICAL_XIDS
from gpufleet.inventory.model import Host
from gpufleet.provision.role import Var

VARIABLES = {
    "gpu_count": Var(None, "integer", "GPUs the node must have"),
    "gpu_model": Var(None, "string", "the model every GPU must be"),
    "gpu_nvlink": Var(None, "boolean", "NVLink between every GPU pair (default: when any "
                                       "pair has it)"),
    "gpu_pcie_gen": Var(None, "integer", "PCIe generation of every GPU's link"),
    "gpu_pcie_width": Var(None, "integer", "PCIe width of every GPU's link (default: its "
                                           "maximum)"),
    "gpu_max_temp_c": Var(85, "number", "highest temperature allowed"),
    "gpu_persistence_mode": Var(True, "boolean", "persistence mode must be on"),
    "gpu_critical_xids": Var(list(CRITICAL_XIDS), "list", "Xids that fail the node"),
    "gpu_xid_policy": Var(None, "mapping", "Xid -> fail, warn or ignore, over the default"),
    "gpu_xid_window_h": Var(None, "number", "only Xids of the last N hours count (default: "
                                            "since boot)"),
    "gpu_dcgm_diag_level": Var(1, "integer", "dcgmi diag level (0: off)"),
    "gpu_mixed_models": Var(False, "boolean", "GPUs of several models on a node or in a "
                                              "group are meant"),
}


def _has_gpus(host: Host, facts: Facts | None) -> bool:
    return bool(host.vars.get("gpu_count") or (facts and facts.get("pci_gpus")))


def _facts(host: Host) -> FactRequest:
    return FactRequest(custom=frozenset({generations.DRIVER_CUDA}))


SUITE = Suite(
    "gpu", ("conformance",),
    "GPU count, model, NVLink, PCIe, ECC, Xid, slowdowns, fabric, DCGM, and the "
    "CUDA stack against the GPUs' generation",
    order=60,
    variables=VARIABLES, cross_node=frozenset({"one_gpu_model_per_group"}),
    required_when=_has_gpus, facts=_facts)
