"""The kernel a node runs and boots next, and the out-of-tree modules it needs built for it.

A kernel taken by a routine upgrade leaves a node without its GPU driver at the next reboot
when DKMS could not build the NVIDIA, peer-memory or OFED modules for it (its headers
missing, the build failing). The role pins the release a group runs (``kernel_version``,
the ``uname -r`` string): its image and headers packages installed, held and pinned, and
kept from unattended-upgrades. It reports the kernel the next boot runs when it is not the
running one (the newest /boot/vmlinuz-*, the one GRUB's default entry boots on Debian and
Ubuntu), and every module gpufleet manages that is not built for the kernel the node keeps
(modinfo's vermagic through that kernel's module index). Building a missing module is
``dkms autoinstall -k K`` where DKMS can (headers installed, or about to be); running the
pinned kernel is a reboot, taken only with ``--reboot``, as the driver's is.
"""

from __future__ import annotations

import functools
import re
import shlex
from collections.abc import Mapping
from typing import Any, ClassVar

from gpufleet.errors import VarError
from gpufleet.facts.catalog import Fact, needs
from gpufleet.facts.formats import kernel_state
from gpufleet.facts.gather import FactRequest, Facts
from gpufleet.facts.parsers.kernel import vermagic_release
from gpufleet.provision import apt, debversion
from gpufleet.provision.managed import HEADER, file_change, render
from gpufleet.provision.plan import Change, Fail, Run, Step
from gpufleet.provision.reboot import Reboot
from gpufleet.provision.role import PlanContext, RoleBase, RoleVars, Var
from gpufleet.provision.standins import Standin
from gpufleet.roles import driver, ofed, peermem

UNATTENDED_PATH = "/etc/apt/apt.conf.d/51gpufleet-kernel-unattended-upgrades"
DRIVER_MODULES = ("nvidia", "nvidia-uvm")
PEERMEM_MODULES = ("nvidia-peermem",)
OFED_MODULES = ("mlx5_core", "mlx5_ib", "ib_core")
"""OFED's (DOCA-OFED's) builds of modules the kernel also ships: the kernel's own build
(under /lib/modules/K/kernel/) loading instead means OFED is not built for K."""
_RELEASE = re.compile(r"^[0-9][A-Za-z0-9._+~-]*\Z")
_MODULE = re.compile(r"^[A-Za-z0-9_-]+\Z")
_PREFIX = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.+_*-]*\Z")


@functools.cache
def kernel_state_fact(modules: tuple[str, ...]) -> Fact:
    """The running kernel, the installed ones (/boot/vmlinuz-*, a RHEL rescue image left
    out), those with headers, and modinfo of each module for each of them; whether dkms is
    installed, and ``dkms status`` when a module is missing."""
    names = " ".join(shlex.quote(m) for m in modules)
    return Fact("kernel_state", needs("modinfo", "modinfo not found (kmod)") + "\n".join([
        'r=$(uname -r); echo "@running $r"',
        'for f in /boot/vmlinuz-*; do case $f in *-rescue-*) continue;; esac; '
        '[ -e "$f" ] && echo "@boot ${f#/boot/vmlinuz-}"; done',
        'for d in /lib/modules/*; do [ -e "$d/build" ] && echo "@headers ${d##*/}"; done',
        "mods() {",
        f'  for m in {names}; do echo "@module $1 $m"; modinfo -k "$1" "$m" 2>&1 || '
        "echo @missing; done",
        "}",
        'out=$(mods "$r"; for f in /boot/vmlinuz-*; do k=${f#/boot/vmlinuz-}; '
        'case $k in *-rescue-*) continue;; esac; '
        '[ -e "$f" ] && [ "$k" != "$r" ] && mods "$k"; done)',
        "printf '%s\\n' \"$out\" | "
        "grep -E '^(@module |filename:|version:|vermagic:|name:|modinfo:)'",
        "if command -v dkms >/dev/null 2>&1; then echo @dkms; "
        'case "$out" in *@missing*) dkms status 2>&1;; esac; fi',
        "exit 0",
    ]), kernel_state, "dkms")


def newest(releases: set[str]) -> str | None:
    """The release GRUB's default entry boots among installed ones: the highest version."""
    found = sorted(releases, key=functools.cmp_to_key(debversion.compare))
    return found[-1] if found else None


def module_problem(fields: dict[str, Any] | None, module: str, release: str) -> str | None:
    """Why ``module`` is not built for ``release`` (None when it is): not found in that
    kernel's module index, built for another kernel, or (for OFED's modules) only the
    kernel's own build."""
    if fields is None:
        return "not built (the kernel is not installed yet)"
    if "error" in fields:
        return f"not built ({fields['error']})"
    if not fields.get("vermagic"):
        return f"no vermagic ({fields.get('filename')})"
    built = vermagic_release(str(fields["vermagic"]))
    if built != release:
        return f"built for {built} ({fields.get('filename')})"
    if module in OFED_MODULES and f"/lib/modules/{release}/kernel/" in str(
            fields.get("filename", "")):
        return f"only the kernel's own ({fields.get('filename')}): OFED's is not built for it"
    return None


class KernelRole(RoleBase):
    name = "kernel"
    order = 15
    variables: ClassVar[Mapping[str, Var]] = {
        "kernel_version": Var(None, "string", "the kernel release the node runs (uname -r), "
                                              "e.g. 6.8.0-45-generic: pinned and held"),
        "kernel_packages": Var(["linux-image-{version}", "linux-headers-{version}"], "list",
                               "packages of that release (or its meta packages)"),
        "kernel_package_version": Var("*", "string", "their version (any: the release is in "
                                                     "their names)"),
        "kernel_check": Var(False, "boolean", "check the next boot's kernel and the modules "
                                              "without pinning a release"),
        "kernel_modules": Var(None, "list", "out-of-tree modules that must be built for the "
                                            "kernel (default: the roles'; [] for none)"),
        "kernel_protect_from_unattended_upgrades": Var(True, "boolean",
                                                       "write the blacklist"),
        "kernel_unattended_blacklist": Var(
            ["linux-image-", "linux-headers-", "linux-modules-"], "list",
            "Unattended-Upgrade::Package-Blacklist entries"),
        "kernel_reboot_command": Var("reboot", "string", "command that reboots"),
        "nvidia_driver_version": driver.ROLE.variables["nvidia_driver_version"],
        "nvidia_driver_install": driver.ROLE.variables["nvidia_driver_install"],
        "gpudirect_rdma": peermem.ROLE.variables["gpudirect_rdma"],
        "ofed_version": ofed.ROLE.variables["ofed_version"],
    }

    def active(self, v: RoleVars) -> bool:
        return "kernel_version" in v or v.boolean("kernel_check")

    def check(self, v: RoleVars) -> None:
        super().check(v)
        if not self.active(v):
            return
        self.wanted(v)
        self.modules(v)
        self._blacklist(v)
        command = v.string("kernel_reboot_command")
        if not command.strip() or any(c in command for c in "\n\r\0"):
            raise v.fail("kernel_reboot_command", "a command on one line", command)

    def release(self, v: RoleVars) -> str | None:
        """``kernel_version``, checked (it names packages and reaches commands)."""
        release = v.opt_string("kernel_version")
        if release is not None and not _RELEASE.match(release):
            raise v.fail("kernel_version", "a kernel release as uname -r prints it "
                         "(6.8.0-45-generic)", release)
        return release

    def wanted(self, v: RoleVars) -> dict[str, str]:
        """Package -> version pattern of the pinned release; empty without a pin."""
        release = self.release(v)
        if release is None:
            return {}
        return apt.templated(v, v.items("kernel_packages"), "kernel_package_version",
                             {"version": release}, "kernel_packages")

    def modules(self, v: RoleVars) -> tuple[str, ...]:
        """The modules that must be built for the kernel: ``kernel_modules``, else those of
        the roles the host has (the driver's unless the GPU Operator runs it, peer memory
        with GPUDirect RDMA unless its route is dma-buf, OFED's)."""
        if v.get("kernel_modules") is not None:
            names = [str(m) for m in v.items("kernel_modules")]
            bad = [m for m in names if not _MODULE.match(m)]
            if bad:
                raise v.fail("kernel_modules", "a list of module names", bad[0])
            return tuple(names)
        found: list[str] = []
        if "nvidia_driver_version" in v:
            driver.driver_version(v)
            if driver.ROLE.install(v) != "operator":  # the operator's container has them
                found += DRIVER_MODULES
        if v.get("gpudirect_rdma") is not None and v.boolean("gpudirect_rdma") \
                and peermem.route_choice(v) != "dmabuf":
            found += PEERMEM_MODULES
        if "ofed_version" in v:
            if not _RELEASE.match(v.string("ofed_version")):
                raise v.fail("ofed_version", "a version as ofed_info -s reports it "
                             "(24.10-1.1.4.0)", v.get("ofed_version"))
            found += OFED_MODULES
        return tuple(found)

    def _blacklist(self, v: RoleVars) -> list[str]:
        entries = [str(e) for e in v.items("kernel_unattended_blacklist")]
        bad = [e for e in entries if not _PREFIX.match(e)]
        if bad:
            raise VarError(f"host {v.host.name}: kernel_unattended_blacklist entry "
                           f"{bad[0]!r} is not a package name prefix")
        return entries

    def _protects(self, v: RoleVars) -> bool:
        return bool(self.wanted(v)) and v.boolean("kernel_protect_from_unattended_upgrades")

    def managed_files(self, v: RoleVars) -> dict[str, str]:
        files = {"apt pin": apt.pin_path(self.name)} if self.wanted(v) else {}
        if self._protects(v):
            files["unattended-upgrades blacklist"] = UNATTENDED_PATH
        return files

    def request(self, v: RoleVars) -> FactRequest:
        return FactRequest(packages=frozenset(self.wanted(v)),
                           files=frozenset(self.managed_files(v).values()),
                           custom=frozenset({kernel_state_fact(self.modules(v))}))

    def plan(self, facts: Facts, v: RoleVars, ctx: PlanContext) -> list[Change]:
        state = facts.require("kernel_state")
        running: str = state["running"]
        pinned, wanted = self.release(v), self.wanted(v)
        booted, headers = set(state["boot"]), set(state["headers"])
        changes: list[Change] = []
        if pinned is not None:
            packages = apt.pinned_packages(self.name, facts, wanted)
            if any(c.resource.startswith("package ") for c in packages):
                booted.add(pinned)  # the transaction installs it, with its headers
                headers.add(pinned)
            changes += packages + self._blacklist_change(facts, v)
        following = newest(booted)
        blocked = pinned is not None and following is not None and following != pinned
        if blocked:
            changes.append(Change(
                self.name, "kernel next boot", "verify",
                f"{following} (the newest installed)", pinned,
                [Fail(f"the next boot runs kernel {following}, not the pinned {pinned}: "
                      f"remove it (apt-get purge linux-image-{following}) or pin it "
                      f"(kernel_version: {following})")], kind="kernel"))
        keeps = following or running
        changes += self._module_changes(state, v, keeps, keeps in headers)
        target = pinned if pinned is not None else following
        if not blocked and target is not None and target != running:
            changes.append(Change(
                self.name, "kernel running", "reboot", running, f"{target} (next boot)",
                [Reboot(v.string("kernel_reboot_command"),
                        f"running kernel {running}, next boot {target}")],
                pending_reboot=True, kind="reboot"))
        return changes

    def _blacklist_change(self, facts: Facts, v: RoleVars) -> list[Change]:
        if not self._protects(v):
            return []
        content = render("unattended-upgrades.conf.j2", header=HEADER.format(role=self.name),
                         patterns=self._blacklist(v), guarded="the pinned kernel")
        change = file_change(self.name, facts, UNATTENDED_PATH, content)
        return [change] if change else []

    def _module_changes(self, state: dict[str, Any], v: RoleVars, release: str,
                        has_headers: bool) -> list[Change]:
        """One change per module not built for ``release``, sharing one build step."""
        built = state["modules"].get(release, {})
        problems = {m: p for m in self.modules(v)
                    if (p := module_problem(built.get(m), m, release)) is not None}
        if not problems:
            return []
        step = self._build_step(state, release, has_headers, list(problems))
        return [Change(self.name, f"module {m} ({release})", "build", problem,
                       f"built for {release}", [step], kind="module")
                for m, problem in problems.items()]

    @staticmethod
    def _build_step(state: dict[str, Any], release: str, has_headers: bool,
                    modules: list[str]) -> Step:
        """``dkms autoinstall -k RELEASE``, then modinfo of each module through that
        kernel's index; or why DKMS cannot build them."""
        names = ", ".join(modules)
        if state["dkms"] is None:
            return Fail(f"{names} not built for kernel {release}, and dkms is not installed: "
                        "install the driver's DKMS package or build them for that kernel")
        if not has_headers:
            return Fail(f"{names} not built for kernel {release}: its headers are not "
                        f"installed (linux-headers-{release}), so DKMS cannot build them")
        k = shlex.quote(release)
        verify = "; ".join(
            f"modinfo -k {k} {shlex.quote(m)} >/dev/null 2>&1 || {{ echo "
            f"{shlex.quote(f'{m} is still not built for {release} (see dkms status)')} >&2; "
            "exit 1; }" for m in modules)
        return Run(f"dkms autoinstall -k {k}; {verify}",
                   f"dkms autoinstall -k {release}", timeout=1800)

    def standins(self) -> list[Standin]:
        return [pkg for release, version in STANDIN_KERNELS.items()
                for pkg in kernel_standins(release, version)]


STANDIN_KERNELS = {"6.1.0-27-amd64": "6.1.115-1", "6.1.0-28-amd64": "6.1.119-1"}
"""Debian 12's kernel package names, served by the lab."""


def kernel_standins(release: str, version: str) -> list[Standin]:
    """linux-image-RELEASE (its /boot/vmlinuz and module directory) and
    linux-headers-RELEASE (the /lib/modules/RELEASE/build link). Each, as the real
    packages' hooks do, asks DKMS to build its modules for the kernel; without headers
    DKMS cannot, and the kernel is left without them."""
    hook = (f"depmod -a {release} 2>/dev/null || true\n"
            "if command -v dkms >/dev/null 2>&1; then "
            f"dkms autoinstall -k {release} || true; fi\n")
    return [
        Standin(f"linux-image-{release}", version, f"Linux {version} for 64-bit PCs",
                files={f"/boot/vmlinuz-{release}": f"gpufleet lab stand-in for Linux "
                                                   f"{release}\n",
                       f"/lib/modules/{release}/modules.order": ""},
                postinst=hook),
        Standin(f"linux-headers-{release}", version, f"Header files for Linux {release}",
                files={f"/usr/src/linux-headers-{release}/Makefile": "# gpufleet lab stand-in\n"},
                postinst=f"mkdir -p /lib/modules/{release} && ln -sfn "
                         f"/usr/src/linux-headers-{release} /lib/modules/{release}/build\n"
                         + hook),
    ]


ROLE = KernelRole()
