"""The TCP ports distributed training needs: torchrun's rendezvous port and the range NCCL's
ephemeral ports come from, their defaults, and port ranges as text and as intervals.

This is the one home of that knowledge: the firewall and NCCL roles, the reachability,
firewall and AllReduce suites and the reports read it here. The node health check imports
nothing from gpufleet; its role writes the range into the check's configuration.
"""

from __future__ import annotations

import re

from gpufleet.errors import VarError

RENDEZVOUS_PORT = 29500
PORT_RANGE = "49152-65535"
Interval = tuple[int, int]


class PortRangeError(VarError):
    """A port range variable that is not ``LOW-HIGH`` within 1-65535."""


def parse_range(text: object, host: str, key: str) -> Interval:
    """(low, high) from ``49152-65535``, ``49152 65535`` or ``49152:65535``; the error names
    the host and the variable."""
    parts = re.split(r"[-\s:]+", str(text).strip())
    try:
        low, high = (int(p) for p in parts)
    except ValueError:
        raise PortRangeError(f"host {host}: {key} must be a port range like {PORT_RANGE}, "
                             f"got {text!r}") from None
    if not 1 <= low <= high <= 65535:
        raise PortRangeError(f"host {host}: {key} {text!r} is not a valid port range")
    return low, high


def merge(intervals: list[Interval]) -> list[Interval]:
    """Sorted, with overlapping and adjacent intervals joined."""
    joined: list[Interval] = []
    for low, high in sorted(intervals):
        if joined and low <= joined[-1][1] + 1:
            joined[-1] = (joined[-1][0], max(high, joined[-1][1]))
        else:
            joined.append((low, high))
    return joined


def closed_within(opened: list[Interval], low: int, high: int) -> list[Interval]:
    """The stretches of ``low``-``high`` that no opened interval covers."""
    closed: list[Interval] = []
    cursor = low
    for first, last in merge(opened):
        if last < cursor:
            continue
        if first > high:
            break
        if first > cursor:
            closed.append((cursor, first - 1))
        cursor = max(cursor, last + 1)
    if cursor <= high:
        closed.append((cursor, high))
    return closed


def describe(intervals: list[Interval]) -> str:
    """``29500, 49152-65535``."""
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in intervals) or "none"
