"""The network stack: ``ip -j addr`` and its /sys/class/net fallback, ``ethtool -S``, sysfs
listings (``grep -H .``), ``/proc/net/snmp``, sysctl values, the local port range and an RDMA
port's rate."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from gpufleet.facts.parsers._capture import _error, _int, _json_document, _output_lines


def ip_addr_json(text: str) -> list[dict[str, Any]]:
    """Parse ``ip -j addr``: ``name``, ``mtu``, ``state``, ``mac`` (None if the link has none)
    and ``addresses`` ("a.b.c.d/nn" and IPv6 "addr/nn" in printed order)."""
    document = _json_document("ip -j addr", text, ("[",))
    if not isinstance(document, list):
        raise _error("ip -j addr", "a JSON list of interfaces", text)
    interfaces: list[dict[str, Any]] = []
    for link in document:
        if not isinstance(link, dict) or "ifname" not in link or "mtu" not in link:
            raise _error("ip -j addr", "interfaces with ifname and mtu", json.dumps(link))
        addresses = [
            f"{info['local']}/{info['prefixlen']}"
            for info in link.get("addr_info", [])
            if "local" in info and "prefixlen" in info
        ]
        interfaces.append(
            {
                "name": link["ifname"],
                "mtu": link["mtu"],
                "state": link.get("operstate"),
                "mac": link.get("address"),
                "addresses": addresses,
            }
        )
    return interfaces


def sys_class_net(text: str) -> list[dict[str, Any]]:
    """Parse the gatherer's /sys/class/net fallback, used when ``ip`` is missing.

    One line per interface: ``NAME MTU OPERSTATE [MAC]`` (the contents of ``mtu``,
    ``operstate`` and ``address`` under /sys/class/net/NAME; MAC absent when that file
    is empty). Returns the :func:`ip_addr_json` shape with the state upper-cased as
    ``ip`` prints it and ``addresses`` empty, since sysfs does not list them.
    """
    interfaces: list[dict[str, Any]] = []
    for line in _output_lines(text):
        fields = line.split()
        if len(fields) not in (3, 4) or not fields[1].isdigit():
            raise _error("/sys/class/net", "'NAME MTU OPERSTATE [MAC]' lines", line)
        interfaces.append(
            {
                "name": fields[0],
                "mtu": int(fields[1]),
                "state": fields[2].upper(),
                "mac": fields[3] if len(fields) == 4 else None,
                "addresses": [],
            }
        )
    return interfaces


def sysctl_value(text: str) -> str:
    """Return a sysctl value (``sysctl -n KEY`` or the /proc/sys file) with runs of
    whitespace, tabs included, made one space. A sysctl/cat error message raises."""
    if text.lstrip().startswith(("sysctl: ", "cat: ")):
        raise _error("sysctl value", "a value", text)
    return " ".join(text.split())


_PORT_RANGE = re.compile(r"^(?:net\.ipv4\.ip_local_port_range\s*=\s*)?(\d+)\s+(\d+)$")


def port_range(text: str) -> tuple[int, int]:
    """Parse ``net.ipv4.ip_local_port_range`` in ``sysctl`` or ``sysctl -n`` form."""
    match = _PORT_RANGE.match(text.strip())
    if not match:
        raise _error("ip_local_port_range", "'LOW HIGH'", text)
    low, high = int(match.group(1)), int(match.group(2))
    if not 0 < low <= high <= 65535:
        raise _error("ip_local_port_range", "0 < LOW <= HIGH <= 65535", text)
    return low, high


_PAUSE_OR_DISCARD = re.compile(r"pause|discard", re.IGNORECASE)


def ethtool_stats(text: str) -> dict[str, int]:
    """Parse ``ethtool -S IFACE`` into counter -> value."""
    stats: dict[str, int] = {}
    for line in _output_lines(text):
        stripped = line.strip()
        if stripped == "NIC statistics:":
            continue
        name, sep, value = stripped.rpartition(":")
        if not sep or not name or not value.strip().isdigit():
            raise _error("ethtool -S", "'name: N' counter lines", line)
        stats[name.strip()] = int(value)
    if not stats:
        raise _error("ethtool -S", "at least one counter", text)
    return stats


def pause_and_discard_counters(stats: Mapping[str, int]) -> dict[str, int]:
    """Pick the counters whose names mention pause or discard (``rx_prio3_pause``...)."""
    return {name: value for name, value in stats.items() if _PAUSE_OR_DISCARD.search(name)}


_SYSFS_VALUE = re.compile(r"^(?P<path>[^:\s]+):\s?(?P<value>.*)$")


def sysfs_values(text: str) -> dict[str, str]:
    """Parse ``grep -H . FILE...`` over sysfs (``eth0/statistics/rx_dropped:0``, also with a
    space after the colon as pasted listings have it) into path -> value."""
    values: dict[str, str] = {}
    for line in _output_lines(text):
        match = _SYSFS_VALUE.match(line.strip())
        if not match:
            raise _error("sysfs listing", "'path:value' lines", line)
        values[match["path"]] = match["value"].strip()
    return values


def proc_net_snmp(text: str, protocol: str = "Tcp") -> dict[str, int]:
    """One protocol's counters from ``/proc/net/snmp`` (a header line of names, then a
    line of values, both starting ``Tcp:``)."""
    rows = [line.split()[1:] for line in _output_lines(text)
            if line.startswith(f"{protocol}:")]
    if len(rows) != 2 or len(rows[0]) != len(rows[1]):
        raise _error("/proc/net/snmp", f"a {protocol}: header and a {protocol}: value line",
                     text)
    names, values = rows
    return {n: _int("/proc/net/snmp", v, v) for n, v in zip(names, values, strict=True)}


_RDMA_RATE = re.compile(r"^(\d+(?:\.\d+)?) Gb/sec\b")


def rdma_port_rate(text: str) -> float:
    """An RDMA port's ``rate`` file (``400 Gb/sec (4X NDR)``) in Gb/s."""
    match = _RDMA_RATE.match(text.strip())
    if not match:
        raise _error("RDMA port rate", "'N Gb/sec (...)'", text)
    return float(match.group(1))
