"""The clock suite: its declaration (in the conformance set, its bound the health check's)
and its verdict on the time_sync fact read from real captures."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet import roles
from gpufleet.conformance import registry
from gpufleet.conformance.checks.clock import TIMESYNC, clock_problem
from gpufleet.conformance.suites.clock import ClockSettings
from gpufleet.errors import VarError
from gpufleet.facts import formats
from tests.conftest import FIXTURES
from tests.unit.test_roles_plan import inventory

PUBLISHED = FIXTURES / "published"


def _chrony(name: str) -> dict[str, object]:
    lines = (PUBLISHED / name).read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Reference ID"))
    return formats.time_sync("@chronyc\n" + "\n".join(lines[start:]) + "\n")


def test_the_suite_is_in_the_conformance_set_with_the_health_checks_bound() -> None:
    suite = registry.suite("clock")
    assert "clock" in registry.members_of("conformance")
    assert suite.variables == roles.clock_settings()
    assert suite.required_when is None  # bootstrap's preflight checks the clock itself
    assert suite.facts is not None
    assert suite.facts(None).custom == {TIMESYNC}  # type: ignore[arg-type]


@pytest.mark.parametrize(("name", "bound", "problem"), [
    ("chronyc-n-tracking-4.3-debian12-loopback-server.txt", 100, None),
    ("chronyc-tracking-scale-network-121.txt", 100, None),
    ("chronyc-n-tracking-4.3-debian12-unsynchronised.txt", 100,
     "not synchronised (chrony from 00000000 ())"),
    ("chronyc-tracking-omnios-2576.txt", 100,
     "-7810.5 ms off (chrony from D9723B42 (ns0.luns.net.uk)), beyond time_max_offset_ms 100"),
    ("chronyc-tracking-omnios-2576.txt", 10000, None),
    ("chronyc-tracking-omnios-2576.txt", None, None),
])
def test_chrony(name: str, bound: float | None, problem: str | None) -> None:
    assert clock_problem(_chrony(name), "", None, bound) == problem


def test_systemd_and_no_source_at_all() -> None:
    flag = formats.time_sync("@timedatectl\nNTPSynchronized=yes\nNTP=yes\n")
    timesyncd = TIMESYNC.parse(
        (PUBLISHED / "timedatectl-timesync-status-245.6-debian-systemd-16492.txt").read_text())
    assert clock_problem(flag, "", timesyncd, 100) == (
        "-1087.5 ms off (systemd-timesyncd from (null) (3.debian.pool.ntp.org)), beyond "
        "time_max_offset_ms 100")
    assert clock_problem(flag, "", None, 100) == (
        "unknown: the offset: systemd reports the clock synchronised but no offset "
        "(time_check_offset: false checks synchronisation alone)")
    assert clock_problem(flag, "", None, None) is None
    unsynchronised = formats.time_sync("@timedatectl\nNTPSynchronized=no\nNTP=yes\n")
    assert clock_problem(unsynchronised, "", timesyncd, 100) == (
        "not synchronised (systemd-timesyncd from (null) (3.debian.pool.ntp.org))")
    assert clock_problem(None, "no chronyd answers and systemd does not run on this host",
                         None, 100) == (
        "unknown: no chronyd answers and systemd does not run on this host")


def test_the_bound_is_checked_before_any_host(tmp_path: Path) -> None:
    suite = registry.suite("clock")
    for text, bound, check in (("", 100, True), ("time_max_offset_ms: 5\n", 5, True),
                               ("time_check_offset: false\n", 100, False)):
        settings = ClockSettings.read(inventory(tmp_path, text).hosts["gpu01"])
        assert (settings.time_max_offset_ms, settings.time_check_offset) == (bound, check)
    host = inventory(tmp_path, "time_max_offset_ms: -1\n").hosts["gpu01"]
    assert suite.check is not None
    with pytest.raises(VarError, match="time_max_offset_ms must be a number of milliseconds"):
        suite.check(suite.vars(host))
