"""NVIDIA driver at an exact version: installed, held, pinned, kept from unattended-upgrades.

A loaded kernel module that differs from the installed package means the host
needs a reboot; that is reported as such and applied only with ``--reboot``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from gpufleet import apt, parsers
from gpufleet.facts import FactRequest, Facts
from gpufleet.managed import HEADER, file_change, render
from gpufleet.plan import Change
from gpufleet.reboot import Reboot
from gpufleet.role import PlanContext, RoleVars, VarError

UNATTENDED_PATH = "/etc/apt/apt.conf.d/51gpufleet-unattended-upgrades"


class DriverRole:
    name = "driver"
    defaults: ClassVar[Mapping[str, Any]] = {
        "nvidia_driver_version": None,
        "nvidia_driver_package": "nvidia-driver-{branch}",
        "nvidia_driver_package_version": "{version}-0ubuntu1",
        "nvidia_driver_protect_from_unattended_upgrades": True,
        "nvidia_driver_unattended_blacklist": ["nvidia-", "libnvidia-", "cuda-", "libnccl"],
        "nvidia_driver_reboot_command": "reboot",
    }

    def active(self, v: RoleVars) -> bool:
        return "nvidia_driver_version" in v

    def wanted(self, v: RoleVars) -> dict[str, str]:
        version = v.string("nvidia_driver_version")
        parts = version.split(".")
        if len(parts) < 2 or not all(p.isdigit() for p in parts):
            raise VarError(f"host {v.host.name}: nvidia_driver_version must look like "
                           f"550.127.05, got {version!r}")
        fields = {"version": version, "branch": parts[0]}
        package = v.string("nvidia_driver_package").format(**fields)
        return {package: v.string("nvidia_driver_package_version").format(**fields)}

    def request(self, v: RoleVars) -> FactRequest:
        return FactRequest(packages=frozenset(self.wanted(v)),
                           files=frozenset({apt.pin_path(self.name), UNATTENDED_PATH}))

    def plan(self, facts: Facts, v: RoleVars, ctx: PlanContext) -> list[Change]:
        wanted = self.wanted(v)
        changes = apt.pinned_packages(self.name, facts, wanted)
        if v.boolean("nvidia_driver_protect_from_unattended_upgrades"):
            content = render("unattended-upgrades.conf.j2",
                             header=HEADER.format(role=self.name),
                             patterns=v.items("nvidia_driver_unattended_blacklist"))
            change = file_change(self.name, facts, UNATTENDED_PATH, content)
            changes += [change] if change else []
        target = parsers.nvidia_version_from_package(next(iter(wanted.values())))
        loaded = facts.get("nvidia_module")
        if loaded != target:
            before = loaded or f"not loaded ({facts.why_absent('nvidia_module')})"
            reason = f"loaded kernel module {loaded or 'none'}, driver package {target}"
            changes.append(Change(self.name, "kernel module nvidia", "reboot", before, target,
                                  [Reboot(v.string("nvidia_driver_reboot_command"), reason)],
                                  pending_reboot=True))
        return changes


ROLE = DriverRole()
