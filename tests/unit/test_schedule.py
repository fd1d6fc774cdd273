"""The nightly drift schedule: systemd units, or a cron line without systemd."""

from __future__ import annotations

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
