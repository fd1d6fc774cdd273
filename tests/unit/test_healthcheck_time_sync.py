"""gpufleet-healthcheck's time_sync check: its copy of the chronyc and timesyncd readers held
to gpufleet's own on the same real captures, its bound the slurm_healthcheck role's, and the
program run against stand-in time tools."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufleet import roles
from gpufleet.errors import VarError
from gpufleet.facts.parsers import timesync
from gpufleet.node import healthcheck as program
from gpufleet.provision.role import RoleVars
from gpufleet.roles import slurm_healthcheck
from tests.conftest import FIXTURES
from tests.unit.test_roles_plan import inventory
from tests.unit.test_slurm_healthcheck import Node, _lines, _script

PUBLISHED = FIXTURES / "published"
CHRONY = sorted(PUBLISHED.glob("chronyc-*tracking-*.txt"))


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    stand_ins = Node(tmp_path)
    yield stand_ins
    stand_ins.close()


def test_the_bound_is_the_roles_and_the_suites() -> None:
    assert program.DEFAULTS["time_max_offset_ms"] == slurm_healthcheck.TIME_MAX_OFFSET_MS == 100
    assert program.DEFAULTS["time_max_offset_ms"] == \
        roles.clock_settings()["time_max_offset_ms"].default


@pytest.mark.parametrize("capture", [p for p in CHRONY if "no-daemon" not in p.name],
                         ids=lambda p: p.name)
def test_the_programs_chronyc_reader_is_gpufleets(capture: Path) -> None:
    lines = capture.read_text().splitlines()
    output = "\n".join(lines[next(i for i, line in enumerate(lines)
                                  if line.startswith("Reference ID")):])
    ours = timesync.chronyc_tracking(output)
    assert program.parse_chronyc_tracking(capture.read_text()) == (
        ours["synchronised"], ours["offset_s"])


def test_the_programs_timesync_reader_is_gpufleets() -> None:
    text = (PUBLISHED / "timedatectl-timesync-status-245.6-debian-systemd-16492.txt").read_text()
    assert program.parse_timesync_offset(text) == timesync.timesync_status(text)["offset_s"]
    for span in ("+1.024ms", "-1min 3.5s", "+52us"):
        assert program.parse_timesync_offset(f"Offset: {span}\n") == pytest.approx(
            timesync.timespan_s(span))
    assert program.parse_timesync_offset("       Server: n/a\n") is None
    with pytest.raises(ValueError, match="not a time span"):
        program.parse_timesync_offset("Offset: soon\n")
    with pytest.raises(ValueError, match="506 Cannot talk to daemon"):
        program.parse_chronyc_tracking(
            (PUBLISHED / "chronyc-n-tracking-4.3-debian12-no-daemon.txt").read_text())


@pytest.mark.parametrize(("clock", "bound", "line"), [
    (("chrony", True, 0.0000027), 100, "PASS time_sync: +0.003 ms (chrony), within 100 ms"),
    (("chrony", True, -7.810536861), 100,
     "FAIL time_sync: -7810.537 ms (chrony), beyond 100 ms"),
    (("chrony", False, 0.0), 100, "FAIL time_sync: not synchronised (chrony)"),
    (("systemd", True, None), 100,
     "FAIL time_sync: synchronised (systemd), with no offset to hold to 100 ms"),
    (("systemd", True, None), None, "PASS time_sync: synchronised (systemd)"),
    (("systemd-timesyncd", True, -1.087495), 2000,
     "PASS time_sync: -1087.495 ms (systemd-timesyncd), within 2000 ms"),
])
def test_the_verdict(clock: tuple[str, bool, float | None], bound: float | None,
                     line: str) -> None:
    assert program.time_verdict(*clock, bound).line() == line


def test_the_program_fails_a_node_chrony_cannot_steer(node: Node) -> None:
    _script(node.bin, "chronyc", f"cat {PUBLISHED / 'chronyc-tracking-omnios-2576.txt'}\n")
    proc = node.run()
    assert proc.returncode == 1
    assert _lines(proc)["time_sync"] == "FAIL time_sync: -7810.537 ms (chrony), beyond 100 ms"
    _script(node.bin, "chronyc",
            f"cat {PUBLISHED / 'chronyc-n-tracking-4.3-debian12-unsynchronised.txt'}\n")
    assert _lines(node.run())["time_sync"] == "FAIL time_sync: not synchronised (chrony)"


def test_the_bound_comes_from_the_configuration(node: Node) -> None:
    _script(node.bin, "chronyc", f"cat {PUBLISHED / 'chronyc-tracking-omnios-2576.txt'}\n")
    node.write_config(gpu_count=1, time_max_offset_ms=10000)
    assert _lines(node.run())["time_sync"] == \
        "PASS time_sync: -7810.537 ms (chrony), within 10000 ms"
    node.write_config(gpu_count=1, time_max_offset_ms=None)
    assert _lines(node.run())["time_sync"] == "PASS time_sync: synchronised (chrony)"
    node.write_config(gpu_count=1, time_max_offset_ms="soon")
    assert _lines(node.run())["time_sync"] == (
        "FAIL time_sync: time_max_offset_ms must be milliseconds above 0 or null, got 'soon'")


@pytest.mark.skipif(Path(program.SYSTEMD_DIR).is_dir(), reason="systemd runs here")
def test_a_node_with_no_time_service_to_ask_is_skipped(node: Node) -> None:
    _script(node.bin, "chronyc", "echo '506 Cannot talk to daemon'; exit 1\n")
    assert _lines(node.run())["time_sync"] == (
        "SKIP time_sync: no time service answers (chronyc: 506 Cannot talk to daemon; systemd "
        "does not run)")


def test_the_role_writes_the_bound_and_refuses_a_bad_one(tmp_path: Path) -> None:
    role = slurm_healthcheck.ROLE
    for text, bound in (("", 100), ("time_max_offset_ms: 250\n", 250),
                        ("time_check_offset: false\n", None)):
        inv = inventory(tmp_path, "slurm_healthcheck: true\n" + text)
        v = RoleVars(inv.hosts["gpu01"], role.defaults)
        assert json.loads(role.config(v))["time_max_offset_ms"] == bound
    inv = inventory(tmp_path, "slurm_healthcheck: true\ntime_max_offset_ms: 0\n")
    with pytest.raises(VarError, match="time_max_offset_ms must be a number of milliseconds "
                                       "above 0, got 0"):
        role.check(RoleVars(inv.hosts["gpu01"], role.defaults))
