"""The host's own files and probes: ``/etc/os-release``, ``/proc/meminfo``, the NVIDIA
kernel module's ``/proc/driver/nvidia/version``, ``mokutil --sb-state``, the GPU Operator
detection and the gatherer's sysfs PCI listing."""

from __future__ import annotations

import re
from typing import Any

from gpufleet.facts.parsers._capture import _error, _output_lines

_PROC_VERSION = re.compile(r"Kernel Module(?:\s+for\s+\S+)?\s+(\d+(?:\.\d+)+)")


def proc_driver_version(text: str) -> str:
    """Return the kernel module version from ``/proc/driver/nvidia/version``."""
    if match := _PROC_VERSION.search(text):
        return match.group(1)
    raise _error("/proc/driver/nvidia/version", "'Kernel Module  X.Y.Z'", text)


def proc_driver_flavor(text: str) -> str:
    """``open`` for NVIDIA's open kernel module, ``proprietary`` otherwise, from
    ``/proc/driver/nvidia/version``."""
    proc_driver_version(text)
    return "open" if "Open Kernel Module" in text else "proprietary"


def gpu_operator(text: str) -> bool:
    """Whether NVIDIA's GPU Operator runs the node's driver (the detection prints
    ``operator`` or ``none``)."""
    for line in _output_lines(text):
        if line.strip() in ("operator", "none"):
            return line.strip() == "operator"
    raise _error("the GPU Operator detection", "'operator' or 'none'", text)


def secure_boot(text: str) -> bool:
    """Whether ``mokutil --sb-state`` reports Secure Boot enforced: ``SecureBoot enabled``
    without ``SecureBoot validation is disabled in shim`` (with shim's validation off the
    kernel too treats Secure Boot as off and loads unsigned modules)."""
    lines = [line.strip() for line in _output_lines(text)]
    states = [line.split()[1].lower() for line in lines if line.startswith("SecureBoot ")]
    if not states or states[0] not in ("enabled", "disabled"):
        raise _error("mokutil --sb-state", "'SecureBoot enabled' or 'SecureBoot disabled'", text)
    return states[0] == "enabled" and "SecureBoot validation is disabled in shim" not in lines


_OS_RELEASE_LINE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
_MEMINFO_LINE = re.compile(r"^([A-Za-z0-9_()]+):\s+(\d+)(\s+kB)?\s*$")


def os_release(text: str) -> dict[str, str]:
    """Parse ``/etc/os-release`` into KEY -> value with shell quoting removed."""
    result: dict[str, str] = {}
    for line in _output_lines(text):
        match = _OS_RELEASE_LINE.match(line.strip())
        if not match:
            raise _error("os-release", "KEY=value lines", line)
        result[match.group(1)] = _unquote(match.group(2).strip())
    if not result:
        raise _error("os-release", "KEY=value lines", text)
    return result


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] == "'":
        return value[1:-1]
    if len(value) >= 2 and value[0] == value[-1] == '"':
        return re.sub(r"\\([\\\"$`])", r"\1", value[1:-1])
    return value


def meminfo(text: str) -> dict[str, int]:
    """Parse ``/proc/meminfo``: kB values become bytes, unitless counts stay as they are."""
    result: dict[str, int] = {}
    for line in _output_lines(text):
        match = _MEMINFO_LINE.match(line.strip())
        if not match:
            raise _error("/proc/meminfo", "'Name:   N kB' lines", line)
        value = int(match.group(2))
        result[match.group(1)] = value * 1024 if match.group(3) else value
    if "MemTotal" not in result:
        raise _error("/proc/meminfo", "a MemTotal line", text)
    return result


_SYS_PCI = re.compile(
    r"^(\S+)\s+(0x[0-9a-fA-F]{6})\s+(0x[0-9a-fA-F]{4})\s+(?:(.*?)\s+)?x(\d*)\s+numa=(-?\d*)$"
)
_GT_PER_S = re.compile(r"^(\d+(?:\.\d+)?) GT/s\b")
_GPU_CLASSES = ("0x0300", "0x0302")


def sys_pci_gpus(text: str) -> list[dict[str, Any]]:
    """Parse the gatherer's sysfs PCI listing and keep the GPUs (class 0x0300xx/0x0302xx).

    Lines read ``ADDRESS CLASS DEVICE LINK_SPEED xWIDTH numa=N``. Returns ``address``,
    ``class`` and ``device`` (lower-case hex strings), ``link_speed`` (GT/s as float),
    ``width`` (lanes) and ``numa``; each of the last three is None when sysfs gave no
    value (Unknown speed, a missing file, numa_node -1).
    """
    gpus: list[dict[str, Any]] = []
    for line in _output_lines(text):
        match = _SYS_PCI.match(line.strip())
        if not match:
            raise _error("sysfs PCI", "'ADDRESS CLASS DEVICE SPEED xWIDTH numa=N' lines", line)
        address, pci_class, device, speed, width, numa = match.groups()
        if not pci_class.lower().startswith(_GPU_CLASSES):
            continue
        rate = _GT_PER_S.match(speed or "")
        gpus.append(
            {
                "address": address.lower(),
                "class": pci_class.lower(),
                "device": device.lower(),
                "link_speed": float(rate.group(1)) if rate else None,
                "width": int(width) if width else None,
                "numa": int(numa) if numa and int(numa) >= 0 else None,
            }
        )
    return gpus
