"""The gpudirect suite: GPUDirect RDMA open on GPU nodes with RDMA devices, and used where an
NCCL log of the node shows it (in no set: ``--suite gpudirect`` or ``all`` runs it)."""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet import roles
from gpufleet.conformance.registry import Settings, Suite, declared, setting
from gpufleet.facts import catalog
from gpufleet.facts.gather import FactRequest
from gpufleet.inventory.model import Host
from gpufleet.provision.role import RoleVars


@dataclass(frozen=True, kw_only=True)
class GpudirectSettings(Settings):
    """What the gpudirect suite reads."""

    gpudirect_required: bool = setting(True, "boolean", "GPUDirect RDMA must be open and "
                                                        "used on GPU nodes with RDMA devices")
    gpudirect_nccl_log: str | None = setting(None, "string", "an NCCL INFO log on the node "
                                                             "to judge (a job's "
                                                             "NCCL_DEBUG_FILE)")
    kernel_state_root: str = declared(roles.gpudirect_settings()["kernel_state_root"])


def _check(v: RoleVars) -> None:
    if v.get("gpudirect_nccl_log") is not None:
        v.path("gpudirect_nccl_log", "it is read on the node")
    if v.string("kernel_state_root") != "/":
        v.path("kernel_state_root", "it prefixes the module paths")


def _facts(host: Host) -> FactRequest:
    request = roles.gpudirect_request(host)
    log = host.vars.get("gpudirect_nccl_log")
    if isinstance(log, str) and log.startswith("/"):
        request = request | FactRequest(custom=frozenset({catalog.gpudirect_log_fact(log)}))
    return request


SUITE = Suite(
    "gpudirect", (),
    "GPUDirect RDMA: nvidia-peermem or dma-buf open, no setting turning it off, GDRDMA in "
    "the node's NCCL log",
    order=55,
    settings=GpudirectSettings,
    facts=_facts,
    check=_check)
