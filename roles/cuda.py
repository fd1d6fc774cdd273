"""CUDA toolkit at an exact version, held and pinned, with /usr/local/cuda pointing at it."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any, ClassVar

from gpufleet import apt
from gpufleet.facts import FactRequest, Facts
from gpufleet.managed import link_change
from gpufleet.plan import Change, Run
from gpufleet.role import PlanContext, RoleVars, VarError

ALTERNATIVES_LINK = "/etc/alternatives/cuda"


def major_minor(version: str, host: str, key: str) -> tuple[str, str]:
    """("12", "4") from "12.4.1"; VarError otherwise."""
    parts = version.split(".")
    if len(parts) < 2 or not parts[0].isdigit() or not parts[1].isdigit():
        raise VarError(f"host {host}: {key} must look like 12.4.1, got {version!r}")
    return parts[0], parts[1]


class CudaRole:
    name = "cuda"
    defaults: ClassVar[Mapping[str, Any]] = {
        "cuda_version": None,
        "cuda_package": "cuda-toolkit-{major}-{minor}",
        "cuda_package_version": "{version}-1",
        "cuda_home": "/usr/local/cuda-{major}.{minor}",
        "cuda_link": "/usr/local/cuda",
    }

    def active(self, v: RoleVars) -> bool:
        return "cuda_version" in v

    def _fields(self, v: RoleVars) -> dict[str, str]:
        version = v.string("cuda_version")
        major, minor = major_minor(version, v.host.name, "cuda_version")
        return {"version": version, "major": major, "minor": minor}

    def wanted(self, v: RoleVars) -> dict[str, str]:
        f = self._fields(v)
        return {v.string("cuda_package").format(**f): v.string("cuda_package_version").format(**f)}

    def request(self, v: RoleVars) -> FactRequest:
        return FactRequest(packages=frozenset(self.wanted(v)),
                           files=frozenset({apt.pin_path(self.name)}),
                           links=frozenset({v.string("cuda_link"), ALTERNATIVES_LINK}))

    def plan(self, facts: Facts, v: RoleVars, ctx: PlanContext) -> list[Change]:
        changes = apt.pinned_packages(self.name, facts, self.wanted(v))
        home = v.string("cuda_home").format(**self._fields(v))
        link = v.string("cuda_link")
        if facts.link(link) == ALTERNATIVES_LINK:
            current = facts.link(ALTERNATIVES_LINK)
            if current != home:
                changes.append(Change(
                    self.name, f"alternative cuda ({link})", "set", current or "absent", home,
                    [Run(f"update-alternatives --set cuda {shlex.quote(home)}",
                         f"update-alternatives --set cuda {home}")]))
            return changes
        change = link_change(self.name, facts, link, home)
        return changes + ([change] if change else [])


ROLE = CudaRole()
