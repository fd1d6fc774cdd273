"""Persistence mode on every GPU, through nvidia-persistenced where systemd runs it, else
``nvidia-smi -pm 1``: without it the driver tears the GPUs down between jobs, and the first
CUDA call of every job pays for bringing them up again."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from gpufleet.facts.catalog import SYSTEMD
from gpufleet.facts.gather import FactRequest, Facts
from gpufleet.provision.plan import Change, Fail, Run
from gpufleet.provision.role import PlanContext, RoleBase, RoleVars, Var


class PersistencedRole(RoleBase):
    name = "persistenced"
    order = 27
    variables: ClassVar[Mapping[str, Var]] = {
        "nvidia_persistence_mode": Var(None, "boolean", "persistence mode on every GPU"),
    }

    def active(self, v: RoleVars) -> bool:
        return v.get("nvidia_persistence_mode") is not None and \
            v.boolean("nvidia_persistence_mode")

    def request(self, v: RoleVars) -> FactRequest:
        return FactRequest(custom=frozenset({SYSTEMD}))

    def plan(self, facts: Facts, v: RoleVars, ctx: PlanContext) -> list[Change]:
        gpus = facts.get("gpus")
        if gpus is None:
            reason = facts.why_absent("gpus")
            return [Change(self.name, "persistence mode", "verify", f"unknown ({reason})",
                           "Enabled on every GPU",
                           [Fail(f"persistence mode cannot be read: {reason}")])]
        off = [f"GPU{g.get('index')}" for g in gpus if g.get("persistence_mode") is not True]
        if not off:
            return []
        step = Run("systemctl enable --now nvidia-persistenced",
                   "systemctl enable --now nvidia-persistenced") if facts.get("systemd") \
            else Run("nvidia-smi -pm 1", "nvidia-smi -pm 1")
        return [Change(self.name, "persistence mode", "enable", f"off on {', '.join(off)}",
                       "Enabled on every GPU", [step])]


ROLE = PersistencedRole()
