"""The nightly drift schedule: systemd units, or a cron line without systemd."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from gpufleet import app
from gpufleet.drift import schedule
from gpufleet.errors import GpufleetError

ARGS = ["--inventory", "/srv/inventories/prod", "--prometheus",
        "/var/lib/node_exporter/drift.prom"]
PROGRAM = ("/opt/gpufleet/bin/python", "-m", "gpufleet")


def test_without_systemd_the_cron_line_is_printed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(app, "SYSTEMD_RUNNING", tmp_path / "no-systemd")
    assert app.schedule_cmd(schedule.Schedule(Path("/srv/project"), ARGS, "02:30", PROGRAM)) == 0
    out = capsys.readouterr().out.replace("\n", "")
    assert "systemd is not running" in out
    assert ("30 2 * * * root cd /srv/project && /opt/gpufleet/bin/python -m gpufleet "
            "drift --inventory /srv/inventories/prod --prometheus "
            "/var/lib/node_exporter/drift.prom >> /srv/project/reports/drift/cron.log 2>&1") in out


def test_units_are_written_where_asked(tmp_path: Path) -> None:
    assert app.schedule_cmd(schedule.Schedule(Path("/srv/project"), ARGS, "03:05", PROGRAM),
                            str(tmp_path)) == 0
    timer = (tmp_path / "gpufleet-drift.timer").read_text()
    service = (tmp_path / "gpufleet-drift.service").read_text()
    assert "OnCalendar=*-*-* 03:05:00" in timer and "Persistent=true" in timer
    assert ("ExecStart=/opt/gpufleet/bin/python -m gpufleet drift --inventory "
            "/srv/inventories/prod --prometheus /var/lib/node_exporter/drift.prom") in service
    assert "SuccessExitStatus=1 3" in service


@pytest.mark.parametrize("at", ["2:30", "24:00", "02:60", "noon"])
def test_a_bad_time_is_refused(at: str) -> None:
    with pytest.raises(GpufleetError, match="--at must be HH:MM"):
        schedule.Schedule(Path("/srv/project"), ARGS, at)


def test_the_start_timeout_follows_the_runs_own_budget() -> None:
    assert schedule.Schedule.start_timeout(None, remediate=False) == 900 + 600
    assert schedule.Schedule.start_timeout(None, remediate=True) == 900 + 7200 + 600
    assert schedule.Schedule.start_timeout(1200, remediate=True) == 1200 + 1200 + 600


def test_the_service_is_verified_and_hardened_by_systemd_itself(tmp_path: Path) -> None:
    """systemd-analyze verify has nothing to say about the service, and its own security
    analysis rates it at most 3.0 ("OK") with the directories it writes left writable."""
    work, textfiles = tmp_path / "ops", tmp_path / "textfile"
    work.mkdir()
    textfiles.mkdir()
    plan = schedule.Schedule(work, ["--inventory", "/srv/inventories/prod", "--prometheus",
                                    str(textfiles / "gpufleet.prom")], "02:30",
                             timeout_s=schedule.Schedule.start_timeout(None, False),
                             writes=(textfiles,))
    assert app.schedule_cmd(plan, str(tmp_path / "units")) == 0
    service = tmp_path / "units" / "gpufleet-drift.service"
    text = service.read_text()
    assert "TimeoutStartSec=1500\n" in text
    assert f"ReadWritePaths={work} {textfiles}\n" in text
    verify = subprocess.run(["systemd-analyze", "verify", "--man=no", str(service)],
                            capture_output=True, text=True, timeout=60, check=False)
    assert (verify.returncode, verify.stdout + verify.stderr) == (0, "")
    security = subprocess.run(["systemd-analyze", "security", "--offline=true",
                               "--threshold=30", str(service)],
                              capture_output=True, text=True, timeout=60, check=False)
    assert security.returncode == 0, security.stdout + security.stderr
    [overall] = [line for line in security.stdout.splitlines() if "Overall exposure" in line]
    assert float(overall.split(": ")[1].split()[0]) <= 3.0, overall


@pytest.mark.parametrize("path", ["relative/dir", "/srv/with space"])
def test_paths_a_unit_cannot_hold_are_refused(path: str) -> None:
    with pytest.raises(GpufleetError, match="the nightly unit needs absolute paths"):
        schedule.Schedule(Path("/srv/ops"), [], "02:30", writes=(Path(path),))
