"""The ``watch`` command: silence one standing-watch finding on the selected nodes until a
time, or lift that silence, by running ``gpufleet-watch silence|unsilence`` on each node
over the fleet's connections.

The watch on the node keeps the silences (``STATE_DIR/watch-silences.json``) and reports a
silenced finding as ``silenced``: it no longer drains the node, and drift, conformance and
``facts`` show it with its end and reason from the watch's next report. Every value is
checked for its syntax here, before any host is contacted (a bad one is a usage error), and
quoted for the shell it lands in.
"""

from __future__ import annotations

import re
import shlex
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from gpufleet import roles as role_registry
from gpufleet.connect.connection import Connection
from gpufleet.connect.fleet import FleetOptions, Outcome, ProgressSink, TaskResult, run_fleet
from gpufleet.errors import GpufleetError
from gpufleet.inventory.model import Host
from gpufleet.report.jsonfile import utc
from gpufleet.roles import WatchSetup

ACTIONS = ("silence", "unsilence")
FINDING = re.compile(r"[A-Za-z0-9_./:][A-Za-z0-9_./:-]{0,199}\Z")
"""A finding id as the watch writes it (``rdma/mlx5_0/1/symbol_error``); not starting with
``-``, which the program would take for an option."""
MOST_AHEAD_S = 366 * 86400
"""The farthest end of a silence: a year (an end in milliseconds is a typo, not a choice)."""
REASON_LIMIT = 200
COMMAND_TIMEOUT_S = 30.0
_UNIX = re.compile(r"\d+(\.\d+)?\Z")
_LAST = 253402300799  # 9999-12-31T23:59:59Z, the last time the reports can write
_AHEAD = re.compile(r"\+(\d{1,6})([smhdw])\Z")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


class WatchUsage(GpufleetError):
    """A value of the watch command that cannot be used (exit 2, before any host)."""


@dataclass(frozen=True)
class Silence:
    """What to do on each node: ``silence`` a finding until a Unix time (with a reason), or
    ``unsilence`` it."""

    action: str
    finding: str
    until: int | None = None
    reason: str | None = None

    def command(self, setup: WatchSetup) -> str:
        """The node's command line, every word quoted for its shell."""
        words = [setup.program, self.action, self.finding]
        if self.until is not None:
            words += ["--until", str(self.until)]
        if self.reason is not None:
            words += ["--reason", self.reason]
        return shlex.join([*words, "--config", setup.config])

    def describe(self) -> str:
        """``silence rdma/mlx5_0/1/symbol_error until 2025-12-10T18:00:00Z (cable swap)``."""
        if self.until is None:
            return f"{self.action} {self.finding}"
        return f"{self.action} {self.finding} until {utc(self.until)}" + (
            f" ({self.reason})" if self.reason else "")


def parse_until(text: str, now: float) -> int:
    """``--until`` as a Unix time: Unix seconds, ``+N`` with a unit (``s m h d w``:
    ``+12h``), or an ISO 8601 time with its zone (``2025-12-10T18:00Z``,
    ``2025-12-10T19:00+01:00``); in the future, at most a year ahead."""
    value = text.strip()
    if _UNIX.match(value):
        until = float(value)
    elif match := _AHEAD.match(value):
        until = now + int(match[1]) * _UNITS[match[2]]
    else:
        try:
            when = datetime.fromisoformat(value)
        except ValueError:
            raise WatchUsage(f"--until must be a time: Unix seconds, +N with s, m, h, d or w "
                             f"(+12h), or ISO 8601 with its zone (2025-12-10T18:00Z), got "
                             f"{text!r}") from None
        if when.tzinfo is None:
            raise WatchUsage(f"--until {text!r} has no time zone: add Z (UTC) or an offset "
                             "(+01:00)")
        until = when.timestamp()
    if until > now + MOST_AHEAD_S:
        shown = utc(until) if until <= _LAST else "after the year 9999"
        raise WatchUsage(f"--until {text!r} is more than a year ahead ({shown})")
    if until <= now:
        raise WatchUsage(f"--until {text!r} is in the past ({utc(until)})")
    return int(until)


def plan(action: str, finding: str | None, until: str | None, reason: str | None,
         now: float) -> Silence:
    """The command's values checked for their syntax (WatchUsage naming the flag)."""
    if action not in ACTIONS:
        raise WatchUsage(f"watch: the action must be silence or unsilence, got {action!r}")
    if not finding:
        raise WatchUsage(f"watch {action} needs --finding ID (an id its report names, as "
                         "gpufleet facts shows it)")
    if not FINDING.match(finding):
        raise WatchUsage(f"--finding must be a finding id of letters, digits and _ . / : - "
                         f"(not starting with -, at most 200), got {finding!r}")
    if action == "unsilence":
        if until is not None or reason is not None:
            raise WatchUsage("--until and --reason go with watch silence")
        return Silence(action, finding)
    if until is None:
        raise WatchUsage("watch silence needs --until TIME (Unix seconds, +12h, or ISO 8601 "
                         "with its zone)")
    if reason is not None and (not reason.strip() or len(reason) > REASON_LIMIT or any(
            unicodedata.category(c).startswith("C") for c in reason)):
        raise WatchUsage(f"--reason must be one line of text of at most {REASON_LIMIT} "
                         f"characters, without control characters, got {reason!r}")
    return Silence(action, finding, parse_until(until, now), reason)


def setups(hosts: Sequence[Host]) -> dict[str, WatchSetup]:
    """Each host's watch (program, configuration); a host without the watch, or with a path
    the role cannot use, is an error before any host is contacted."""
    found: dict[str, WatchSetup] = {}
    missing: list[str] = []
    for host in hosts:
        setup = role_registry.watch_setup(host)
        if setup is None:
            missing.append(host.name)
        else:
            found[host.name] = setup
    if missing:
        raise WatchUsage(f"the watch is not in use on {', '.join(missing)} (slurm_healthcheck "
                         "is off there, or node_watch is false): nothing to silence")
    return found


def run(hosts: Sequence[Host], silence: Silence, where: dict[str, WatchSetup],
        options: FleetOptions, progress: ProgressSink | None = None
        ) -> dict[str, Outcome[str]]:
    """``gpufleet-watch silence|unsilence`` on every host; each host's outcome carries the
    program's last line (its failure when it exits non-zero)."""
    def task(host: Host, conn: Connection) -> TaskResult[str]:
        result = conn.run(silence.command(where[host.name]), timeout=COMMAND_TIMEOUT_S)
        said = (result.stdout.strip() or result.stderr.strip()).splitlines()
        last = said[-1] if said else f"exit status {result.rc}"
        if result.rc != 0:
            return TaskResult(last, failed=f"gpufleet-watch {silence.action} exited "
                                           f"{result.rc}: {last}")
        return TaskResult(last, changed=True)

    return run_fleet(hosts, task, options, progress)
