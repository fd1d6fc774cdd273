"""NCCL (libnccl2 and libnccl-dev) at ``<nccl>-1+cuda<X.Y>``, held and pinned.

Upgrades and downgrades both converge; only these packages are unheld for the
transaction and held again after it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from gpufleet.errors import VarError
from gpufleet.facts.gather import FactRequest, Facts
from gpufleet.provision import apt
from gpufleet.provision.plan import Change
from gpufleet.provision.role import PlanContext, RoleBase, RoleVars, Var
from gpufleet.provision.standins import Standin
from gpufleet.roles.cuda import major_minor

SYSTEM_NCCL = "libnccl2"


class NcclRole(RoleBase):
    name = "nccl"
    order = 40
    variables: ClassVar[Mapping[str, Var]] = {
        "nccl_version": Var(None, "string", "NCCL version, e.g. 2.28.3"),
        "nccl_cuda": Var(None, "string", "the CUDA major.minor of the package (default from "
                                         "cuda_version)"),
        "nccl_package_version": Var("{version}-1+cuda{cuda}", "string",
                                    "package version template"),
        "nccl_packages": Var(["libnccl2", "libnccl-dev"], "list", "packages to pin"),
    }
    shared_keys = ("nccl",)

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
        return apt.templated(v, v.items("nccl_packages"), "nccl_package_version",
                             {"version": version, "cuda": cuda}, "nccl_packages")

    def managed_files(self, v: RoleVars) -> dict[str, str]:
        return {"apt pin": apt.pin_path(self.name)}

    def request(self, v: RoleVars) -> FactRequest:
        return FactRequest(packages=frozenset(self.wanted(v)),
                           files=frozenset({apt.pin_path(self.name)}))

    def plan(self, facts: Facts, v: RoleVars, ctx: PlanContext) -> list[Change]:
        return apt.pinned_packages(self.name, facts, self.wanted(v))

    def shared_request(self, v: RoleVars) -> FactRequest:
        return FactRequest(packages=frozenset({SYSTEM_NCCL}))

    def shared(self, facts: Facts, v: RoleVars) -> dict[str, str | None]:
        record = (facts.get("packages") or {}).get(SYSTEM_NCCL) or {}
        return {"nccl": record.get("version") if record.get("installed") else None}

    def standins(self) -> list[Standin]:
        return [pkg for version in ("2.21.5-1+cuda12.4", "2.23.4-1+cuda12.6",
                                    "2.28.3-1+cuda13.0")
                for pkg in _nccl_standins(version)]


def _nccl_standins(version: str) -> list[Standin]:
    major, minor, patch = version.split("-", maxsplit=1)[0].split(".")
    header = (f"#define NCCL_MAJOR {major}\n#define NCCL_MINOR {minor}\n"
              f"#define NCCL_PATCH {patch}\n#define NCCL_SUFFIX \"\"\n")
    return [
        Standin(SYSTEM_NCCL, version, "NVIDIA Collective Communication Library (NCCL) Runtime",
                files={f"/usr/share/doc/{SYSTEM_NCCL}/gpufleet-lab-nccl-version": version + "\n"}),
        Standin("libnccl-dev", version,
                "NVIDIA Collective Communication Library (NCCL) Development Files",
                files={"/usr/include/nccl.h": header}, depends=f"libnccl2 (= {version})"),
    ]


ROLE = NcclRole()
