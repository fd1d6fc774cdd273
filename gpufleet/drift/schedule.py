"""Nightly drift: a systemd timer and service on the controller, or a cron line."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from gpufleet.errors import GpufleetError
from gpufleet.report.outputs import local_put

UNIT = "gpufleet-drift"
CRON_PERCENT = "\\%"
SYSTEMD_RUNNING = Path("/run/systemd/system")


@dataclass(frozen=True)
class Schedule:
    """What to run every night (``drift`` with ``drift_args``, by ``program``: the
    interpreter and ``-m gpufleet`` of the installation that scheduled it), from which
    directory (relative report paths are read against it), and when."""

    workdir: Path
    drift_args: list[str]
    at: str = "02:30"
    program: tuple[str, ...] = (sys.executable, "-m", "gpufleet")

    def __post_init__(self) -> None:
        if not re.fullmatch(r"([01]\d|2[0-3]):[0-5]\d", self.at):
            raise GpufleetError(f"--at must be HH:MM (24-hour), got {self.at!r}")

    @property
    def command(self) -> str:
        return shlex.join([*self.program, "drift", *self.drift_args])

    @property
    def unit_command(self) -> str:
        """The command as a unit file's ExecStart= needs it: systemd expands ``%``
        specifiers and ``$`` variables there, so both are doubled."""
        return self.command.replace("%", "%%").replace("$", "$$")

    def units(self) -> dict[str, str]:
        """The service and timer unit files."""
        service = "\n".join([
            "[Unit]",
            "Description=gpufleet nightly drift check",
            "Wants=network-online.target",
            "After=network-online.target",
            "",
            "[Service]",
            "Type=oneshot",
            f"WorkingDirectory={str(self.workdir).replace('%', '%%')}",
            f"ExecStart={self.unit_command}",
            "# exit 1 = drift found, 3 = unreachable hosts: the run itself succeeded; 2 (bad",
            "# input) and 70 (internal error) fail the unit",
            "SuccessExitStatus=1 3",
            "",
        ])
        timer = "\n".join([
            "[Unit]",
            "Description=gpufleet nightly drift check",
            "",
            "[Timer]",
            f"OnCalendar=*-*-* {self.at}:00",
            "RandomizedDelaySec=300",
            "Persistent=true",
            "",
            "[Install]",
            "WantedBy=timers.target",
            "",
        ])
        return {f"{UNIT}.service": service, f"{UNIT}.timer": timer}

    def cron_line(self) -> str:
        """An /etc/cron.d line for machines without systemd. cron ends the command at a
        ``%`` (the rest becomes its stdin), so every ``%`` is escaped as ``\\%``."""
        hour, minute = self.at.split(":")
        log = shlex.quote(str(self.workdir / "reports" / "drift" / "cron.log"))
        command = f"cd {shlex.quote(str(self.workdir))} && {self.command} >> {log} 2>&1"
        return f"{int(minute)} {int(hour)} * * * root {command.replace('%', CRON_PERCENT)}"


def install(schedule: Schedule, unit_dir: Path = Path("/etc/systemd/system")) -> list[str]:
    """Write the units and enable the timer when systemd runs; return what was done."""
    done = []
    for name, text in schedule.units().items():
        local_put(str(unit_dir / name), text.encode())
        done.append(f"wrote {unit_dir / name}")
    if SYSTEMD_RUNNING.is_dir() and unit_dir == Path("/etc/systemd/system"):
        for argv in (["systemctl", "daemon-reload"],
                     ["systemctl", "enable", "--now", f"{UNIT}.timer"]):
            proc = subprocess.run(argv, capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                raise GpufleetError(f"{' '.join(argv)} failed: {proc.stderr.strip()}")
            done.append(" ".join(argv))
    return done
