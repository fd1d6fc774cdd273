"""NVIDIA Xid events in the kernel log (dmesg, ``dmesg -T``, journal and syslog lines)."""

from __future__ import annotations

import re
from typing import Any

from gpufleet.facts.parsers._capture import _error, _lines

_XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?([0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)\):"
    r"\s*(\d+),\s*(.*?)\s*$"
)
_XID_MARK = "NVRM: Xid"
_XID_CONTEXT = re.compile(r"^(?:pid=[^,]*,\s*)?(?:name=[^,]*,\s*)?")
_LOG_TOOL_ERROR = re.compile(r"^(?:dmesg|journalctl): ")


_DMESG_TIME = re.compile(r"\[\s*(\d+\.\d+)\]")


def xid_events(text: str) -> list[dict[str, Any]]:
    """Extract ``NVRM: Xid`` events from kernel log text (dmesg or journal format).

    Each event is ``pci`` ("0000:3b:00"), ``xid`` (int), ``message`` (the text after
    the pid/name fields) and ``at`` (seconds since boot from dmesg's ``[ 123.456]``, also
    after a syslog prefix; None in other formats, such as ``dmesg -T``). A dmesg/journalctl
    error (e.g. no permission to read the log) raises, since an unreadable log is not an
    empty one, and so does an ``NVRM: Xid`` line that cannot be read: the event may be a
    critical one.
    """
    events: list[dict[str, Any]] = []
    for line in _lines(text):
        if _LOG_TOOL_ERROR.match(line.strip()):
            raise _error("kernel log", "kernel log lines", line)
        if _XID_MARK in line and not (match := _XID.search(line)):
            raise _error("kernel log", "'NVRM: Xid (PCI:DDDD:BB:DD): N, ...' lines", line)
        if match := _XID.search(line):
            stamp = _DMESG_TIME.search(line[: match.start()])
            events.append(
                {
                    "pci": match.group(1).lower(),
                    "xid": int(match.group(2)),
                    "message": _XID_CONTEXT.sub("", match.group(3)),
                    "at": float(stamp.group(1)) if stamp else None,
                }
            )
    return events
