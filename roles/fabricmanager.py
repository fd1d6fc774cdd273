"""NVIDIA Fabric Manager on NVSwitch systems (HGX H100/H200/B200): the package at exactly the
driver's version, held and pinned, and its service enabled and running.

Without fabricmanager at the driver's version CUDA does not initialise on an NVSwitch
system, and a fabricmanager of another version refuses to start; ``nvidia-smi -q`` then
shows a Fabric state other than Completed / Success. ``nvidia_fabricmanager: auto`` (the
default) turns the role on where NVSwitches are on the PCI bus.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from gpufleet.facts.catalog import NO_SYSTEMD, Fact
from gpufleet.facts.gather import FactRequest, Facts
from gpufleet.facts.parsers import packages
from gpufleet.provision import apt
from gpufleet.provision.plan import Change, Fail, Run
from gpufleet.provision.role import PlanContext, RoleBase, RoleVars, Var
from gpufleet.provision.standins import Standin

SERVICE = "nvidia-fabricmanager"
NVSWITCHES = Fact(
    "nvswitches",
    "n=0; for d in /sys/bus/pci/devices/*; do "
    "[ \"$(cat \"$d/vendor\" 2>/dev/null)\" = 0x10de ] || continue; "
    "case \"$(cat \"$d/class\" 2>/dev/null)\" in 0x0680*) n=$((n+1));; esac; done; echo $n",
    lambda text: int(text.strip()))
FM_VERSION = Fact(
    "fabricmanager",
    "dpkg-query -W -f='${db:Status-Abbrev} ${Version}\\n' 'nvidia-fabricmanager-*' "
    "2>/dev/null | awk 'substr($1, 2, 1) == \"i\" {print $2}' | head -n1",
    lambda text: packages.nvidia_version_from_package(text) if text.strip() else None)
SERVICE_STATE = Fact(
    "fabricmanager_service",
    f"{NO_SYSTEMD}echo \"$(systemctl is-enabled {SERVICE} 2>&1) "
    f"$(systemctl is-active {SERVICE} 2>&1)\"",
    lambda text: dict(zip(("enabled", "active"), text.split()[:2], strict=False)), "systemctl")


class FabricmanagerRole(RoleBase):
    name = "fabricmanager"
    order = 25
    variables: ClassVar[Mapping[str, Var]] = {
        "nvidia_fabricmanager": Var("auto", "any", "true, false, or auto (NVSwitches "
                                                    "present)"),
        "nvidia_fabricmanager_package": Var("nvidia-fabricmanager-{branch}", "string",
                                            "the package"),
        "nvidia_fabricmanager_package_version": Var("{version}-*", "string",
                                                    "its version (the driver's)"),
        "nvidia_fabricmanager_service": Var(True, "boolean", "enable and start the service"),
        "nvidia_driver_version": Var(None, "string", "the driver fabricmanager must match"),
    }
    shared_keys = ("fabricmanager",)

    def active(self, v: RoleVars) -> bool:
        """On when asked; with auto, on GPU nodes (a pinned driver), where the plan then
        looks for NVSwitches."""
        if str(v.get("nvidia_fabricmanager")).lower() == "auto":
            return "nvidia_driver_version" in v
        return v.boolean("nvidia_fabricmanager")

    def check(self, v: RoleVars) -> None:
        super().check(v)
        if str(v.get("nvidia_fabricmanager")).lower() != "auto":
            v.boolean("nvidia_fabricmanager")
        if self._explicit(v) and "nvidia_driver_version" not in v:
            raise v.fail("nvidia_driver_version", "set when nvidia_fabricmanager is on (the "
                         "package must be the driver's version)", None)

    def _explicit(self, v: RoleVars) -> bool:
        return str(v.get("nvidia_fabricmanager")).lower() != "auto" and \
            v.boolean("nvidia_fabricmanager")

    def wanted(self, v: RoleVars) -> dict[str, str]:
        version = v.string("nvidia_driver_version")
        return apt.templated(v, [v.string("nvidia_fabricmanager_package")],
                             "nvidia_fabricmanager_package_version",
                             {"version": version, "branch": version.split(".")[0]},
                             "nvidia_fabricmanager_package")

    def managed_files(self, v: RoleVars) -> dict[str, str]:
        return {"apt pin": apt.pin_path(self.name)}

    def request(self, v: RoleVars) -> FactRequest:
        custom = {NVSWITCHES, SERVICE_STATE}
        if "nvidia_driver_version" not in v:
            return FactRequest(custom=frozenset(custom))
        return FactRequest(packages=frozenset(self.wanted(v)),
                           files=frozenset({apt.pin_path(self.name)}),
                           custom=frozenset(custom))

    def plan(self, facts: Facts, v: RoleVars, ctx: PlanContext) -> list[Change]:
        if not self._explicit(v) and not facts.get("nvswitches"):
            return []  # auto, and no NVSwitch on this host
        if "nvidia_driver_version" not in v:
            return [Change(self.name, f"package {SERVICE}", "verify", "unknown",
                           "the driver's version",
                           [Fail("fabricmanager must be the driver's version: set "
                                 "nvidia_driver_version")])]
        changes = apt.pinned_packages(self.name, facts, self.wanted(v))
        if v.boolean("nvidia_fabricmanager_service"):
            changes += self._service(facts)
        return changes

    def _service(self, facts: Facts) -> list[Change]:
        state = facts.get("fabricmanager_service")
        if state is None:
            reason = facts.why_absent("fabricmanager_service")
            return [Change(self.name, f"service {SERVICE}", "start", f"unknown ({reason})",
                           "enabled active",
                           [Fail(f"cannot manage {SERVICE} here ({reason}); start "
                                 "nv-fabricmanager another way or set "
                                 "nvidia_fabricmanager_service: false")])]
        now = f"{state.get('enabled')} {state.get('active')}"
        if now == "enabled active":
            return []
        return [Change(self.name, f"service {SERVICE}", "start", now, "enabled active",
                       [Run(f"systemctl enable --now {SERVICE}",
                            f"systemctl enable --now {SERVICE}")])]

    def shared_request(self, v: RoleVars) -> FactRequest:
        return FactRequest(custom=frozenset({FM_VERSION}))

    def shared(self, facts: Facts, v: RoleVars) -> dict[str, str | None]:
        return {"fabricmanager": facts.get("fabricmanager")}

    def standins(self) -> list[Standin]:
        return [fabricmanager_standin(v) for v in
                ("550.127.05-1", "550.144.03-1", "580.95.05-1", "580.105.08-1")]


def fabricmanager_standin(version: str) -> Standin:
    """nvidia-fabricmanager-<branch> depending on the driver of exactly its version (the
    shape of Ubuntu's nvidia-fabricmanager-580, which depends on
    nvidia-kernel-common-580-server-<version>)."""
    upstream = packages.nvidia_version_from_package(version)
    branch = upstream.split(".")[0]
    return Standin(f"nvidia-fabricmanager-{branch}", version,
                   f"Fabric Manager {upstream} for NVSwitch based systems",
                   files={f"/usr/share/doc/nvidia-fabricmanager-{branch}/version":
                          upstream + "\n"},
                   depends=f"nvidia-kernel-common-{branch}-{upstream}")


ROLE = FabricmanagerRole()
