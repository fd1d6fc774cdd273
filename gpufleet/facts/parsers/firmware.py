"""Firmware versions as the kernel and the NVIDIA driver show them, each printed as
``grep -s -H ''`` (``PATH:LINE`` per line) under a root (``""`` on a node, the lab's stand-in
tree there): every RDMA device's ``fw_ver``, ``board_id`` and ``hca_type``
(``/sys/class/infiniband/<dev>/``), the BIOS and board strings of the DMI table
(``/sys/class/dmi/id/``), and each GPU's GSP firmware as the driver's per-GPU information file
prints it (``/proc/driver/nvidia/gpus/<bus>/information``: ``GPU Firmware:``, ``GSP
Firmware:`` in NVIDIA's README, ``N/A`` where the GPU runs without GSP firmware).

Every parser is bounded: a text over :data:`LIMIT` characters, more than :data:`MAX_DEVICES`
devices or a value over :data:`MAX_VALUE` characters is refused, never cut."""

from __future__ import annotations

import re

from gpufleet.facts.parsers._capture import _error, _is_capture_note, _lines

LIMIT = 64 * 1024
MAX_DEVICES = 64
MAX_VALUE = 128
HCA_FILES = ("fw_ver", "board_id", "hca_type")
DMI_FILES = ("bios_vendor", "bios_version", "bios_date", "board_vendor", "board_name",
             "product_name")
GSP_OFF = "off"
"""The GSP firmware of a GPU that runs without it (the driver prints ``N/A``)."""
_HCA = re.compile(r"^/sys/class/infiniband/([^/:]+)/(fw_ver|board_id|hca_type):(.*)$")
_DMI = re.compile(r"^/sys/class/dmi/id/([a-z_]+):(.*)$")
_GPU = re.compile(r"^/proc/driver/nvidia/gpus/([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}"
                  r"\.[0-7])/information:(.*)$")
_FIRMWARE = re.compile(r"^(?:GPU|GSP) Firmware:\s*(.*)$")


def _under(source: str, text: str, root: str) -> list[str]:
    """The ``PATH:LINE`` lines of ``text`` with ``root`` taken off each path; refuses a text
    over LIMIT and a line outside ``root``."""
    if len(text) > LIMIT:
        raise _error(source, f"at most {LIMIT} characters", text[:80])
    lines = []
    for line in _lines(text):
        if not line.strip() or _is_capture_note(line):
            continue
        if not line.startswith(root + "/"):
            raise _error(source, f"'PATH:LINE' lines under {root or '/'}", line)
        lines.append(line[len(root):])
    return lines


def _value(source: str, value: str, line: str) -> str:
    value = value.strip()
    if len(value) > MAX_VALUE:
        raise _error(source, f"a value of at most {MAX_VALUE} characters", line)
    return value


def hca_firmware(text: str, root: str = "") -> dict[str, dict[str, str | None]]:
    """Each RDMA device's ``fw_ver``, ``board_id`` and ``hca_type`` (None where the device has
    no such file: a software device), by device name, sorted."""
    devices: dict[str, dict[str, str | None]] = {}
    for line in _under("RDMA firmware", text, root):
        match = _HCA.match(line)
        if not match:
            raise _error("RDMA firmware", "/sys/class/infiniband/DEV/FILE:VALUE lines", line)
        device, name, value = match.groups()
        if device not in devices and len(devices) == MAX_DEVICES:
            raise _error("RDMA firmware", f"at most {MAX_DEVICES} devices", line)
        entry = devices.setdefault(device, dict.fromkeys(HCA_FILES))
        entry[name] = _value("RDMA firmware", value, line) or None
    if not devices:
        raise _error("RDMA firmware", "an RDMA device's fw_ver", text)
    return dict(sorted(devices.items()))


def dmi_bios(text: str, root: str = "") -> dict[str, str | None]:
    """The DMI table's BIOS vendor, version and date and the board's vendor, name and
    product name, by file name (None where a file was not readable or is empty); refused
    without a BIOS version."""
    found: dict[str, str | None] = dict.fromkeys(DMI_FILES)
    for line in _under("DMI", text, root):
        match = _DMI.match(line)
        if not match or match.group(1) not in found:
            raise _error("DMI", "/sys/class/dmi/id/FILE:VALUE lines of the BIOS and board",
                         line)
        found[match.group(1)] = _value("DMI", match.group(2), line) or None
    if found["bios_version"] is None:
        raise _error("DMI", "a bios_version line", text)
    return found


def gsp_firmware(text: str, root: str = "") -> dict[str, str | None]:
    """Each GPU's GSP firmware version by PCI bus id (sorted): :data:`GSP_OFF` where the
    driver prints ``N/A`` (the GPU runs without GSP firmware), None where its information
    file has no firmware line (a driver older than GSP)."""
    gpus: dict[str, str | None] = {}
    for line in _under("NVIDIA GPU information", text, root):
        match = _GPU.match(line)
        if not match:
            raise _error("NVIDIA GPU information",
                         "/proc/driver/nvidia/gpus/BUS/information:LINE lines", line)
        bus, content = match.group(1).lower(), match.group(2)
        if bus not in gpus and len(gpus) == MAX_DEVICES:
            raise _error("NVIDIA GPU information", f"at most {MAX_DEVICES} GPUs", line)
        gpus.setdefault(bus, None)
        if firmware := _FIRMWARE.match(content.strip()):
            version = _value("NVIDIA GPU information", firmware.group(1), line)
            gpus[bus] = GSP_OFF if version in ("", "N/A") else version
    if not gpus:
        raise _error("NVIDIA GPU information", "a GPU's information lines", text)
    return dict(sorted(gpus.items()))
