"""NCCL (libnccl2 and libnccl-dev) at ``<nccl>-1+cuda<X.Y>``, held and pinned.

Upgrades and downgrades both converge; only these packages are unheld for the
transaction and held again after it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from gpufleet import apt
from gpufleet.facts import FactRequest, Facts
from gpufleet.plan import Change
from gpufleet.role import PlanContext, RoleVars, VarError
from roles.cuda import major_minor


class NcclRole:
    name = "nccl"
    defaults: ClassVar[Mapping[str, Any]] = {
        "nccl_version": None,
        "nccl_cuda": None,
        "nccl_package_version": "{version}-1+cuda{cuda}",
        "nccl_packages": ["libnccl2", "libnccl-dev"],
    }

    def active(self, v: RoleVars) -> bool:
        return "nccl_version" in v

    def wanted(self, v: RoleVars) -> dict[str, str]:
        version = v.string("nccl_version")
        cuda = v.opt_string("nccl_cuda")
        if cuda is None:
            if "cuda_version" not in v:
                raise VarError(f"host {v.host.name}: set nccl_cuda (e.g. 12.4) or cuda_version "
                               "to build the NCCL package version")
            cuda = ".".join(major_minor(v.string("cuda_version"), v.host.name, "cuda_version"))
        package_version = v.string("nccl_package_version").format(version=version, cuda=cuda)
        return {str(name): package_version for name in v.items("nccl_packages")}

    def request(self, v: RoleVars) -> FactRequest:
        return FactRequest(packages=frozenset(self.wanted(v)),
                           files=frozenset({apt.pin_path(self.name)}))

    def plan(self, facts: Facts, v: RoleVars, ctx: PlanContext) -> list[Change]:
        return apt.pinned_packages(self.name, facts, self.wanted(v))


ROLE = NcclRole()
