"""Pinned apt packages: install/upgrade/downgrade/hold changes, pins, one shared transaction."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from gpufleet.connect.connection import Budget, CommandResult
from gpufleet.errors import GpufleetError
from gpufleet.facts.formats import FileState
from gpufleet.facts.gather import Facts
from gpufleet.inventory.model import Host
from gpufleet.provision import apt
from gpufleet.provision.plan import ApplyContext, ApplyOptions, Plan, Run


def installed(version: str, hold: bool = True) -> dict[str, Any]:
    return {"version": version, "status": f"{'hold' if hold else 'install'} ok installed",
            "installed": True, "hold": hold}


def facts(packages: dict[str, dict[str, Any]], **files: FileState) -> Facts:
    values: dict[str, Any] = {"packages": packages}
    values.update({f"file:{f.path}": f for f in files.values()})
    return Facts("gpu01", values=values)


def rows(changes: list[Any]) -> list[tuple[str, str, str | None, str | None]]:
    return [(c.item, c.action, c.before, c.after) for c in changes]


WANTED = {
    "libnccl2": "2.21.5-1+cuda12.4",
    "libnccl-dev": "2.21.5-1+cuda12.4",
    "cuda-toolkit-12-4": "12.4.1-1",
    "nvidia-driver-550": "550.127.05-0ubuntu1",
    "held-ok": "1.0-1",
}


def test_package_changes_install_upgrade_downgrade_hold() -> None:
    f = facts({
        "libnccl2": installed("2.23.4-1+cuda12.6"),
        "libnccl-dev": {"version": "2.21.5-1+cuda12.4", "status": "deinstall ok config-files",
                        "installed": False, "hold": False},
        "cuda-toolkit-12-4": installed("12.4.0-1"),
        "nvidia-driver-550": installed("550.127.05-0ubuntu1", hold=False),
        "held-ok": installed("1.0-1"),
    })
    changes = apt.package_changes("stack", f, WANTED)
    assert rows(changes) == [
        ("stack/package libnccl2", "downgrade", "2.23.4-1+cuda12.6", "2.21.5-1+cuda12.4"),
        ("stack/package libnccl-dev", "install", "not installed", "2.21.5-1+cuda12.4"),
        ("stack/package cuda-toolkit-12-4", "upgrade", "12.4.0-1", "12.4.1-1"),
        ("stack/hold nvidia-driver-550", "hold", "not held", "held"),
    ]
    install = changes[0].steps[0]
    assert isinstance(install, apt.AptInstall)
    assert [c.steps for c in changes[:3]] == [[install]] * 3
    assert install.packages == WANTED
    assert install.hold is True
    [hold] = changes[3].steps
    assert isinstance(hold, Run)
    assert (hold.command, hold.description) == ("apt-mark hold nvidia-driver-550",
                                                "apt-mark hold nvidia-driver-550")
    # one apt transaction for the three package changes, then the hold
    assert [s for _, s in Plan("gpu01", changes).steps()] == [install, hold]


def test_upgrade_versus_downgrade_uses_debian_ordering() -> None:
    # numeric runs compare as numbers, a tilde pre-release sorts before the release, and
    # an epoch outweighs the upstream version.
    f = facts({"a": installed("550.127.05-0ubuntu1"), "b": installed("2.21.5-1"),
               "c": installed("1:1.0-1")})
    wanted = {"a": "550.144.03-0ubuntu1", "b": "2.21.5~rc1-1", "c": "2.0-1"}
    assert [c.action for c in apt.package_changes("r", f, wanted)] == \
        ["upgrade", "downgrade", "downgrade"]


def test_converged_packages_have_no_changes() -> None:
    f = facts({"a": installed("1.0-1"), "b": installed("2.0-1")})
    assert apt.package_changes("r", f, {"a": "1.0-1", "b": "2.0-1"}) == []


def test_without_hold_an_unheld_package_is_fine() -> None:
    f = facts({"a": installed("1.0-1", hold=False)})
    assert apt.package_changes("r", f, {"a": "1.0-1"}, hold=False) == []
    changes = apt.package_changes("r", facts({}), {"a": "1.0-1"}, hold=False)
    assert changes[0].steps[0].hold is False  # type: ignore[attr-defined]


def test_pin_content_exact_text() -> None:
    assert apt.pin_content("nccl", {"libnccl2": "2.21.5-1+cuda12.4",
                                    "libnccl-dev": "2.21.5-1+cuda12.4"}) == (
        "# Managed by gpufleet (role nccl); local edits are reported as drift and replaced.\n"
        "\n"
        "Package: libnccl2\n"
        "Pin: version 2.21.5-1+cuda12.4\n"
        "Pin-Priority: 1001\n"
        "\n"
        "Package: libnccl-dev\n"
        "Pin: version 2.21.5-1+cuda12.4\n"
        "Pin-Priority: 1001\n")


def test_pin_path() -> None:
    assert apt.pin_path("driver") == "/etc/apt/preferences.d/gpufleet-driver.pref"


def test_pinned_packages_orders_packages_then_pin() -> None:
    path = apt.pin_path("cuda")
    wanted = {"cuda-toolkit-12-4": "12.4.1-1"}
    f = facts({}, pin=FileState(path, False))
    assert rows(apt.pinned_packages("cuda", f, wanted)) == [
        ("cuda/package cuda-toolkit-12-4", "install", "not installed", "12.4.1-1"),
        (f"cuda/file {path}", "create", "absent", "152 bytes"),
    ]
    pinned = FileState(path, True, apt.pin_content("cuda", wanted).encode(), "644", "root:root")
    f = facts({"cuda-toolkit-12-4": installed("12.4.1-1")}, pin=pinned)
    assert apt.pinned_packages("cuda", f, wanted) == []
    assert len(apt.pin_content("cuda", wanted).encode()) == 152


# --------------------------------------------------------------------------- AptInstall.apply


class FakeConnection:
    """Answers commands by the first matching prefix and records them."""

    def __init__(self, answers: list[tuple[Callable[[str], bool], CommandResult]]) -> None:
        self.host = Host("gpu01", {}, frozenset({"all"}))
        self.round_trips = 0
        self.budget = Budget()
        self.commands: list[str] = []
        self.answers = answers

    def run(self, command: str, *, timeout: float = 120.0, stdin: bytes | None = None,
            become: bool | None = None) -> CommandResult:
        self.commands.append(command)
        for match, result in self.answers:
            if match(command):
                return result
        return CommandResult(command, 0, "", "", 0.0)

    def put(self, path: str, content: bytes, *, mode: int = 0o644, owner: str = "root:root",
            backup: bool = True) -> None:
        raise AssertionError("not used")

    def close(self) -> None:
        return None


def ctx_for(conn: FakeConnection) -> ApplyContext:
    return ApplyContext(conn, conn.host, ApplyOptions(lock_timeout_s=60))  # type: ignore[arg-type]


MADISON = (" libnccl2 | 2.23.4-1+cuda12.6 | file:/repo ./ Packages\n"
           " libnccl2 | 2.21.5-1+cuda12.4 | file:/repo ./ Packages\n"
           "libnccl-dev | 2.21.5-1+cuda12.4 | file:/repo ./ Packages\n")


def result(rc: int, stdout: str = "", stderr: str = "") -> CommandResult:
    return CommandResult("x", rc, stdout, stderr, 0.0)


def test_apt_install_updates_once_checks_availability_and_installs_holding() -> None:
    conn = FakeConnection([(lambda c: c.startswith("apt-cache madison"), result(0, MADISON))])
    ctx = ctx_for(conn)
    step = apt.AptInstall({"libnccl2": "2.21.5-1+cuda12.4", "libnccl-dev": "2.21.5-1+cuda12.4"})
    assert step.describe() == ("apt-get install libnccl2=2.21.5-1+cuda12.4 "
                               "libnccl-dev=2.21.5-1+cuda12.4")
    step.apply(ctx)
    step.apply(ctx)
    update, madison, install = conn.commands[:3]
    assert "apt-get -q -y -o DPkg::Lock::Timeout=60" in update
    assert update.endswith(" update 2>&1); rc=$?\n  [ $rc -eq 0 ] && exit 0\n"
                           "  if printf '%s' \"$out\" | grep -q -e 'Could not get lock' -e "
                           "'Unable to lock'; then\n    if [ \"$(date +%s)\" -lt \"$deadline\" ]; "
                           "then sleep 2; continue; fi\n  fi\n  printf '%s\\n' \"$out\" >&2\n"
                           "  exit $rc\ndone")
    assert madison == "apt-cache madison libnccl2 libnccl-dev"
    assert install == (
        "apt-mark unhold libnccl2 libnccl-dev >/dev/null; DEBIAN_FRONTEND=noninteractive "
        "NEEDRESTART_MODE=a apt-get -q -y -o DPkg::Lock::Timeout=60 "
        "-o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold "
        "--allow-downgrades install libnccl2=2.21.5-1+cuda12.4 "
        "libnccl-dev=2.21.5-1+cuda12.4; rc=$?; apt-mark hold libnccl2 libnccl-dev "
        ">/dev/null; exit $rc")
    # the second apply skips apt-get update (once per host and run)
    assert conn.commands[3:] == [madison, install]
    assert ctx.memo == {"apt_updated": True}


def test_apt_install_without_hold_does_not_hold_again() -> None:
    conn = FakeConnection([(lambda c: c.startswith("apt-cache madison"),
                            result(0, "a | 1.0-1 | file:/repo ./ Packages\n"))])
    apt.AptInstall({"a": "1.0-1"}, hold=False).apply(ctx_for(conn))
    assert conn.commands[-1].endswith("install a=1.0-1; rc=$?; exit $rc")


def test_apt_install_refuses_a_version_the_repositories_do_not_offer() -> None:
    conn = FakeConnection([(lambda c: c.startswith("apt-cache madison"), result(0, MADISON))])
    step = apt.AptInstall({"libnccl2": "2.22.3-1+cuda12.4", "libnccl-dev": "2.21.5-1+cuda12.4"})
    with pytest.raises(apt.PackageUnavailable, match=(
            r"^libnccl2=2\.22\.3-1\+cuda12\.4 is not available from the host's apt repositories "
            r"\(available: 2\.23\.4-1\+cuda12\.6, 2\.21\.5-1\+cuda12\.4\)$")):
        step.apply(ctx_for(conn))
    assert not any("install" in c and "apt-mark" in c for c in conn.commands)


def test_apt_install_unknown_package_lists_none() -> None:
    conn = FakeConnection([(lambda c: c.startswith("apt-cache madison"),
                            result(0, "N: Unable to locate package nope\n"))])
    with pytest.raises(apt.PackageUnavailable, match=r"\(available: none\)$"):
        apt.AptInstall({"nope": "1.0"}).apply(ctx_for(conn))


def test_apt_install_lock_and_failure_messages() -> None:
    lock = "E: Could not get lock /var/lib/dpkg/lock-frontend. It is held by process 4242"
    conn = FakeConnection([
        (lambda c: c.startswith("apt-cache madison"),
         result(0, "a | 1.0-1 | file:/repo ./ Packages\n")),
        (lambda c: c.startswith("apt-mark unhold"), result(100, "", lock + "\n")),
    ])
    with pytest.raises(GpufleetError, match=(
            r"^apt/dpkg lock still held by another process after 60s: E: Could not get lock")):
        apt.AptInstall({"a": "1.0-1"}).apply(ctx_for(conn))
    conn = FakeConnection([
        (lambda c: c.startswith("apt-cache madison"),
         result(0, "a | 1.0-1 | file:/repo ./ Packages\n")),
        (lambda c: c.startswith("apt-mark unhold"),
         result(100, "", "E: Sub-process /usr/bin/dpkg returned an error code (1)\n")),
    ])
    with pytest.raises(GpufleetError, match=(
            r"^apt-get install a=1\.0-1 failed: E: Sub-process /usr/bin/dpkg returned an "
            r"error code \(1\)$")):
        apt.AptInstall({"a": "1.0-1"}).apply(ctx_for(conn))


def test_apt_update_failure() -> None:
    conn = FakeConnection([(lambda c: "update 2>&1" in c,
                            result(100, "", "E: The repository 'x' is not signed.\n"))])
    ctx = ctx_for(conn)
    with pytest.raises(GpufleetError, match=r"^apt-get update failed: E: The repository 'x' is "
                                            r"not signed\.$"):
        apt.apt_update(ctx)
    assert ctx.memo == {}
