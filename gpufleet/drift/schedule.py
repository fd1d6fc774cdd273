"""Nightly drift: a systemd timer and service on the controller, or a cron line.

The service runs under a start timeout derived from the run's own budget (so a hung run
cannot block the nights after it) and is hardened as far as an SSH client that only reads
its key and writes its reports can be: no privileges or capabilities, a read-only system
and home except the directories it writes, private /tmp and devices, no kernel or
namespace changes, the system calls of an ordinary service.
"""

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
DRIFT_TIMEOUT_S = 900.0
PROVISION_TIMEOUT_S = 7200.0
MARGIN_S = 600.0
HARDENING = (
    "NoNewPrivileges=yes", "CapabilityBoundingSet=", "ProtectSystem=strict",
    "ProtectHome=read-only", "PrivateTmp=yes", "PrivateDevices=yes",
    "ProtectKernelTunables=yes", "ProtectKernelModules=yes", "ProtectKernelLogs=yes",
    "ProtectControlGroups=yes", "ProtectClock=yes", "ProtectHostname=yes",
    "RestrictSUIDSGID=yes", "RestrictRealtime=yes", "RestrictNamespaces=yes",
    "LockPersonality=yes", "SystemCallArchitectures=native",
    "SystemCallFilter=@system-service", "SystemCallFilter=~@privileged @resources",
    "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6", "PrivateMounts=yes",
    "ProtectProc=invisible", "UMask=0027",
)
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
    timeout_s: float = DRIFT_TIMEOUT_S + MARGIN_S
    writes: tuple[Path, ...] = ()

    def __post_init__(self) -> None:
        if not re.fullmatch(r"([01]\d|2[0-3]):[0-5]\d", self.at):
            raise GpufleetError(f"--at must be HH:MM (24-hour), got {self.at!r}")
        for path in (self.workdir, *self.writes):
            if not path.is_absolute() or any(c.isspace() or c in "\"'\\" for c in str(path)):
                raise GpufleetError(f"{path}: the nightly unit needs absolute paths without "
                                    "spaces or quotes for what it writes")

    @staticmethod
    def start_timeout(host_timeout: float | None, remediate: bool) -> float:
        """The unit's TimeoutStartSec: the drift run's per-host budget (``--timeout``, else
        drift's default), a provisioning run's too with ``--remediate``, and a margin for
        gathering, reports and the scheduler."""
        drift = host_timeout or DRIFT_TIMEOUT_S
        remediation = (host_timeout or PROVISION_TIMEOUT_S) if remediate else 0.0
        return drift + remediation + MARGIN_S

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
            f"WorkingDirectory={_unit_path(self.workdir)}",
            f"ExecStart={self.unit_command}",
            "# exit 1 = drift found, 3 = unreachable hosts: the run itself succeeded; 2 (bad",
            "# input) and 70 (internal error) fail the unit",
            "SuccessExitStatus=1 3",
            "# the run's own budget and a margin: a hung run never blocks the next night",
            f"TimeoutStartSec={int(self.timeout_s)}",
            *HARDENING,
            "ReadWritePaths=" + " ".join(_unit_path(p) for p in
                                         dict.fromkeys((self.workdir, *self.writes))),
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


def _unit_path(path: Path) -> str:
    return str(path).replace("%", "%%")


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
