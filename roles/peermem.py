"""GPUDirect RDMA: NCCL's IB/RoCE transport reads and writes GPU memory directly instead of
bouncing through the host, by one of two routes (``gpudirect_route``):

- ``dmabuf``: the kernel's dma-buf, with NVIDIA's open kernel module on a kernel of 5.12 or
  later (NVIDIA's recommendation where it is available): no extra module, so the role
  neither builds nor loads nvidia-peermem, and writes why in its modules-load file;
- ``peermem``: the nvidia-peermem module loaded now and at every boot (the proprietary
  module's only route);
- ``auto`` (the default): dma-buf where the node's ``gpudirect`` fact says it is available,
  else nvidia-peermem.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from gpufleet.facts.catalog import gpudirect_fact
from gpufleet.facts.gather import FactRequest, Facts
from gpufleet.facts.gpudirect import dmabuf_route
from gpufleet.provision.managed import HEADER, file_change
from gpufleet.provision.plan import MANUAL, Change, Run
from gpufleet.provision.role import PlanContext, RoleBase, RoleVars, Var

MODULES_LOAD = "/etc/modules-load.d/gpufleet-nvidia-peermem.conf"
ROUTES = ("auto", "peermem", "dmabuf")


def route_choice(v: RoleVars) -> str:
    """``gpudirect_route`` (``auto`` where unset), validated (VarError names host, key and
    place)."""
    value = "auto" if v.get("gpudirect_route") is None else v.string("gpudirect_route").lower()
    if value not in ROUTES:
        raise v.fail("gpudirect_route", "one of " + ", ".join(ROUTES), v.get("gpudirect_route"))
    return value


def state_root(v: RoleVars) -> str:
    """Where the node's module and kernel state is read: ``""`` on a node (``/``), the lab's
    stand-in tree otherwise."""
    if v.string("kernel_state_root") == "/":
        return ""
    return v.path("kernel_state_root", "it prefixes the module paths").rstrip("/")


class PeermemRole(RoleBase):
    name = "peermem"
    order = 55
    variables: ClassVar[Mapping[str, Var]] = {
        "gpudirect_rdma": Var(None, "boolean", "GPUDirect RDMA through nvidia-peermem or "
                                               "dma-buf"),
        "gpudirect_route": Var("auto", "string", "auto, peermem or dmabuf: the route "
                                                 "GPUDirect RDMA takes"),
        "kernel_state_root": Var("/", "string", "where the kernel's module state is read "
                                                "(the lab's stand-in tree)"),
    }

    def active(self, v: RoleVars) -> bool:
        return v.get("gpudirect_rdma") is not None and v.boolean("gpudirect_rdma")

    def check(self, v: RoleVars) -> None:
        super().check(v)
        route_choice(v)
        state_root(v)

    def managed_files(self, v: RoleVars) -> dict[str, str]:
        return {"modules-load file": MODULES_LOAD}

    def request(self, v: RoleVars) -> FactRequest:
        return FactRequest(files=frozenset({MODULES_LOAD}),
                           custom=frozenset({gpudirect_fact(state_root(v))}))

    def plan(self, facts: Facts, v: RoleVars, ctx: PlanContext) -> list[Change]:
        state = facts.require("gpudirect")
        choice = route_choice(v)
        unavailable = dmabuf_route(state)
        if choice == "dmabuf" and unavailable is not None:
            return [Change(self.name, "gpudirect route dma-buf", MANUAL, unavailable,
                           "dma-buf available (or gpudirect_route: peermem)")]
        header = f"# {HEADER.format(role=self.name)}\n"
        if choice != "peermem" and unavailable is None:
            why = (f"# GPUDirect RDMA through dma-buf ({state['flavor']} kernel module, kernel "
                   f"{state['kernel']}): nvidia-peermem is not needed and not loaded "
                   f"(gpudirect_route: {choice})\n")
            change = file_change(self.name, facts, MODULES_LOAD, header + why)
            return [change] if change else []
        changes = [c for c in [file_change(self.name, facts, MODULES_LOAD,
                                           header + "nvidia-peermem\n")] if c]
        if not state["peermem_loaded"]:
            changes.append(Change(self.name, "module nvidia_peermem", "load", "not loaded",
                                  "loaded", [Run("modprobe nvidia-peermem",
                                                 "modprobe nvidia-peermem")]))
        return changes


ROLE = PeermemRole()
