"""Pinned apt packages: exact versions, holds, preferences pins, one transaction per role."""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from gpufleet import debversion, parsers
from gpufleet.errors import GpufleetError
from gpufleet.facts import Facts
from gpufleet.managed import HEADER, file_change
from gpufleet.plan import ApplyContext, Change, Run

APT_ENV = "DEBIAN_FRONTEND=noninteractive NEEDRESTART_MODE=a"


class PackageUnavailable(GpufleetError):
    """A pinned version is not offered by the host's repositories."""


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


@dataclass(eq=False)
class AptInstall:
    """Install exact versions in one transaction, holding them afterwards.

    Only the packages named here are unheld for the transaction and held again
    after it, even when it fails, so gpufleet never releases holds it does not own.
    """

    packages: dict[str, str]
    hold: bool = True

    def describe(self) -> str:
        return "apt-get install " + " ".join(f"{n}={v}" for n, v in self.packages.items())

    def apply(self, ctx: ApplyContext) -> None:
        apt_update(ctx)
        self._check_available(ctx)
        names = " ".join(shlex.quote(n) for n in self.packages)
        specs = " ".join(shlex.quote(f"{n}={v}") for n, v in self.packages.items())
        script = (f"apt-mark unhold {names} >/dev/null; "
                  f"{_apt(ctx)} --allow-downgrades install {specs}; rc=$?; ")
        if self.hold:
            script += f"apt-mark hold {names} >/dev/null; "
        script += "exit $rc"
        result = ctx.conn.run(script, timeout=ctx.options.lock_timeout_s + 1800)
        if not result.ok:
            raise GpufleetError(_lock_message(result.stdout + result.stderr, ctx)
                                or f"{self.describe()} failed: "
                                   f"{(result.stderr or result.stdout).strip()[-400:]}")

    def _check_available(self, ctx: ApplyContext) -> None:
        names = " ".join(shlex.quote(n) for n in self.packages)
        result = ctx.conn.run(f"apt-cache madison {names}", timeout=120)
        available = parsers.apt_madison(result.stdout)
        for name, version in self.packages.items():
            offered = available.get(name, [])
            if version not in offered:
                listing = ", ".join(offered) if offered else "none"
                raise PackageUnavailable(
                    f"{name}={version} is not available from the host's apt repositories "
                    f"(available: {listing})")


def package_changes(role: str, facts: Facts, wanted: dict[str, str],
                    hold: bool = True) -> list[Change]:
    """Changes for packages at exact versions (and held); one shared install step."""
    install = AptInstall(dict(wanted), hold)
    changes = []
    for name, version in wanted.items():
        record = facts.package(name)
        if record is None:
            changes.append(Change(role, f"package {name}", "install", "not installed", version,
                                  [install]))
        elif record["version"] != version:
            action = "upgrade" if debversion.compare(version, record["version"]) > 0 \
                else "downgrade"
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
    return file_change(role, facts, pin_path(role), pin_content(role, wanted))


def pinned_packages(role: str, facts: Facts, wanted: dict[str, str]) -> list[Change]:
    """Package, hold and pin changes for a role's packages, in that order."""
    changes = package_changes(role, facts, wanted)
    pin = pin_change(role, facts, wanted)
    return changes + ([pin] if pin else [])
