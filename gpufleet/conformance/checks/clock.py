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


def clock_problem(value: dict[str, Any] | None, why_absent: str,
                  max_offset_ms: float | None) -> str | None:
    """Why the node's clock fails (None when it passes): unknown (no source answered), not
    synchronised, or further than ``max_offset_ms`` from its source (None: synchronised
    is enough, as ``time_check_offset: false`` asks)."""
    if value is None:
        return f"unknown: {why_absent}"
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
