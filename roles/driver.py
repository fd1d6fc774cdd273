"""NVIDIA driver at an exact version, from the source and in the flavour the site uses:
installed, held, pinned, kept from unattended-upgrades; or preinstalled with the host image,
or run by NVIDIA's GPU Operator (its driver container), and only verified.

A node whose driver the GPU Operator runs (its driver container's root at
``/run/nvidia/driver``, or the operator's ``/run/nvidia/validations`` markers) is never given
driver packages: with ``nvidia_driver_install: apt`` the role refuses, naming the operator,
instead of installing a second driver under it; with ``operator`` it verifies the loaded
module against the pin.

Each source names its packages its own way (:data:`SOURCES`): NVIDIA's CUDA repository
(``nvidia-open-580``, ``cuda-drivers-580``), Ubuntu's archive (``nvidia-driver-580-server``,
``nvidia-driver-580-server-open``) and Debian's (``nvidia-driver`` with
``nvidia-kernel-open-dkms`` or ``nvidia-kernel-dkms``). The packaging revision differs by
source and release, so the version is pinned as ``<driver version>-*``. A loaded kernel
module that differs from the wanted version or flavour means the host needs a reboot;
that is reported as such and applied only with ``--reboot``. DKMS build failures and a
module refused by Secure Boot are named as such.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import ClassVar

from gpufleet.errors import VarError
from gpufleet.facts.catalog import Fact
from gpufleet.facts.gather import FactRequest, Facts
from gpufleet.facts.parsers import packages, system
from gpufleet.provision import apt
from gpufleet.provision.managed import HEADER, file_change, render
from gpufleet.provision.plan import Change, Fail
from gpufleet.provision.reboot import Reboot
from gpufleet.provision.role import PlanContext, RoleBase, RoleVars, Var
from gpufleet.provision.standins import Standin

UNATTENDED_PATH = "/etc/apt/apt.conf.d/51gpufleet-unattended-upgrades"
FLAVORS = ("open", "proprietary")
INSTALLS = ("apt", "preinstalled", "operator")
VERIFY_ONLY = ("preinstalled", "operator")
OPERATOR_ROOT = "/run/nvidia/driver"
# (source, flavour) -> the packages that install the driver; {branch} is 580 for 580.95.05.
SOURCES: dict[tuple[str, str], tuple[str, ...]] = {
    ("cuda-repo", "open"): ("nvidia-open-{branch}",),
    ("cuda-repo", "proprietary"): ("cuda-drivers-{branch}",),
    ("ubuntu", "open"): ("nvidia-driver-{branch}-server-open",),
    ("ubuntu", "proprietary"): ("nvidia-driver-{branch}-server",),
    ("debian", "open"): ("nvidia-driver", "nvidia-kernel-open-dkms"),
    ("debian", "proprietary"): ("nvidia-driver", "nvidia-kernel-dkms"),
}
OPEN_BY_DEFAULT_FROM = 560  # NVIDIA's default flavour is the open module from branch 560
_VERSION = re.compile(r"^\d+(\.\d+)+\Z")
_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.+_*-]*\Z")



def driver_version(v: RoleVars) -> str:
    """The inventory's ``nvidia_driver_version``, checked: every role that names the driver
    (in a package version, a CDI spec's check) reads it through here."""
    version = v.string("nvidia_driver_version")
    if not _VERSION.match(version):
        raise VarError(f"host {v.host.name}: nvidia_driver_version must look like "
                       f"580.95.05, got {version!r}")
    return version


MODULE_FLAVOR = Fact(
    "nvidia_module_flavor",
    "if [ -r /proc/driver/nvidia/version ]; then cat /proc/driver/nvidia/version; else "
    "echo 'no NVIDIA kernel module loaded'; exit 127; fi", system.proc_driver_flavor)
GPU_OPERATOR = Fact(
    "gpu_operator",
    f"if [ -x {OPERATOR_ROOT}/usr/bin/nvidia-smi ] || "
    "[ -e /run/nvidia/validations/.driver-ctr-ready ] || "
    "[ -e /run/nvidia/validations/driver-ready ]; then echo operator; else echo none; fi",
    system.gpu_operator)
SECURE_BOOT = Fact(
    "secure_boot",
    "if command -v mokutil >/dev/null 2>&1; then mokutil --sb-state 2>&1; "
    "else echo 'mokutil not found'; exit 127; fi", system.secure_boot)


class DriverRole(RoleBase):
    name = "driver"
    order = 20
    variables: ClassVar[Mapping[str, Var]] = {
        "nvidia_driver_version": Var(None, "string", "driver version, e.g. 580.95.05"),
        "nvidia_driver_install": Var("apt", "string", "apt, preinstalled or operator (NVIDIA's "
                                                      "GPU Operator runs it): verify only"),
        "nvidia_driver_flavor": Var(None, "string",
                                    "open or proprietary (default: open from branch 560)"),
        "nvidia_driver_source": Var("cuda-repo", "string", "cuda-repo, ubuntu or debian"),
        "nvidia_driver_packages": Var(None, "list", "packages (default: the source's)"),
        "nvidia_driver_package": Var(None, "string", "one package (older name of the above)"),
        "nvidia_driver_package_version": Var("{version}-*", "string",
                                             "package version template"),
        "nvidia_driver_protect_from_unattended_upgrades": Var(True, "boolean",
                                                              "write the blacklist"),
        "nvidia_driver_unattended_blacklist": Var(
            ["nvidia-", "libnvidia-", "cuda-", "libnccl"], "list",
            "Unattended-Upgrade::Package-Blacklist entries"),
        "nvidia_driver_reboot_command": Var("reboot", "string", "command that reboots"),
        "nvidia_driver_dkms": Var(True, "boolean", "the driver builds with DKMS (bootstrap "
                                                    "checks for kernel headers)"),
    }
    shared_keys = ("driver",)

    def active(self, v: RoleVars) -> bool:
        return "nvidia_driver_version" in v

    def check(self, v: RoleVars) -> None:
        super().check(v)
        if self.active(v):
            self.wanted(v)
            self._blacklist(v)
            command = v.string("nvidia_driver_reboot_command")
            if not command.strip() or any(c in command for c in "\n\r\0"):
                raise v.fail("nvidia_driver_reboot_command", "a command on one line", command)

    def _fields(self, v: RoleVars) -> dict[str, str]:
        version = driver_version(v)
        return {"version": version, "branch": version.split(".")[0]}

    def install(self, v: RoleVars) -> str:
        mode = v.string("nvidia_driver_install")
        if mode not in INSTALLS:
            raise v.fail("nvidia_driver_install", "apt, preinstalled or operator", mode)
        return mode

    def flavor(self, v: RoleVars) -> str:
        """open or proprietary: the inventory's, else NVIDIA's default for the branch."""
        flavor = v.opt_string("nvidia_driver_flavor")
        if flavor is None:
            branch = int(self._fields(v)["branch"])
            return "open" if branch >= OPEN_BY_DEFAULT_FROM else "proprietary"
        if flavor not in FLAVORS:
            raise v.fail("nvidia_driver_flavor", "open or proprietary", flavor)
        return flavor

    def wanted(self, v: RoleVars) -> dict[str, str]:
        """Package -> version pattern; empty for a driver the role only verifies."""
        fields = self._fields(v)
        if self.install(v) in VERIFY_ONLY:
            return {}
        source = v.string("nvidia_driver_source")
        names = v.items("nvidia_driver_packages") or (
            [v.string("nvidia_driver_package")] if v.opt_string("nvidia_driver_package")
            else None)
        if names is None:
            if (source, self.flavor(v)) not in SOURCES:
                raise v.fail("nvidia_driver_source", "cuda-repo, ubuntu or debian", source)
            names = list(SOURCES[(source, self.flavor(v))])
        return apt.templated(v, names, "nvidia_driver_package_version", fields,
                             "nvidia_driver_packages")

    def _blacklist(self, v: RoleVars) -> list[str]:
        """The blacklist entries, each a package name prefix (anything else could change
        the apt.conf file's syntax)."""
        entries = [str(e) for e in v.items("nvidia_driver_unattended_blacklist")]
        bad = [e for e in entries if not _PATTERN.match(e)]
        if bad:
            raise VarError(f"host {v.host.name}: nvidia_driver_unattended_blacklist entry "
                           f"{bad[0]!r} is not a package name prefix")
        return entries

    def managed_files(self, v: RoleVars) -> dict[str, str]:
        return {"apt pin": apt.pin_path(self.name), "unattended-upgrades blacklist":
                UNATTENDED_PATH}

    def request(self, v: RoleVars) -> FactRequest:
        wanted = self.wanted(v)
        files = {UNATTENDED_PATH} | ({apt.pin_path(self.name)} if wanted else set())
        return FactRequest(packages=frozenset(wanted), files=frozenset(files),
                           custom=frozenset({MODULE_FLAVOR, SECURE_BOOT, GPU_OPERATOR}))

    def plan(self, facts: Facts, v: RoleVars, ctx: PlanContext) -> list[Change]:
        operator = self._operator(facts, v)
        if operator is not None:
            return [operator]
        wanted = self.wanted(v)
        changes = apt.pinned_packages(self.name, facts, wanted, diagnose=diagnose) \
            if wanted else []
        if wanted and v.boolean("nvidia_driver_protect_from_unattended_upgrades"):
            content = render("unattended-upgrades.conf.j2",
                             header=HEADER.format(role=self.name), patterns=self._blacklist(v))
            change = file_change(self.name, facts, UNATTENDED_PATH, content)
            changes += [change] if change else []
        return changes + self._module_changes(facts, v)

    def _operator(self, facts: Facts, v: RoleVars) -> Change | None:
        """A refusal when the GPU Operator runs the driver and the inventory would install
        one, or says the operator runs it where it does not."""
        mode, found = self.install(v), facts.get("gpu_operator")
        if mode == "apt" and found:
            return Change(self.name, "driver", "verify", "run by NVIDIA's GPU Operator",
                          "installed from apt", [Fail(
                              f"the GPU Operator runs this node's driver (its driver "
                              f"container at {OPERATOR_ROOT}): gpufleet does not install or "
                              f"remove a driver under it; declare nvidia_driver_install: "
                              f"operator to verify it")], kind="driver")
        if mode == "operator" and found is False:
            return Change(self.name, "driver", "verify", "no GPU Operator driver",
                          "run by NVIDIA's GPU Operator", [Fail(
                              f"nvidia_driver_install is operator, but no GPU Operator driver "
                              f"runs on this node (no {OPERATOR_ROOT}, no "
                              f"/run/nvidia/validations markers)")], kind="driver")
        return None

    def _module_changes(self, facts: Facts, v: RoleVars) -> list[Change]:
        target, flavor = self._fields(v)["version"], self.flavor(v)
        loaded = facts.get("nvidia_module")
        loaded_flavor = facts.get("nvidia_module_flavor")
        if loaded == target and loaded_flavor in (None, flavor):
            return []
        before = f"{loaded} ({loaded_flavor})" if loaded else \
            f"not loaded ({facts.why_absent('nvidia_module')})"
        after = f"{target} ({flavor})"
        if self.install(v) == "preinstalled":
            return [Change(self.name, "kernel module nvidia", "verify", before, after,
                           [Fail(f"the host image provides the driver: loaded {before}, the "
                                 f"inventory wants {after}; install the right image")],
                           kind="driver")]
        if self.install(v) == "operator":
            return [Change(self.name, "kernel module nvidia", "verify", before, after,
                           [Fail(f"the GPU Operator provides the driver: loaded {before}, the "
                                 f"inventory wants {after}; set the operator's driver version "
                                 f"(ClusterPolicy spec.driver.version)")], kind="driver")]
        reason = f"loaded kernel module {before}, driver package {after}"
        return [Change(self.name, "kernel module nvidia", "reboot", before, after,
                       [Reboot(v.string("nvidia_driver_reboot_command"), reason)],
                       pending_reboot=True, kind="reboot")]

    def shared(self, facts: Facts, v: RoleVars) -> dict[str, str | None]:
        return {"driver": facts.get("nvidia_module")}

    def standins(self) -> list[Standin]:
        return STANDINS


_DKMS_FAILED = re.compile(r"Bad return status for module build on kernel: (\S+)")
_DKMS_LOG = re.compile(r"Consult (\S+make\.log)")


def diagnose(output: str) -> str | None:
    """Name what went wrong in a driver install, where the output says it."""
    failed = _DKMS_FAILED.search(output)
    if failed:
        log = _DKMS_LOG.search(output)
        where = f"; see {log.group(1)}" if log else ""
        return (f"DKMS could not build the NVIDIA kernel module for kernel {failed.group(1)} "
                f"(are its headers installed? linux-headers-{failed.group(1)}){where}")
    if "Key was rejected by service" in output or "Required key not available" in output:
        return ("the kernel refused the NVIDIA module: Secure Boot is on and the module is "
                "not signed with an enrolled key (enrol the DKMS signing key with mokutil "
                "--import /var/lib/dkms/mok.pub and reboot, or use a signed driver)")
    return None


def _module_line(upstream: str, flavor: str) -> str:
    """The first line of /proc/driver/nvidia/version for a driver of that flavour."""
    kind = "Open Kernel Module for x86_64" if flavor == "open" else "x86_64 Kernel Module"
    return f"NVRM version: NVIDIA UNIX {kind}  {upstream}  Release Build  (gpufleet lab)\n"


def driver_standin(name: str, version: str, flavor: str, *, depends: str = "",
                   postinst: str = "") -> Standin:
    """A driver package as the lab serves it: it provides the driver of its upstream
    version (which fabricmanager of that exact version depends on), conflicts with any
    other driver, and carries the module line the lab "loads" at boot."""
    upstream = packages.nvidia_version_from_package(version)
    branch = upstream.split(".")[0]
    return Standin(
        name, version, f"NVIDIA driver {upstream} ({flavor}) metapackage",
        files={f"/usr/lib/gpufleet-lab/{name}.nvidia-module": _module_line(upstream, flavor)},
        depends=depends, provides=f"nvidia-driver-binary, nvidia-kernel-common-{branch}-"
                                  f"{upstream}",
        conflicts="nvidia-driver-binary", postinst=postinst)


DKMS_FAILURE = """\
Building for 6.8.0-45-generic
Building initial module for 6.8.0-45-generic
Error! Bad return status for module build on kernel: 6.8.0-45-generic (x86_64)
Consult /var/lib/dkms/nvidia/570.86.10/build/make.log for more information.
"""

STANDINS: list[Standin] = [
    driver_standin("nvidia-driver-550", "550.127.05-0ubuntu1", "proprietary"),
    driver_standin("nvidia-driver-550", "550.144.03-0ubuntu1", "proprietary"),
    driver_standin("nvidia-driver-565", "565.57.01-0ubuntu1", "proprietary"),
    driver_standin("cuda-drivers-550", "550.127.05-1", "proprietary"),
    driver_standin("cuda-drivers-565", "565.57.01-1", "proprietary"),
    driver_standin("cuda-drivers-580", "580.95.05-1", "proprietary"),
    driver_standin("nvidia-open-580", "580.95.05-1", "open"),
    driver_standin("nvidia-open-580", "580.105.08-1", "open"),
    driver_standin("nvidia-driver-580-open", "580.95.05-0ubuntu1", "open"),
    driver_standin("nvidia-driver-580-server", "580.95.05-0ubuntu0.24.04.2", "proprietary"),
    driver_standin("nvidia-driver-580-server-open", "580.95.05-0ubuntu0.24.04.2", "open"),
    driver_standin("nvidia-kernel-open-dkms", "580.95.05-1~deb12u1", "open",
                   depends="nvidia-driver (= 580.95.05-1~deb12u1)"),
    Standin("nvidia-driver", "580.95.05-1~deb12u1", "NVIDIA metapackage (Debian)"),
    driver_standin("nvidia-driver-570", "570.86.10-0ubuntu1", "proprietary",
                   postinst=f"cat >&2 <<'EOF'\n{DKMS_FAILURE}EOF\nexit 10\n"),
]

ROLE = DriverRole()
