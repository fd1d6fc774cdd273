"""The PCIe fact's output (gpufleet/facts/pcie.py), and the registers it reads.

Lines: ``@cmdline LINE``; ``@iommu NAME`` per entry of /sys/class/iommu;
``@dev|KIND|BDF|VENDOR|CLASS|WIDTH|MAX_WIDTH|SPEED|MAX_SPEED|IOMMU_GROUP_TYPE|PATH`` per GPU
and NIC (``PATH`` the device's resolved sysfs directory, the chain of bridges above it);
``@devctl BDF WORD`` and ``@acs BDF WORD`` (or setpci's message where the register cannot be
read); ``@acs-unknown REASON`` where ACS was not read.

The words are decoded, and each GPU's path to its nearest NICs found, in
gpufleet/facts/pcie.py.
"""

from __future__ import annotations

import re
from typing import Any

from gpufleet.facts.parsers._capture import _error, _lines

LIMIT = 1 << 20
"""The most text the parser reads: a node's devices and bridges take a few kilobytes."""
_BDF = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]\Z")
"""A PCI address: a domain of four hex digits, more behind a VMD controller."""
_WORD = re.compile(r"^[0-9a-fA-F]{4}\Z")
_SPEED = re.compile(r"^([0-9]+(?:\.[0-9]+)?) GT/s( PCIe)?\Z")
NO_CAPABILITY = "not found"
"""What setpci says of a device without the capability (``Instance #0 of Extended
capability 000d not found``)."""


def link_speed(text: str) -> float | None:
    """sysfs ``current_link_speed``/``max_link_speed`` (``32.0 GT/s PCIe``, ``8.0 GT/s``)
    in GT/s; None for ``Unknown`` or nothing; anything else is refused."""
    value = text.strip()
    if value in ("", "Unknown", "unknown"):
        return None
    match = _SPEED.match(value)
    if not match:
        raise _error("sysfs link speed", "'N GT/s' or 'Unknown'", text)
    return float(match.group(1))


def _width(text: str) -> int | None:
    """sysfs ``current_link_width``/``max_link_width``; None for nothing or 0."""
    value = text.strip()
    if not value:
        return None
    if not re.fullmatch(r"[0-9]{1,4}", value):
        raise _error("sysfs link width", "a number of lanes", text)
    return int(value) or None


def _bridges(path: str) -> list[str]:
    """The PCI addresses in a resolved sysfs device path, from the root port down, the
    device's own last (``/sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0`` -> both)."""
    return [part for part in path.split("/") if _BDF.match(part)]


def _word(value: str) -> int | str | None:
    """setpci's answer: the word, None where the device lacks the capability, else the
    message (all ones too: what a device that fell off the bus reads as)."""
    text = value.strip()
    if text.lower() == "ffff":
        return "ffff: the device does not answer (configuration reads return all ones)"
    if _WORD.match(text):
        return int(text, 16)
    if NO_CAPABILITY in text:
        return None
    return text or "no answer"


def pcie_state(text: str) -> dict[str, Any]:
    """The PCIe fact: ``cmdline``, ``iommus`` (the /sys/class/iommu entries), ``devices``
    (each with ``kind`` gpu or nic, ``address``, ``vendor``, ``class``, ``width``,
    ``max_width``, ``speed``, ``max_speed`` (GT/s; None where sysfs has none),
    ``iommu_group_type`` (None without one) and ``path``, the bridges above it), ``acs``
    (bridge -> ACS Control word, None without the capability, or setpci's message; absent
    where not read), ``acs_unknown`` (why ACS was not read) and ``devctl`` (NIC -> Device
    Control word or message)."""
    if len(text) > LIMIT:
        raise _error("pcie", f"at most {LIMIT} characters", text)
    state: dict[str, Any] = {"cmdline": None, "iommus": [], "devices": [], "acs": None,
                             "acs_unknown": None, "devctl": {}}
    for line in _lines(text):
        if line.strip():
            _record(state, line)
    if state["cmdline"] is None:
        raise _error("pcie", "an @cmdline line", text)
    return state


def _record(state: dict[str, Any], line: str) -> None:
    """Keep one line of the fact; a line of no known kind is refused."""
    tag, _, rest = line.partition(" ")
    if line.startswith("@dev|"):
        state["devices"].append(_device(line))
    elif tag == "@cmdline":
        state["cmdline"] = rest.strip()
    elif tag == "@iommu":
        state["iommus"].append(rest.strip())
    elif tag in ("@acs", "@devctl"):
        address, _, value = rest.partition(" ")
        if not _BDF.match(address):
            raise _error("pcie", "a PCI address", line)
        if tag == "@acs":
            state["acs"] = state["acs"] or {}
            state["acs"][address] = _word(value)
        else:
            state["devctl"][address] = _word(value)
    elif tag == "@acs-unknown":
        state["acs_unknown"] = rest.strip()
    else:
        raise _error("pcie", "@cmdline, @iommu, @dev, @acs or @devctl lines", line)


def _device(line: str) -> dict[str, Any]:
    fields = line.split("|")
    if len(fields) != 11 or fields[1] not in ("gpu", "nic") or not _BDF.match(fields[2]):
        raise _error("pcie", "@dev|KIND|BDF|VENDOR|CLASS|WIDTH|MAX_WIDTH|SPEED|MAX_SPEED|"
                     "TYPE|PATH", line)
    path = _bridges(fields[10])
    if not path or path[-1] != fields[2]:
        raise _error("pcie", f"a sysfs path ending in {fields[2]}", line)
    return {"kind": fields[1], "address": fields[2], "vendor": fields[3], "class": fields[4],
            "width": _width(fields[5]), "max_width": _width(fields[6]),
            "speed": link_speed(fields[7]), "max_speed": link_speed(fields[8]),
            "iommu_group_type": fields[9].strip() or None, "path": path[:-1]}
