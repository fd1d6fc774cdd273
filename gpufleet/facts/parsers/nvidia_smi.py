"""nvidia-smi: ``--query-gpu`` CSV, ``topo -m``, ``nvlink -s``, ``-q`` and ``-L``."""

from __future__ import annotations

import re
from typing import Any

from gpufleet.facts.parsers._capture import _error, _is_capture_note, _lines, _output_lines

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


_SMI_NONE = frozenset({"[N/A]", "N/A", "[Not Supported]", "Not Supported"})
_SMI_BOOL = {
    "Enabled": True,
    "Disabled": False,
    "Active": True,
    "Not Active": False,
    "Yes": True,
    "No": False,
}
_SMI_TEXT = frozenset({"name", "uuid", "serial", "driver_version", "vbios_version", "pci.bus_id"})
_SMI_FIELD = re.compile(r"^[a-z][a-z0-9_.]*$")
_SMI_UNIT = re.compile(r"\s*\[([^\]]*)\]\s*$")
_HEX = re.compile(r"^0x[0-9a-fA-F]+$")
_INT = re.compile(r"^-?\d+$")
_FLOAT = re.compile(r"^-?\d+\.\d+$")


def nvidia_smi_query(text: str) -> list[dict[str, Any]]:
    """Parse ``nvidia-smi --query-gpu=... --format=csv[,nounits]`` output with its header.

    Keys are the header names without unit suffixes (``memory.total``), with
    ``clocks_throttle_reasons.`` renamed ``clocks_event_reasons.``. Without ``nounits``
    every value carries the unit its header names (``143771 MiB`` under ``memory.total
    [MiB]``): that unit is removed, so both forms give the same numbers. Values become int,
    float, bool (Enabled/Active/Yes), int for 0x bitmasks and None for N/A; identity
    fields (name, uuid, serial, versions, bus id) stay strings. "No devices were found"
    gives an empty list.
    """
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if lines == ["No devices were found"]:
        return []
    if not lines:
        raise _error("nvidia-smi query", "a CSV header line", text)
    columns = [_smi_column(name) for name in lines[0].split(",")]
    if not all(_SMI_FIELD.match(key) for key, _ in columns):
        raise _error("nvidia-smi query", "a CSV header line of field names", lines[0])
    rows: list[dict[str, Any]] = []
    for line in lines[1:]:
        values = [value.strip() for value in line.split(",")]
        if len(values) != len(columns):
            raise _error("nvidia-smi query", f"{len(columns)} comma-separated values", line)
        rows.append({key: _smi_value(key, _without_unit(value, unit))
                     for (key, unit), value in zip(columns, values, strict=True)})
    return rows


def _smi_column(name: str) -> tuple[str, str | None]:
    """A header name -> (key, the unit its values carry without ``nounits``)."""
    unit = _SMI_UNIT.search(name.strip())
    key = _SMI_UNIT.sub("", name.strip())
    if key.startswith("clocks_throttle_reasons."):
        key = "clocks_event_reasons." + key.removeprefix("clocks_throttle_reasons.")
    return key, unit.group(1).strip() if unit else None


def _without_unit(value: str, unit: str | None) -> str:
    """``143771 MiB`` -> ``143771`` under a ``[MiB]`` header; any other value as it is."""
    if unit and value.endswith(unit) and value[: -len(unit)].endswith(" "):
        return value[: -len(unit)].rstrip()
    return value


def _smi_value(key: str, value: str) -> Any:
    if value in _SMI_NONE:
        return None
    if key in _SMI_TEXT or key.startswith("inforom."):
        return value
    if value in _SMI_BOOL:
        return _SMI_BOOL[value]
    return _number(value)


def _number(value: str) -> int | float | str:
    """Convert a 0x bitmask, integer or decimal to a number; leave anything else as text."""
    if _HEX.match(value):
        return int(value, 16)
    if _INT.match(value):
        return int(value)
    if _FLOAT.match(value):
        return float(value)
    return value


_TOPO_EXTRA = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")
_TOPO_GPU = re.compile(r"^GPU\d+$")
_TOPO_DEVICE = re.compile(r"^(?:GPU\d+|NIC\d+|[a-z][a-z0-9_]*\d)$")
_TOPO_HEADER_SPLIT = re.compile(r"\t| {2,}")
_TOPO_NIC_LEGEND = re.compile(r"^\s*(NIC\d+):\s*(\S+)\s*$")


def nvidia_topo(text: str) -> dict[str, Any]:
    """Parse ``nvidia-smi topo -m`` (ANSI escapes allowed), tab-separated as nvidia-smi
    prints it or with the tabs turned into spaces (a copy from a terminal or a ticket).

    Returns ``gpus`` (row labels such as "GPU0"), ``matrix`` (``matrix[a][b]`` -> "NV18",
    "PIX", "X"..., NIC rows and columns included), ``cpu_affinity`` and
    ``numa_affinity`` per GPU (None for N/A; the CPU affinity is "" where nvidia-smi
    printed none: inside a cpuset, such as a Slurm job's, that holds none of the GPU's
    CPUs), and ``nics`` (NIC0 -> mlx5_0) from the NIC Legend when printed.
    """
    lines = [line for line in _lines(_ANSI.sub("", text)) if not _is_capture_note(line)]
    start = next((index for index, line in enumerate(lines) if _topo_header(line)), None)
    if start is None:
        raise _error("nvidia-smi topo -m", "a header row of GPU columns", text)
    columns = _topo_header(lines[start])
    devices = [name for name in columns if name not in _TOPO_EXTRA]
    extras = [name for name in columns if name in _TOPO_EXTRA]
    if columns != devices + extras:
        raise _error("nvidia-smi topo -m", "device columns before affinity columns", lines[start])

    matrix: dict[str, dict[str, str]] = {}
    cpu_affinity: dict[str, str | None] = {}
    numa_affinity: dict[str, str | None] = {}
    for line in lines[start + 1 :]:
        if not line.strip():
            break
        tabbed = "\t" in line
        fields = [field.strip() for field in line.split("\t")] if tabbed else line.split()
        label, cells = fields[0], fields[1 : 1 + len(devices)]
        if label not in devices or len(cells) != len(devices) or not all(cells):
            raise _error("nvidia-smi topo -m", f"a row with {len(devices)} device cells", line)
        matrix[label] = dict(zip(devices, cells, strict=True))
        tail = fields[1 + len(devices) :]
        values = _topo_affinity(extras, tail, line) if tabbed else \
            _topo_affinity_spaced(extras, tail, line)
        if "CPU Affinity" in values:
            cpu_affinity[label] = _not_applicable(values["CPU Affinity"])
        if "NUMA Affinity" in values:
            numa_affinity[label] = _not_applicable(values["NUMA Affinity"])
    if not matrix:
        raise _error("nvidia-smi topo -m", "matrix rows after the header", lines[start])

    nics: dict[str, str] = {}
    legend = next((i for i, line in enumerate(lines) if line.strip() == "NIC Legend:"), None)
    if legend is not None:
        for line in lines[legend + 1 :]:
            if match := _TOPO_NIC_LEGEND.match(line):
                nics[match.group(1)] = match.group(2)
    return {
        "gpus": [label for label in matrix if _TOPO_GPU.match(label)],
        "matrix": matrix,
        "cpu_affinity": cpu_affinity,
        "numa_affinity": numa_affinity,
        "nics": nics,
    }


def _topo_header(line: str) -> list[str]:
    """The column names of a ``topo -m`` header row (devices, then affinity columns), or []
    for any other line: a row's cells (X, NV18, SYS...) are not names."""
    names = [name.strip() for name in _TOPO_HEADER_SPLIT.split(line.strip()) if name.strip()]
    if all(_TOPO_DEVICE.match(name) or name in _TOPO_EXTRA for name in names) \
            and any(_TOPO_GPU.match(name) for name in names):
        return names
    return []


def _topo_affinity(extras: list[str], tail: list[str], line: str) -> dict[str, str]:
    """The affinity fields of a tab-separated row, by position: an empty CPU Affinity is
    an empty field, and nvidia-smi prints one more empty field before GPU NUMA ID."""
    if len([field for field in tail if field]) > len(extras):
        raise _error("nvidia-smi topo -m", f"at most {len(extras)} affinity fields", line)
    return {name: tail[index] for index, name in enumerate(extras)
            if index < len(tail) and name != "GPU NUMA ID"}


def _topo_affinity_spaced(extras: list[str], tail: list[str], line: str) -> dict[str, str]:
    """The affinity fields of a row whose tabs became spaces: one word each, or one fewer
    when the CPU Affinity was empty (the only one nvidia-smi leaves empty; N/A otherwise)."""
    if not tail:
        return {}
    if len(tail) == len(extras) - 1 and extras[0] == "CPU Affinity":
        tail = ["", *tail]
    if len(tail) != len(extras):
        raise _error("nvidia-smi topo -m", f"{len(extras)} affinity fields", line)
    return dict(zip(extras, tail, strict=True))


def _not_applicable(value: str) -> str | None:
    return None if value == "N/A" else value


_NVLINK_GPU = re.compile(r"^GPU (\d+):")
_NVLINK_LINK = re.compile(r"^\s*Link (\d+):\s*(.*?)\s*$")
_NVLINK_SPEED = re.compile(r"^(\d+(?:\.\d+)?) GB/s$")
_NVLINK_ALL_INACTIVE = re.compile(r"all links are inactive", re.IGNORECASE)


def nvlink_status(text: str) -> dict[int, list[float | None]]:
    """Parse ``nvidia-smi nvlink -s``: GPU index -> per-link GB/s, None for ``<inactive>``.

    A GPU reported with "Unable to retrieve NVLink information as all links are inActive"
    gets an empty list. A machine without NVLink (one GPU, PCIe cards) makes nvidia-smi
    print nothing and exit 0: empty output is no links, an empty dict (a failed run is
    told apart by its exit status, never by its output).
    """
    if not text.strip():
        return {}
    result: dict[int, list[float | None]] = {}
    current: list[float | None] | None = None
    for line in _lines(text):
        if match := _NVLINK_GPU.match(line):
            current = result.setdefault(int(match.group(1)), [])
        elif match := _NVLINK_LINK.match(line):
            if current is None or int(match.group(1)) != len(current):
                raise _error("nvidia-smi nvlink -s", "links numbered from 0 under a GPU line", line)
            state = match.group(2)
            speed = _NVLINK_SPEED.match(state)
            if speed:
                current.append(float(speed.group(1)))
            elif state == "<inactive>":
                current.append(None)
            else:
                raise _error("nvidia-smi nvlink -s", "'N GB/s' or '<inactive>'", line)
        elif current is not None and not current and _NVLINK_ALL_INACTIVE.search(line):
            continue
        elif line.strip():
            raise _error("nvidia-smi nvlink -s", "'GPU N:' or 'Link N:' lines", line)
    return result


_SMI_Q_GPU = re.compile(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\s*$")
_SMI_Q_FIELD = re.compile(r"^(\s*)([^:]+?)\s*:\s*(.*?)\s*$")


def nvidia_smi_q(text: str) -> list[dict[str, Any]]:
    """Per GPU from ``nvidia-smi -q``: ``bus_id``, ``persistence`` ("Enabled" ...),
    ``fabric_state`` and ``fabric_status`` (the Fabric section: "Completed"/"Success" on a
    healthy NVSwitch system, "N/A" where there is no fabric); None where a field is missing.
    """
    gpus: list[dict[str, Any]] = []
    section = ""
    for line in _output_lines(text):
        stripped = line.strip()
        gpu = _SMI_Q_GPU.match(stripped)
        if line.startswith("GPU ") and not gpu:
            raise _error("nvidia-smi -q", "'GPU 00000000:XX:YY.Z' section lines", line)
        if gpu:
            gpus.append({"bus_id": gpu.group(1).lower(), "persistence": None,
                         "fabric_state": None, "fabric_status": None})
            section = ""
            continue
        if not gpus:
            continue
        indent = len(line) - len(line.lstrip())
        field = _SMI_Q_FIELD.match(line)
        if ":" not in line:
            if indent <= 4:
                section = stripped
            continue
        if field is None:
            continue
        key, value = field.group(2).strip(), field.group(3)
        if indent <= 4:
            section = ""
            if key == "Persistence Mode":
                gpus[-1]["persistence"] = value
        elif section == "Fabric" and key in ("State", "Status") and indent <= 8:
            gpus[-1][f"fabric_{key.lower()}"] = value
    if not gpus:
        raise _error("nvidia-smi -q", "'GPU 00000000:XX:YY.Z' sections", text)
    return gpus


_SMI_LIST = re.compile(r"^GPU (\d+): (.+?) \(UUID: (\S+)\)\s*$")


def nvidia_smi_list(text: str) -> list[dict[str, Any]]:
    """``nvidia-smi -L``: one ``{"index", "name", "uuid"}`` per GPU (MIG lines skipped);
    "No devices were found" gives an empty list."""
    gpus = []
    lines = _output_lines(text)
    if [line.strip() for line in lines] == ["No devices were found"]:
        return []
    for line in lines:
        if match := _SMI_LIST.match(line.strip()):
            gpus.append({"index": int(match.group(1)), "name": match.group(2),
                         "uuid": match.group(3)})
        elif not line.strip().startswith("MIG "):
            raise _error("nvidia-smi -L", "'GPU N: NAME (UUID: GPU-...)' lines", line)
    return gpus
