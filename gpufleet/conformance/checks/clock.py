"""The clock's verdict from the ``time_sync`` fact: chronyd's report, else systemd's
synchronised flag and systemd-timesyncd's last offset.

Slurm's munge credentials are refused once the clocks of the node that made them and the
node that reads them differ by more than their lifetime (300 s by default); training logs,
NCCL's and torch's timeouts and every cross-node timing need them far closer, so the bound
(``time_max_offset_ms``) is 100 ms by default: a clock further than that from its source is
not being kept, whatever daemon runs.
"""

from __future__ import annotations

from typing import Any

from gpufleet.facts.catalog import Fact
from gpufleet.facts.parsers import timesync

TIMESYNC = Fact(
    "timesync_status",
    "[ -d /run/systemd/timesync ] || { echo 'systemd-timesyncd does not run on this host'; "
    "exit 127; }; timedatectl timesync-status", timesync.timesync_status, "timedatectl")
"""systemd-timesyncd's last exchange with its server (its offset): the clock suite's own
fact, where systemd's synchronised flag is all ``time_sync`` has."""


def clock_problem(value: dict[str, Any] | None, why_absent: str,
                  timesyncd: dict[str, Any] | None, max_offset_ms: float | None) -> str | None:
    """Why the node's clock fails (None when it passes): unknown (no source answered), not
    synchronised, or further than ``max_offset_ms`` from its source (None: synchronised
    is enough, as ``time_check_offset: false`` asks). ``timesyncd`` (the TIMESYNC fact)
    gives the offset where systemd's flag is the source."""
    if value is None:
        return f"unknown: {why_absent}"
    if value["source"] == "systemd" and timesyncd is not None:
        value = {**value, "source": "systemd-timesyncd", "offset_s": timesyncd["offset_s"],
                 "server": timesyncd["server"]}
    source = value["source"] + (f" from {value['server']}" if value.get("server") else "")
    if not value["synchronised"]:
        return f"not synchronised ({source})"
    if max_offset_ms is None:
        return None
    offset = value["offset_s"]
    if offset is None:
        return (f"unknown: the offset: {source} reports the clock synchronised but no "
                "offset (time_check_offset: false checks synchronisation alone)")
    if abs(offset) * 1000 > max_offset_ms:
        return (f"{offset * 1000:+.1f} ms off ({source}), beyond time_max_offset_ms "
                f"{max_offset_ms:g}")
    return None
