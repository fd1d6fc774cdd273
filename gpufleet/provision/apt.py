"""Pinned apt packages: exact versions, holds, preferences pins, one transaction per role.

A wanted version is exact (``12.4.1-1``) or a pattern with ``*`` (``580.95.05-*``: that
upstream version, whatever the packaging revision; ``13.0.*-1``: the one 13.0 release the
repositories have). An installed version matching the pattern is converged; an install
resolves the pattern against what the repositories offer, after ``apt-get update``.
"""

from __future__ import annotations

import fnmatch
import functools
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field

from gpufleet.errors import GpufleetError, VarError
from gpufleet.facts.gather import Facts
from gpufleet.facts.parsers import packages
from gpufleet.provision import debversion
from gpufleet.provision.managed import HEADER, file_change
from gpufleet.provision.plan import ApplyContext, Change, Run
from gpufleet.provision.role import RoleVars

APT_ENV = "DEBIAN_FRONTEND=noninteractive NEEDRESTART_MODE=a"


class PackageUnavailable(GpufleetError):
    """A pinned version is not offered by the host's repositories."""


_NAME = re.compile(r"^[a-z0-9][a-z0-9+.-]*\Z")
_VERSION = re.compile(r"^[0-9*][A-Za-z0-9.+~:*-]*\Z")


def templated(v: RoleVars, names: list[str], version_key: str, fields: dict[str, str],
              names_key: str) -> dict[str, str]:
    """Package name -> version from a role's templates (``{version}``, ``{branch}`` ...):
    a placeholder typo, or a name or version that is not one (it would reach apt's command
    line and a preferences file), is a VarError naming the host and the variables."""
    try:
        version = v.string(version_key).format(**fields)
        packages = {str(name).format(**fields): version for name in names}
    except (KeyError, IndexError, ValueError) as exc:
        raise VarError(f"host {v.host.name}: {names_key} or {version_key} has an unknown "
                       f"placeholder ({exc}); use {', '.join('{' + k + '}' for k in fields)}"
                       ) from None
    for name, wanted in packages.items():
        if not _NAME.match(name):
            raise VarError(f"host {v.host.name}: variable {names_key} gives {name!r}, which is "
                           "not a package name")
        if not _VERSION.match(wanted):
            raise VarError(f"host {v.host.name}: variable {version_key} gives {wanted!r}, "
                           "which is not a package version")
    return packages


def matches(version: str, wanted: str) -> bool:
    """Whether an installed ``version`` is what ``wanted`` (exact or a pattern) asks for."""
    return fnmatch.fnmatchcase(version, wanted) if "*" in wanted else version == wanted


def resolve(name: str, wanted: str, offered: list[str]) -> str:
    """The exact version to install for ``wanted`` among ``offered``.

    A pattern that only leaves the packaging revision open takes the newest revision; one
    that leaves the version itself open must match exactly one upstream version."""
    if "*" not in wanted:
        if wanted not in offered:
            raise PackageUnavailable(
                f"{name}={wanted} is not available from the host's apt repositories "
                f"(available: {', '.join(offered) if offered else 'none'})")
        return wanted
    found = sorted((v for v in offered if fnmatch.fnmatchcase(v, wanted)),
                   key=functools.cmp_to_key(debversion.compare), reverse=True)
    if not found:
        raise PackageUnavailable(
            f"no version of {name} matching {wanted} is available from the host's apt "
            f"repositories (available: {', '.join(offered) if offered else 'none'})")
    upstreams = {packages.nvidia_version_from_package(v) for v in found}
    if len(upstreams) > 1 and not wanted.endswith("-*"):
        raise PackageUnavailable(
            f"{name}: {wanted} is ambiguous, the repositories offer {', '.join(found)}; "
            "pin the exact version")
    return found[0]


def _apt(ctx: ApplyContext) -> str:
    return (f"{APT_ENV} apt-get -q -y -o DPkg::Lock::Timeout={ctx.options.lock_timeout_s} "
            "-o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold")


def _lock_message(output: str, ctx: ApplyContext) -> str | None:
    for line in output.splitlines():
        if "Could not get lock" in line or "Unable to acquire the dpkg" in line \
                or "Unable to lock" in line:
            return (f"apt/dpkg lock still held by another process after "
                    f"{ctx.options.lock_timeout_s}s: {line.strip()}")
    return None


def _update_script(ctx: ApplyContext) -> str:
    """``apt-get update``, retried while another process holds apt's lists lock (apt itself
    waits for the dpkg lock but not for that one)."""
    return "\n".join([
        f"deadline=$(( $(date +%s) + {ctx.options.lock_timeout_s} ))",
        "while :; do",
        f"  out=$({_apt(ctx)} update 2>&1); rc=$?",
        "  [ $rc -eq 0 ] && exit 0",
        "  if printf '%s' \"$out\" | grep -q -e 'Could not get lock' -e 'Unable to lock'; then",
        "    if [ \"$(date +%s)\" -lt \"$deadline\" ]; then sleep 2; continue; fi",
        "  fi",
        "  printf '%s\\n' \"$out\" >&2",
        "  exit $rc",
        "done",
    ])


def apt_update(ctx: ApplyContext) -> None:
    """``apt-get update`` once per host and run."""
    if ctx.memo.get("apt_updated"):
        return
    result = ctx.conn.run(_update_script(ctx), timeout=ctx.options.lock_timeout_s + 600)
    if not result.ok:
        raise GpufleetError(_lock_message(result.stdout + result.stderr, ctx)
                            or f"apt-get update failed: {result.stderr.strip()[-300:]}")
    ctx.memo["apt_updated"] = True


Diagnose = Callable[[str], str | None]


@dataclass(eq=False)
class AptInstall:
    """Install exact versions (or the versions patterns resolve to) in one transaction,
    holding them afterwards.

    Only the packages named here are unheld for the transaction and held again
    after it, even when it fails, so gpufleet never releases holds it does not own.
    ``diagnose`` turns a failed transaction's output into a clearer message (the driver
    role names DKMS build failures and Secure Boot).
    """

    packages: dict[str, str]
    hold: bool = True
    diagnose: Diagnose | None = field(default=None, compare=False)

    def describe(self) -> str:
        return "apt-get install " + " ".join(f"{n}={v}" for n, v in self.packages.items())

    def apply(self, ctx: ApplyContext) -> None:
        apt_update(ctx)
        exact = self._resolve(ctx)
        names = " ".join(shlex.quote(n) for n in exact)
        specs = " ".join(shlex.quote(f"{n}={v}") for n, v in exact.items())
        script = (f"apt-mark unhold {names} >/dev/null; "
                  f"{_apt(ctx)} --allow-downgrades install {specs}; rc=$?; ")
        if self.hold:
            script += f"apt-mark hold {names} >/dev/null; "
        script += "exit $rc"
        result = ctx.conn.run(script, timeout=ctx.options.lock_timeout_s + 1800)
        if not result.ok:
            output = result.stdout + result.stderr
            raise GpufleetError(_lock_message(output, ctx)
                                or (self.diagnose(output) if self.diagnose else None)
                                or f"{self.describe()} failed: "
                                   f"{(result.stderr or result.stdout).strip()[-400:]}")

    def _resolve(self, ctx: ApplyContext) -> dict[str, str]:
        names = " ".join(shlex.quote(n) for n in self.packages)
        result = ctx.conn.run(f"apt-cache madison {names}", timeout=120)
        available = packages.apt_madison(result.stdout)
        return {name: resolve(name, version, available.get(name, []))
                for name, version in self.packages.items()}


def package_changes(role: str, facts: Facts, wanted: dict[str, str],
                    hold: bool = True, diagnose: Diagnose | None = None) -> list[Change]:
    """Changes for packages at exact versions (and held); one shared install step."""
    install = AptInstall(dict(wanted), hold, diagnose)
    changes = []
    for name, version in wanted.items():
        record = facts.package(name)
        if record is None:
            changes.append(Change(role, f"package {name}", "install", "not installed", version,
                                  [install]))
        elif not matches(record["version"], version):
            action = "change" if "*" in version else (
                "upgrade" if debversion.compare(version, record["version"]) > 0
                else "downgrade")
            changes.append(Change(role, f"package {name}", action, record["version"], version,
                                  [install]))
        elif hold and not record["hold"]:
            changes.append(Change(role, f"hold {name}", "hold", "not held", "held",
                                  [Run(f"apt-mark hold {shlex.quote(name)}",
                                       f"apt-mark hold {name}")]))
    return changes


def pin_path(role: str) -> str:
    return f"/etc/apt/preferences.d/gpufleet-{role}.pref"


def pin_content(role: str, wanted: dict[str, str]) -> str:
    """An apt preferences file that pins each package at its version."""
    stanzas = [f"# {HEADER.format(role=role)}\n"]
    for name, version in wanted.items():
        stanzas.append(f"Package: {name}\nPin: version {version}\nPin-Priority: 1001\n")
    return "\n".join(stanzas)


def pin_change(role: str, facts: Facts, wanted: dict[str, str]) -> Change | None:
    """The change that writes the role's apt pin, or None when it is in place."""
    change = file_change(role, facts, pin_path(role), pin_content(role, wanted))
    if change is not None:
        change.kind = "apt-pin"
    return change


def pinned_packages(role: str, facts: Facts, wanted: dict[str, str],
                    diagnose: Diagnose | None = None) -> list[Change]:
    """Package, hold and pin changes for a role's packages, in that order."""
    changes = package_changes(role, facts, wanted, diagnose=diagnose)
    pin = pin_change(role, facts, wanted)
    return changes + ([pin] if pin else [])
