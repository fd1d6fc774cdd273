"""NVIDIA DCGM (Data Center GPU Manager) 4 at a pinned version: ``datacenter-gpu-manager-4-
core`` and the package for the node's CUDA major (``datacenter-gpu-manager-4-cuda13``),
held and pinned. The gpu suite runs ``dcgmi diag`` where DCGM is installed."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import ClassVar

from gpufleet.errors import VarError
from gpufleet.facts.gather import FactRequest, Facts
from gpufleet.provision import apt
from gpufleet.provision.plan import Change
from gpufleet.provision.role import PlanContext, RoleBase, RoleVars, Var
from gpufleet.provision.standins import Standin
from gpufleet.roles.cuda import major_minor


class DcgmRole(RoleBase):
    name = "dcgm"
    order = 45
    variables: ClassVar[Mapping[str, Var]] = {
        "dcgm_version": Var(None, "string", "DCGM version, e.g. 4.4.1"),
        "dcgm_cuda": Var(None, "string", "the CUDA major of its package (default from "
                                         "cuda_version)"),
        "dcgm_packages": Var(["datacenter-gpu-manager-4-core",
                              "datacenter-gpu-manager-4-cuda{cuda}"], "list", "packages"),
        "dcgm_package_version": Var("1:{version}-*", "string", "their version"),
        "cuda_version": Var(None, "string", "the CUDA release"),
    }

    def active(self, v: RoleVars) -> bool:
        return "dcgm_version" in v

    def wanted(self, v: RoleVars) -> dict[str, str]:
        release = v.opt_string("cuda_version")
        major = major_minor(release, v.host.name, "cuda_version")[0] if release else ""
        cuda = v.opt_string("dcgm_cuda") or major
        if not (cuda.isascii() and cuda.isdigit()):
            raise VarError(f"host {v.host.name}: set dcgm_cuda (e.g. 13) or cuda_version to "
                           "choose DCGM's CUDA package")
        return apt.templated(v, v.items("dcgm_packages"), "dcgm_package_version",
                             {"version": v.string("dcgm_version"), "cuda": cuda},
                             "dcgm_packages")

    def managed_files(self, v: RoleVars) -> dict[str, str]:
        return {"apt pin": apt.pin_path(self.name)}

    def request(self, v: RoleVars) -> FactRequest:
        return FactRequest(packages=frozenset(self.wanted(v)),
                           files=frozenset({apt.pin_path(self.name)}))

    def plan(self, facts: Facts, v: RoleVars, ctx: PlanContext) -> list[Change]:
        return apt.pinned_packages(self.name, facts, self.wanted(v))

    def standins(self) -> list[Standin]:
        return dcgm_standins("1:4.4.1-1")


def diag_document(gpus: int = 2) -> str:
    """What a healthy node's ``dcgmi diag -r 1 -j`` prints (DCGM's documented layout)."""
    ids = ",".join(str(i) for i in range(gpus))
    software = ["Denylist", "NVML Library", "CUDA Main Library", "Permissions and OS Blocks",
                "Persistence Mode", "Environmental Variables", "Page Retirement/Row Remap",
                "Graphics Processes", "Inforom"]
    return json.dumps({"DCGM GPU Diagnostic": {"version": "4.4.1", "test_categories": [
        {"category": "Deployment", "tests": [
            {"name": name, "results": [{"gpu_ids": ids, "status": "Pass"}]}
            for name in software]}]}}, indent=2) + "\n"


def dcgm_standins(version: str) -> list[Standin]:
    """DCGM's packages; ``dcgmi diag -j`` prints the lab's result file (a healthy run unless
    a test writes a failing one to /etc/gpufleet-lab/dcgm-diag.json)."""
    dcgmi = ("#!/bin/sh\n"
             "[ \"$1\" = diag ] || { echo 'lab dcgmi: only diag is replayed' >&2; exit 2; }\n"
             "f=/etc/gpufleet-lab/dcgm-diag.json\n"
             "[ -f \"$f\" ] || f=/usr/share/gpufleet-lab/dcgm-diag.json\n"
             "cat \"$f\"\n"
             "grep -q '\"Fail\"' \"$f\" && exit 226 || exit 0\n")
    core = "datacenter-gpu-manager-4-core"
    return [
        Standin(core, version, "NVIDIA DCGM 4 core",
                files={"/usr/bin/dcgmi": dcgmi,
                       "/usr/share/gpufleet-lab/dcgm-diag.json": diag_document()},
                executables=frozenset({"/usr/bin/dcgmi"})),
        *(Standin(f"datacenter-gpu-manager-4-cuda{major}", version,
                  f"NVIDIA DCGM 4 for CUDA {major}", depends=f"{core} (= {version})")
          for major in ("12", "13")),
    ]


ROLE = DcgmRole()
