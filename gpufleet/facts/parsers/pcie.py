"""The PCIe fact's output (gpufleet/facts/pcie.py), and the registers it reads.

Lines: ``@cmdline LINE``; ``@iommu NAME`` per entry of /sys/class/iommu;
``@dev|KIND|BDF|VENDOR|CLASS|WIDTH|MAX_WIDTH|SPEED|MAX_SPEED|IOMMU_GROUP_TYPE|PATH`` per GPU
and NIC (``PATH`` the device's resolved sysfs directory, the chain of bridges above it);
``@devctl BDF WORD`` and ``@acs BDF WORD`` (or setpci's message where the register cannot be
read); ``@acs-unknown REASON`` where ACS was not read.

The ACS Control and Device Control words are decoded with the bit names ``lspci -vvv``
prints (``ACSCtl: SrcValid+ TransBlk- ReqRedir+ ...``, ``DevCtl: ... RlxdOrd+ ...
MaxReadReq 4096 bytes``), PCI Express Base Specification 7.7.8 and 7.5.3.4.
"""

from __future__ import annotations

import re
from typing import Any

from gpufleet.facts.parsers._capture import _error, _lines

LIMIT = 1 << 20
"""The most text the parser reads: a node's devices and bridges take a few kilobytes."""
_BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]\Z")
_WORD = re.compile(r"^[0-9a-fA-F]{4}\Z")
_SPEED = re.compile(r"^(\d+(?:\.\d+)?) GT/s")
ACS_BITS = ("SrcValid", "TransBlk", "ReqRedir", "CmpltRedir", "UpstreamFwd", "EgressCtrl",
            "DirectTrans")
"""ACS Control bits 0-6, as lspci names them."""
ACS_REDIRECTS = ("ReqRedir", "CmpltRedir", "EgressCtrl")
"""The ACS controls that send peer-to-peer traffic up to the root complex (P2P Request
Redirect, P2P Completion Redirect, P2P Egress Control): what breaks GPUDirect through a
PCIe switch."""
ACS_REDIRECT_MASK = 0x0004 | 0x0008 | 0x0020
NO_CAPABILITY = "not found"
"""What setpci says of a device without the capability (``Instance #0 of Extended
capability 000d not found``)."""


def acs_flags(word: int) -> dict[str, bool]:
    """An ACS Control word as lspci's ``ACSCtl:`` flags."""
    return {name: bool(word >> bit & 1) for bit, name in enumerate(ACS_BITS)}


def acs_redirects(word: int) -> list[str]:
    """The redirecting controls an ACS Control word enables (lspci's names)."""
    return [name for name, on in acs_flags(word).items() if on and name in ACS_REDIRECTS]


def devctl(word: int) -> dict[str, Any]:
    """A Device Control word: ``relaxed_ordering`` (bit 4, lspci's ``RlxdOrd``) and
    ``max_read_request`` in bytes (bits 14:12, lspci's ``MaxReadReq``: 128 << n)."""
    return {"relaxed_ordering": bool(word >> 4 & 1), "max_read_request": 128 << (word >> 12 & 7)}


def link_speed(text: str) -> float | None:
    """sysfs ``current_link_speed``/``max_link_speed`` (``32.0 GT/s PCIe``, ``8.0 GT/s``)
    in GT/s; None for ``Unknown`` or nothing."""
    match = _SPEED.match(text.strip())
    return float(match.group(1)) if match else None


def _width(text: str) -> int | None:
    value = text.strip()
    return int(value) if value.isdigit() and int(value) > 0 else None


def bridges(path: str) -> list[str]:
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
    path = bridges(fields[10])
    if not path or path[-1] != fields[2]:
        raise _error("pcie", f"a sysfs path ending in {fields[2]}", line)
    return {"kind": fields[1], "address": fields[2], "vendor": fields[3], "class": fields[4],
            "width": _width(fields[5]), "max_width": _width(fields[6]),
            "speed": link_speed(fields[7]), "max_speed": link_speed(fields[8]),
            "iommu_group_type": fields[9].strip() or None, "path": path[:-1]}


def gpu_nic_paths(devices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each GPU's path to its nearest NICs: the NICs that share the deepest bridge with it
    (a GPU that shares none with any NIC, whose traffic crosses the root complex anyway, has
    no path). Each path: ``gpu``, ``nic``, ``shared`` (the deepest bridge both are below:
    the PCIe switch's port) and ``bridges`` (from ``shared`` down to the GPU and to the NIC:
    every port a GPUDirect transfer between them passes)."""
    gpus = [d for d in devices if d["kind"] == "gpu"]
    nics = [d for d in devices if d["kind"] == "nic"]
    paths = []
    for gpu in gpus:
        depths = {nic["address"]: _common(gpu["path"], nic["path"]) for nic in nics}
        best = max(depths.values(), default=0)
        if best == 0:
            continue
        for nic in nics:
            if depths[nic["address"]] != best:
                continue
            below = [*gpu["path"][best - 1:], *nic["path"][best:]]
            paths.append({"gpu": gpu["address"], "nic": nic["address"],
                          "shared": gpu["path"][best - 1], "bridges": below})
    return paths


def _common(one: list[str], other: list[str]) -> int:
    count = 0
    for a, b in zip(one, other, strict=False):
        if a != b:
            break
        count += 1
    return count


def path_bridges(state: dict[str, Any]) -> list[str]:
    """The bridges on the GPU-NIC paths of a PCIe fact, each once, in order."""
    found: list[str] = []
    for path in gpu_nic_paths(state["devices"]):
        found += [b for b in path["bridges"] if b not in found]
    return found


TRANSLATING = ("DMA", "DMA-FQ")
"""IOMMU group types whose DMA the IOMMU translates (``identity`` is passthrough)."""
PASSTHROUGH = ("iommu=pt", "iommu.passthrough=1", "iommu=off", "intel_iommu=off",
               "amd_iommu=off")
"""Kernel command-line words that leave DMA untranslated."""


def translating(state: dict[str, Any]) -> list[str]:
    """``KIND BDF (TYPE)`` of each GPU and NIC whose IOMMU group translates its DMA."""
    return [f"{d['kind'].upper()} {d['address']} ({d['iommu_group_type']})"
            for d in state["devices"] if d["iommu_group_type"] in TRANSLATING]


def cmdline_passthrough(cmdline: str) -> list[str]:
    """The words of a kernel command line that leave DMA untranslated."""
    return [word for word in cmdline.split() if word in PASSTHROUGH]
