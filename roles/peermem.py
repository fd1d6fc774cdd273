"""GPUDirect RDMA: the nvidia-peermem module loaded now and at every boot, so that NCCL's
IB/RoCE transport reads and writes GPU memory directly instead of bouncing through the host.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from gpufleet.facts.catalog import Fact
from gpufleet.facts.gather import FactRequest, Facts
from gpufleet.provision.managed import HEADER, file_change
from gpufleet.provision.plan import Change, Run
from gpufleet.provision.role import PlanContext, RoleBase, RoleVars, Var

MODULES_LOAD = "/etc/modules-load.d/gpufleet-nvidia-peermem.conf"
LOADED = Fact("nvidia_peermem", "[ -d /sys/module/nvidia_peermem ] && echo loaded || echo absent",
              lambda text: text.strip() == "loaded")


class PeermemRole(RoleBase):
    name = "peermem"
    order = 55
    variables: ClassVar[Mapping[str, Var]] = {
        "gpudirect_rdma": Var(None, "boolean", "load nvidia-peermem (GPUDirect RDMA)"),
    }

    def active(self, v: RoleVars) -> bool:
        return v.get("gpudirect_rdma") is not None and v.boolean("gpudirect_rdma")

    def managed_files(self, v: RoleVars) -> dict[str, str]:
        return {"modules-load file": MODULES_LOAD}

    def request(self, v: RoleVars) -> FactRequest:
        return FactRequest(files=frozenset({MODULES_LOAD}), custom=frozenset({LOADED}))

    def plan(self, facts: Facts, v: RoleVars, ctx: PlanContext) -> list[Change]:
        content = f"# {HEADER.format(role=self.name)}\nnvidia-peermem\n"
        changes = [c for c in [file_change(self.name, facts, MODULES_LOAD, content)] if c]
        if not facts.require("nvidia_peermem"):
            changes.append(Change(self.name, "module nvidia_peermem", "load", "not loaded",
                                  "loaded", [Run("modprobe nvidia-peermem",
                                                 "modprobe nvidia-peermem")]))
        return changes


ROLE = PeermemRole()
