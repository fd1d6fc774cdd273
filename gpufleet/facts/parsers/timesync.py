"""The clock's synchronisation as the time daemons report it: ``chronyc tracking``
(chrony), ``timedatectl show`` (systemd's view of the kernel's synchronised flag) and
``timedatectl timesync-status`` (systemd-timesyncd's last exchange with its server)."""

from __future__ import annotations

import re
from typing import Any

from gpufleet.facts.parsers._capture import _error, _int, _output_lines

_FIELD = re.compile(r"^\s*([A-Za-z][A-Za-z ()]*?)\s*:\s?(.*)$")
_SYSTEM_TIME = re.compile(r"^(\d+(?:\.\d+)?) seconds (fast|slow) of NTP time$")
_REFERENCE = re.compile(r"^([0-9A-Fa-f]{1,8}|\d+(?:\.\d+){3}) ?(\(.*\))?$")
_PROPERTY = re.compile(r"^([A-Za-z][A-Za-z0-9]*)=(.*)$")
_SPAN = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|min|h|d)")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0,
           "h": 3600.0, "d": 86400.0}
NOT_SYNCHRONISED = "Not synchronised"


def _fields(source: str, text: str) -> dict[str, str]:
    """``Name : value`` lines by name (the first of each); any other line is an error."""
    fields: dict[str, str] = {}
    for line in _output_lines(text):
        match = _FIELD.match(line)
        if not match:
            raise _error(source, "'Name : value' lines", line)
        fields.setdefault(match.group(1), match.group(2).strip())
    return fields


def chronyc_tracking(text: str) -> dict[str, Any]:
    """Parse ``chronyc tracking``: ``synchronised`` (the leap status is not "Not
    synchronised"), ``offset_s`` (System time: how far the clock is ahead of NTP time,
    negative when it is behind), ``stratum``, ``reference`` and ``leap``."""
    fields = _fields("chronyc tracking", text)
    for name in ("System time", "Leap status"):
        if name not in fields:
            raise _error("chronyc tracking", f"a '{name} :' line", text)
    system = _SYSTEM_TIME.match(fields["System time"])
    if not system:
        raise _error("chronyc tracking", "'System time : N seconds fast|slow of NTP time'",
                     fields["System time"])
    offset = float(system.group(1)) * (1 if system.group(2) == "fast" else -1)
    leap = fields["Leap status"]
    if not leap:
        raise _error("chronyc tracking", "a leap status", "Leap status :")
    reference = fields.get("Reference ID")
    if reference is not None and not _REFERENCE.match(reference):
        raise _error("chronyc tracking", "'Reference ID : HEX (NAME)'", reference)
    stratum = fields.get("Stratum")
    return {"synchronised": leap != NOT_SYNCHRONISED, "offset_s": offset, "leap": leap,
            "reference": reference,
            "stratum": None if stratum is None else _int("chronyc tracking", stratum, stratum)}


def timedatectl_show(text: str) -> dict[str, str]:
    """Parse ``timedatectl show`` (``Name=value`` properties): the properties by name."""
    properties: dict[str, str] = {}
    for line in _output_lines(text):
        match = _PROPERTY.match(line.strip())
        if not match:
            raise _error("timedatectl show", "'Name=value' lines", line)
        properties[match.group(1)] = match.group(2)
    if not properties:
        raise _error("timedatectl show", "properties", text)
    return properties


def timespan_s(value: str) -> float:
    """A span as systemd prints it (``+1.024ms``, ``-1.087495s``, ``-1min 3.5s``) in
    seconds; the sign applies to the whole span."""
    text = value.strip()
    sign = -1.0 if text.startswith("-") else 1.0
    body = text.lstrip("+-").replace(" ", "")
    parts = _SPAN.findall(body)
    if not body or "".join(n + u for n, u in parts) != body:
        raise _error("timedatectl timesync-status", "a time span (+1.024ms)", value)
    return sign * sum(float(n) * _UNIT_S[u] for n, u in parts)


def timesync_status(text: str) -> dict[str, Any]:
    """Parse ``timedatectl timesync-status``: the ``server``, ``leap``, ``offset_s`` (how far
    the clock was from the server's time at the last exchange: None before the first one),
    ``delay_s``, ``jitter_s`` and ``packet_count``."""
    fields = _fields("timedatectl timesync-status", text)
    if "Server" not in fields:
        raise _error("timedatectl timesync-status", "a 'Server:' line", text)

    def span(name: str) -> float | None:
        return timespan_s(fields[name]) if name in fields else None

    count = fields.get("Packet count")
    return {"server": fields["Server"], "leap": fields.get("Leap"),
            "offset_s": span("Offset"), "delay_s": span("Delay"), "jitter_s": span("Jitter"),
            "packet_count": None if count is None
            else _int("timedatectl timesync-status", count, count)}
