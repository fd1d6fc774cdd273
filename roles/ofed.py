"""OFED / DOCA-OFED (NVIDIA's RDMA stack for ConnectX NICs) at the pinned version: the
installed stack's ``ofed_info -s`` compared with the inventory, and, where the inventory
names its package (``doca-ofed``, ``mlnx-ofed-all``), that package pinned and held."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import ClassVar

from gpufleet.facts.catalog import Fact
from gpufleet.facts.gather import FactRequest, Facts
from gpufleet.facts.parsers import packages
from gpufleet.provision import apt
from gpufleet.provision.plan import Change, Fail
from gpufleet.provision.role import PlanContext, RoleBase, RoleVars, Var

_VERSION = re.compile(r"[0-9][0-9A-Za-z.-]*\Z")
OFED_INFO = Fact("ofed", "command -v ofed_info >/dev/null 2>&1 || { echo 'ofed_info not found "
                 "(no OFED / DOCA-OFED on this host)'; exit 127; }; ofed_info -s",
                 packages.ofed_version, "ofed_info")


class OfedRole(RoleBase):
    name = "ofed"
    order = 50
    variables: ClassVar[Mapping[str, Var]] = {
        "ofed_version": Var(None, "string", "the version ofed_info -s reports, "
                                            "e.g. 24.10-1.1.4.0"),
        "ofed_package": Var(None, "string", "its package (doca-ofed ...), pinned and held"),
        "ofed_package_version": Var("{version}-*", "string", "the package's version"),
    }
    shared_keys = ("ofed",)

    def active(self, v: RoleVars) -> bool:
        return "ofed_version" in v

    def check(self, v: RoleVars) -> None:
        super().check(v)
        if not self.active(v):
            return
        if not _VERSION.match(v.string("ofed_version")):
            raise v.fail("ofed_version", "a version as ofed_info -s reports it (24.10-1.1.4.0)",
                         v.get("ofed_version"))
        self.wanted(v)

    def wanted(self, v: RoleVars) -> dict[str, str]:
        package = v.opt_string("ofed_package")
        if package is None:
            return {}
        return apt.templated(v, [package], "ofed_package_version",
                             {"version": v.string("ofed_version")}, "ofed_package")

    def managed_files(self, v: RoleVars) -> dict[str, str]:
        return {"apt pin": apt.pin_path(self.name)}

    def request(self, v: RoleVars) -> FactRequest:
        wanted = self.wanted(v)
        files = frozenset({apt.pin_path(self.name)}) if wanted else frozenset()
        return FactRequest(packages=frozenset(wanted), files=files,
                           custom=frozenset({OFED_INFO}))

    def plan(self, facts: Facts, v: RoleVars, ctx: PlanContext) -> list[Change]:
        wanted = self.wanted(v)
        changes = apt.pinned_packages(self.name, facts, wanted) if wanted else []
        found, want = facts.get("ofed"), v.string("ofed_version")
        if not changes and found != want:
            before = found or f"unknown ({facts.why_absent('ofed')})"
            changes.append(Change(self.name, "ofed_info", "verify", before, want,
                                  [Fail(f"ofed_info -s reports {before}, the inventory wants "
                                        f"{want}: install DOCA-OFED {want} (or set "
                                        "ofed_package to let gpufleet pin it)")], kind="ofed"))
        return changes

    def shared_request(self, v: RoleVars) -> FactRequest:
        return FactRequest(custom=frozenset({OFED_INFO}))

    def shared(self, facts: Facts, v: RoleVars) -> dict[str, str | None]:
        return {"ofed": facts.get("ofed")}


ROLE = OfedRole()
