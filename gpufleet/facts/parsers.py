"""Pure parsers: the raw text one command printed -> plain Python values.

Every function takes the captured output (stdout, sometimes with stderr mixed in) and
returns JSON-friendly values. Output that cannot be understood raises ``ParseError``
with what was expected and a short quote of the text; nothing is guessed or defaulted.
"""

from __future__ import annotations

import json
import re
import textwrap
from collections.abc import Callable, Mapping
from typing import Any

from gpufleet.errors import ParseError

__all__ = [
    "ParseError",
    "apt_madison",
    "apt_showhold",
    "cuda_version_json",
    "dcb_pfc",
    "dcb_pfc_json",
    "dpkg_query",
    "ethtool_stats",
    "ip_addr_json",
    "meminfo",
    "mlnx_qos",
    "nccl_tests",
    "nccl_tests_avg_busbw",
    "nvcc_version",
    "nvidia_smi_query",
    "nvidia_topo",
    "nvidia_version_from_package",
    "nvlink_status",
    "os_release",
    "pause_and_discard_counters",
    "port_range",
    "proc_driver_version",
    "proc_net_snmp",
    "rdma_port_rate",
    "sys_class_net",
    "sys_pci_gpus",
    "sysctl_value",
    "sysfs_values",
    "torch_info",
    "xid_events",
]

_QUOTE_LIMIT = 72
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_PRIORITIES = range(8)


def _is_capture_note(line: str) -> bool:
    """Say whether a line is a capture annotation: a ``#`` comment or a ``$ command`` prompt."""
    stripped = line.lstrip()
    return stripped.startswith("#") or stripped.startswith("$ ")


def _lines(text: str) -> list[str]:
    """The lines of ``text`` without the indentation they all share, so output copied with
    every line indented (from a mail, a ticket, a log) reads like the tool printed it."""
    return textwrap.dedent(text).splitlines()


def _output_lines(text: str) -> list[str]:
    """Return the non-blank lines of ``text`` that are not capture annotations."""
    return [line for line in _lines(text) if line.strip() and not _is_capture_note(line)]


def _quote(text: str) -> str:
    """Quote the first meaningful line of ``text``, shortened, for an error message."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    meaningful = [line for line in lines if not _is_capture_note(line)] or lines
    if not meaningful:
        return "empty output"
    piece = meaningful[0]
    if len(piece) > _QUOTE_LIMIT:
        piece = piece[: _QUOTE_LIMIT - 3] + "..."
    return repr(piece)


def _error(source: str, expected: str, got: str) -> ParseError:
    """Build a ParseError naming the source, what was expected and what was found."""
    return ParseError(f"{source}: expected {expected}, got {_quote(got)}")


def _int(source: str, value: str, line: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise _error(source, "an integer", line) from None


def _float(source: str, value: str, line: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise _error(source, "a number", line) from None


def _json_document(source: str, text: str, openers: tuple[str, ...] = ("{", "["),
                   first_only: bool = False) -> Any:
    """Decode the first JSON value that starts a line with one of ``openers``.

    Lines printed before it (warnings, a ``$ command`` line) are skipped. With
    ``first_only`` the first such line must start it: a broken document is refused rather
    than read from an object inside it.
    """
    lines = text.splitlines()
    candidates = [i for i, line in enumerate(lines) if line.lstrip().startswith(openers)]
    for index in candidates[:1] if first_only else candidates:
        try:
            value, _ = json.JSONDecoder().raw_decode("\n".join(lines[index:]).lstrip())
        except (json.JSONDecodeError, RecursionError):
            continue
        return value
    if candidates:
        raise _error(source, "valid JSON", lines[candidates[0]])
    raise _error(source, "a JSON document", text)


# --------------------------------------------------------------------------- RDMA / QoS

_QOS_START = re.compile(r"^\s*DCBX mode:")
_QOS_TRUST = re.compile(r"^\s*Priority trust state:\s*(\S*)\s*$")
_QOS_DSCP = re.compile(r"^\s*prio:(\d+)\s+dscp:([\d,\s]*)$")
_QOS_PFC_HEADER = re.compile(r"^\s*priority((?:\s+\d+)+)\s*$")
_QOS_PFC_ENABLED = re.compile(r"^\s*enabled\b(.*)$")
_QOS_TC = re.compile(
    r"^\s*tc:\s*(\d+)\s+(?:ratelimit:\s*[^,]*,\s*)?tsa:\s*([A-Za-z_]+)(?:,\s*bw:\s*(\d+)\s*%)?\s*$"
)
_QOS_TC_PRIORITY = re.compile(r"^\s*priority:\s*(\d+)\s*$")
# the "default priority:" block of current mlnx_qos: one bare "prio:N" per line
_QOS_DEFAULT_PRIO = re.compile(r"^\s*prio:\s*\d+\s*$")
# lines of the dscp map, the PFC header and the tc table, whichever way they are garbled
_QOS_DSCP_LIKE = re.compile(r"^\s*prio\S*:|\bdscp:")
_QOS_TC_LIKE = re.compile(r"^\s*(?:tc:|priority\b)")


def mlnx_qos(text: str) -> dict[str, Any]:
    """Parse ``mlnx_qos -i IFACE`` output.

    Returns ``trust`` ("pcp" or "dscp"), ``pfc_enabled`` (sorted priorities with PFC on),
    ``dscp2prio`` (dscp -> priority, empty under pcp trust) and ``tc`` (tc -> ``tsa``,
    ``bw`` percent or None, ``priorities``). Old and current layouts are accepted, with or
    without blank lines between a ``tc:`` line and its ``priority:`` lines; when the text
    holds several reports (e.g. a script that ran mlnx_qos twice) the last wins.
    """
    # ConnectX NICs print blank lines between a tc and its priorities: they mean nothing
    lines = [line for line in _lines(text) if line.strip()]
    starts = [index for index, line in enumerate(lines) if _QOS_START.match(line)]
    lines = lines[starts[-1] :] if starts else lines

    trust: str | None = None
    dscp2prio: dict[int, int] = {}
    header: list[int] | None = None
    enabled_line: str | None = None
    tcs: dict[int, dict[str, Any]] = {}
    current: list[int] | None = None

    for line in lines:
        if match := _QOS_TRUST.match(line):
            trust = match.group(1)
        elif match := _QOS_DSCP.match(line):
            _qos_add_dscp(dscp2prio, int(match.group(1)), match.group(2), line)
        elif match := _QOS_PFC_HEADER.match(line):
            header = [int(token) for token in match.group(1).split()]
        elif _QOS_PFC_ENABLED.match(line):
            enabled_line = line
        elif match := _QOS_TC.match(line):
            tc = int(match.group(1))
            if tc in tcs:
                raise _error("mlnx_qos", "each tc listed once", line)
            bw = match.group(3)
            current = []
            tcs[tc] = {"tsa": match.group(2), "bw": int(bw) if bw else None, "priorities": current}
            continue
        elif current is not None and (match := _QOS_TC_PRIORITY.match(line)):
            current.append(int(match.group(1)))
            continue
        else:
            _qos_refuse_garbled(line)
        current = None

    report = "\n".join(lines)
    if trust is None:
        raise _error("mlnx_qos", "a 'Priority trust state:' line", report)
    if trust not in ("pcp", "dscp"):
        raise _error("mlnx_qos", "trust state 'pcp' or 'dscp'", f"Priority trust state: {trust}")
    if enabled_line is None:
        raise _error("mlnx_qos", "a PFC 'enabled' row", report)
    return {
        "trust": trust,
        "pfc_enabled": _qos_pfc_enabled(enabled_line, header),
        "dscp2prio": dict(sorted(dscp2prio.items())) if trust == "dscp" else {},
        "tc": dict(sorted(tcs.items())),
    }


def _qos_refuse_garbled(line: str) -> None:
    """Refuse a line of the dscp map or the tc table that did not parse: skipping it would
    report the map or the tcs without it as if that were all mlnx_qos printed."""
    if _QOS_DSCP_LIKE.search(line) and not _QOS_DEFAULT_PRIO.match(line):
        raise _error("mlnx_qos", "a 'prio:N dscp:a,b,...' line", line)
    if _QOS_TC_LIKE.match(line):
        raise _error("mlnx_qos", "a 'tc: N ... tsa: T' line or its 'priority: N' lines", line)


def _qos_add_dscp(mapping: dict[int, int], prio: int, values: str, line: str) -> None:
    """Record one ``prio:N dscp:a,b,c,`` line, refusing contradictory or out-of-range values."""
    if prio not in _PRIORITIES:
        raise _error("mlnx_qos", "a priority 0..7 in the dscp2prio mapping", line)
    for token in filter(None, (part.strip() for part in values.split(","))):
        dscp = _int("mlnx_qos", token, line)
        if not 0 <= dscp <= 63:
            raise _error("mlnx_qos", "dscp values 0..63", line)
        if mapping.get(dscp, prio) != prio:
            raise _error("mlnx_qos", f"dscp {dscp} mapped to a single priority", line)
        mapping[dscp] = prio


def _qos_pfc_enabled(line: str, header: list[int] | None) -> list[int]:
    """Read the 0/1 flags of the PFC ``enabled`` row against its ``priority`` header."""
    flags = line.split()[1:]
    priorities = header if header is not None else list(_PRIORITIES)
    if len(flags) != len(priorities) or any(flag not in ("0", "1") for flag in flags):
        raise _error("mlnx_qos", f"{len(priorities)} PFC flags of 0 or 1", line)
    return sorted(prio for prio, flag in zip(priorities, flags, strict=True) if flag == "1")


_ON_OFF = {"on": True, "off": False}


def dcb_pfc(text: str) -> dict[str, Any]:
    """Parse ``dcb [-s] pfc show dev IFACE`` text output.

    Returns ``pfc_cap``, ``delay``, ``prio_pfc`` (sorted priorities with PFC on), plus
    ``macsec_bypass`` and, with ``-s``, ``requests``/``indications`` (prio -> count)
    when printed. Error text such as "Attribute not found" raises ParseError.
    """
    result: dict[str, Any] = {}
    for line in _output_lines(text):
        tokens = line.split()
        key = tokens[0]
        if key == "prio-pfc":
            flags = _dcb_mapping(line, tokens[1:], _dcb_on_off)
            result["prio_pfc"] = sorted(prio for prio, on in flags.items() if on)
        elif key in ("requests", "indications"):
            result[key] = _dcb_mapping(line, tokens[1:], _dcb_count)
        elif key in ("pfc-cap", "macsec-bypass", "delay"):
            if len(tokens) % 2:
                raise _error("dcb pfc", "'name value' pairs", line)
            for name, value in zip(tokens[::2], tokens[1::2], strict=True):
                if name == "macsec-bypass":
                    result["macsec_bypass"] = _dcb_on_off(value, line)
                elif name in ("pfc-cap", "delay"):
                    result[name.replace("-", "_")] = _int("dcb pfc", value, line)
                else:
                    raise _error("dcb pfc", "pfc-cap, macsec-bypass or delay", line)
    missing = [name for name in ("pfc_cap", "delay", "prio_pfc") if name not in result]
    if missing:
        raise _error("dcb pfc", f"fields {', '.join(missing)}", text)
    return result


def _dcb_on_off(value: str, line: str) -> bool:
    if value not in _ON_OFF:
        raise _error("dcb pfc", "on or off", line)
    return _ON_OFF[value]


def _dcb_count(value: str, line: str) -> int:
    return _int("dcb pfc", value, line)


def _dcb_mapping(
    line: str, pairs: list[str], convert: Callable[[str, str], bool | int]
) -> dict[int, Any]:
    """Read ``P:VALUE`` pairs for all eight priorities."""
    mapping: dict[int, Any] = {}
    for pair in pairs:
        prio, sep, value = pair.partition(":")
        if not sep or not prio.isdigit():
            raise _error("dcb pfc", "PRIO:VALUE pairs", line)
        mapping[int(prio)] = convert(value, line)
    if sorted(mapping) != list(_PRIORITIES):
        raise _error("dcb pfc", "one value for each priority 0..7", line)
    return mapping


def dcb_pfc_json(text: str) -> dict[str, Any]:
    """Parse ``dcb -j [-s] pfc show dev IFACE`` into the same shape as :func:`dcb_pfc`.

    ``prio_pfc``, ``requests`` and ``indications`` are accepted as a list indexed by
    priority (what iproute2 prints), a list of one-entry ``{prio: value}`` objects, or
    an object keyed by priority.
    """
    document = _json_document("dcb -j pfc", text)
    if isinstance(document, list) and len(document) == 1:
        document = document[0]
    if not isinstance(document, dict):
        raise _error("dcb -j pfc", "a JSON object", text)
    missing = [key for key in ("pfc_cap", "delay", "prio_pfc") if key not in document]
    if missing:
        raise _error("dcb -j pfc", f"keys {', '.join(missing)}", text)

    result: dict[str, Any] = {
        "pfc_cap": _json_int(document["pfc_cap"], "pfc_cap", text),
        "delay": _json_int(document["delay"], "delay", text),
    }
    flags = _json_prio_map(document["prio_pfc"], "prio_pfc", text)
    result["prio_pfc"] = sorted(prio for prio, on in flags.items() if _json_bool(on, text))
    if "macsec_bypass" in document:
        result["macsec_bypass"] = _json_bool(document["macsec_bypass"], text)
    for key in ("requests", "indications"):
        if key in document:
            counts = _json_prio_map(document[key], key, text)
            result[key] = {prio: _json_int(value, key, text) for prio, value in counts.items()}
    return result


def _json_int(value: Any, key: str, text: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _error("dcb -j pfc", f"an integer for {key}", text)
    return value


def _json_bool(value: Any, text: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value in _ON_OFF:
        return _ON_OFF[value]
    raise _error("dcb -j pfc", "true/false or on/off", text)


def _json_prio_map(value: Any, key: str, text: str) -> dict[int, Any]:
    """Normalise a per-priority JSON value (list, list of objects, or object) to prio -> value."""
    items: list[tuple[Any, Any]]
    if isinstance(value, dict):
        items = list(value.items())
    elif isinstance(value, list) and all(isinstance(item, dict) for item in value):
        items = [next(iter(item.items())) for item in value if len(item) == 1]
        if len(items) != len(value):
            raise _error("dcb -j pfc", f"one-entry objects in {key}", text)
    elif isinstance(value, list):
        items = list(enumerate(value))
    else:
        raise _error("dcb -j pfc", f"a list or object for {key}", text)
    mapping: dict[int, Any] = {}
    for raw, item in items:
        prio = int(raw) if isinstance(raw, str) and raw.isdigit() else raw
        if isinstance(prio, bool) or not isinstance(prio, int) or prio not in _PRIORITIES:
            raise _error("dcb -j pfc", f"priorities 0..7 in {key}", text)
        mapping[prio] = item
    if sorted(mapping) != list(_PRIORITIES):
        raise _error("dcb -j pfc", f"one value for each priority 0..7 in {key}", text)
    return mapping


# --------------------------------------------------------------------------- nccl-tests

_NCCL_LEAD = ["size", "count", "type"]
_NCCL_AVG = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*(\S+)")
# mpirun --tag-output puts "[JOB,RANK]<stdout>:" before every line; launchers that collect
# mpirun's output (Ray, SkyPilot, kubectl logs with prefixes) add their own in front of it
_MPI_TAG = re.compile(r"^.*?\[\d+,\d+\]<std(?:out|err)>:")


def _untagged(line: str) -> str:
    """A line without the ``[1,0]<stdout>:`` tag of ``mpirun --tag-output`` (and whatever
    prefix a launcher put before that tag)."""
    return _MPI_TAG.sub("", line, count=1)


def nccl_tests(text: str) -> list[dict[str, Any]]:
    """Parse the result table of an nccl-tests binary (``all_reduce_perf`` etc.).

    One dict per size row: ``size``, ``count``, ``type``, ``redop`` and ``root`` (None when
    the build prints no such column: nccl-tests before 2.11 printed ``redop`` only for
    reductions and ``root`` only for rooted collectives) and ``out_of_place``/``in_place``
    with ``time_us``, ``algbw``, ``busbw`` and ``wrong`` (None when not checked or when the
    build prints an ``error`` column, whose value is then kept as ``error``). Columns are
    located from the ``# size count ...`` header, so NCCL log lines and comments are
    skipped; the tags of ``mpirun --tag-output`` are removed first.
    """
    layout: tuple[list[str], list[str]] | None = None
    rows: list[dict[str, Any]] = []
    for line in _lines(text):
        stripped = _untagged(line).strip()
        if stripped.startswith("#"):
            names = stripped.lstrip("#").split()
            if names[:2] == _NCCL_LEAD[:2]:
                layout = _nccl_layout(names, line)
            continue
        tokens = stripped.split()
        # a row has its size and count first: one of the two is enough to know a row
        # whose other one is garbled, which is then refused rather than skipped
        if len(tokens) < 2 or not (tokens[0].isdigit() or tokens[1].isdigit()):
            continue
        if layout is None:
            raise _error("nccl-tests", "the '# size count type ...' header before data", line)
        rows.append(_nccl_row(tokens, layout, line))
    if not rows:
        raise _error("nccl-tests", "at least one result row", text)
    return rows


def _nccl_layout(names: list[str], line: str) -> tuple[list[str], list[str]]:
    """Return (leading column names, per-half column names) from a header row."""
    if names[:3] != _NCCL_LEAD:
        raise _error("nccl-tests", "columns size, count, type", line)
    lead = list(_NCCL_LEAD)
    for optional in ("redop", "root"):
        if names[len(lead) : len(lead) + 1] == [optional]:
            lead.append(optional)
    rest = names[len(lead) :]
    if rest and rest[-1] == "timestamp":
        rest = rest[:-1]
    half = rest[: len(rest) // 2]
    valid = (
        len(rest) % 2 == 0
        and rest[len(half) :] == half
        and len(half) >= 4
        and half[0] in ("time", "cputime")
        and half[1:3] == ["algbw", "busbw"]
        and half[3] in ("#wrong", "error")
    )
    if not valid:
        raise _error("nccl-tests", "time, algbw, busbw, #wrong|error for both halves", line)
    return lead, half


def _nccl_row(
    tokens: list[str], layout: tuple[list[str], list[str]], line: str
) -> dict[str, Any]:
    lead_names, half = layout
    lead = len(lead_names)
    if len(tokens) < lead + 2 * len(half):
        raise _error("nccl-tests", f"{lead + 2 * len(half)} columns", line)
    cell = dict(zip(lead_names, tokens, strict=False))
    row: dict[str, Any] = {
        "size": _int("nccl-tests", tokens[0], line),
        "count": _int("nccl-tests", tokens[1], line),
        "type": tokens[2],
        "redop": cell.get("redop"),
        "root": _int("nccl-tests", cell["root"], line) if "root" in cell else None,
    }
    for index, key in enumerate(("out_of_place", "in_place")):
        cells = tokens[lead + index * len(half) : lead + (index + 1) * len(half)]
        result: dict[str, Any] = {
            "time_us": _float("nccl-tests", cells[0], line),
            "algbw": _float("nccl-tests", cells[1], line),
            "busbw": _float("nccl-tests", cells[2], line),
            "wrong": None,
        }
        checked = cells[3] != "N/A"
        if half[3] == "error":
            result["error"] = _float("nccl-tests", cells[3], line) if checked else None
        elif checked:
            result["wrong"] = int(_float("nccl-tests", cells[3], line))
        row[key] = result
    return row


def nccl_tests_avg_busbw(text: str) -> float | None:
    """Return the value of the ``# Avg bus bandwidth : X`` line, or None when absent."""
    value: float | None = None
    for line in _lines(text):
        if match := _NCCL_AVG.match(_untagged(line).strip()):
            value = _float("nccl-tests", match.group(1), line)
    return value


# --------------------------------------------------------------------------- nvidia-smi

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


# --------------------------------------------------------------------------- versions

_PROC_VERSION = re.compile(r"Kernel Module(?:\s+for\s+\S+)?\s+(\d+(?:\.\d+)+)")
_NVCC_VERSION = re.compile(r"Cuda compilation tools, release [\d.]+, V(\d+(?:\.\d+)+)")
_PACKAGE_VERSION = re.compile(r"^(?:\d+:)?(\d+(?:\.\d+)+)(?:[-~+].*)?$")


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
    """Whether ``mokutil --sb-state`` reports Secure Boot on."""
    for line in _output_lines(text):
        if line.strip().startswith("SecureBoot "):
            return line.split()[1].lower() == "enabled"
    raise _error("mokutil --sb-state", "'SecureBoot enabled' or 'SecureBoot disabled'", text)


def cuda_version_json(text: str) -> str:
    """Return ``cuda.version`` from the toolkit's ``version.json``."""
    document = _json_document("cuda version.json", text, ("{",))
    cuda = document.get("cuda") if isinstance(document, dict) else None
    version = cuda.get("version") if isinstance(cuda, dict) else None
    if not isinstance(version, str):
        raise _error("cuda version.json", "a cuda.version string", text)
    return version


def nvcc_version(text: str) -> str:
    """Return the full nvcc version ("13.0.88") from ``nvcc --version``."""
    if match := _NVCC_VERSION.search(text):
        return match.group(1)
    raise _error("nvcc --version", "'Cuda compilation tools, release X, VX.Y.Z'", text)


def nvidia_version_from_package(version: str) -> str:
    """Return the upstream version of a package version: "1:550.54.15-1" -> "550.54.15"."""
    if match := _PACKAGE_VERSION.match(version.strip()):
        return match.group(1)
    raise _error("package version", "[EPOCH:]X.Y[.Z][-REVISION]", version)


def torch_info(text: str) -> dict[str, Any]:
    """Parse the torch probe's JSON; a Python traceback raises with its last line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if any(line.startswith("Traceback (most recent call last)") for line in lines):
        raise ParseError(f"torch probe: expected JSON, got traceback {lines[-1]!r}")
    document = _json_document("torch probe", text, ("{",))
    if not isinstance(document, dict) or "torch" not in document:
        raise _error("torch probe", "a JSON object with a 'torch' key", text)
    return document


# --------------------------------------------------------------------------- OS facts

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


# --------------------------------------------------------------------------- packages

_NO_PACKAGE = "dpkg-query: no packages found matching"
_PACKAGE_NAME = re.compile(r"^[a-z0-9][a-z0-9+.\-]*(?::[a-z0-9\-]+)?$")


def dpkg_query(text: str) -> dict[str, dict[str, Any]]:
    """Parse ``dpkg-query -W -f='${Package}\\t${Version}\\t${Status}\\n'``.

    Returns package -> ``version`` (None when empty), ``status``, ``installed`` (state
    word is "installed") and ``hold`` (selection is "hold"). The "no packages found
    matching" notices dpkg-query prints for unknown names are skipped.
    """
    packages: dict[str, dict[str, Any]] = {}
    for line in _output_lines(text):
        if line.startswith(_NO_PACKAGE):
            continue
        fields = line.split("\t")
        status = fields[2].split() if len(fields) == 3 else []
        if len(status) != 3 or not fields[0]:
            raise _error("dpkg-query", "'PACKAGE<TAB>VERSION<TAB>WANT FLAG STATE' lines", line)
        packages[fields[0]] = {
            "version": fields[1] or None,
            "status": " ".join(status),
            "installed": status[2] == "installed",
            "hold": status[0] == "hold",
        }
    return packages


def apt_showhold(text: str) -> set[str]:
    """Parse ``apt-mark showhold``: the set of held package names."""
    held: set[str] = set()
    for line in _output_lines(text):
        name = line.strip()
        if not _PACKAGE_NAME.match(name):
            raise _error("apt-mark showhold", "one package name per line", line)
        held.add(name)
    return held


def apt_madison(text: str) -> dict[str, list[str]]:
    """Parse ``apt-cache madison PKG...``: package -> versions in printed order, deduplicated.

    ``N:``/``W:`` notices (e.g. "Unable to locate package") are skipped, so an unknown
    package is simply absent. With ``deb-src`` lines in the sources, madison also lists the
    source package (``... Sources``): that is no version ``apt-get install`` can take, and
    its name may be no binary's (``openssh`` beside ``openssh-server``), so it is left out.
    """
    versions: dict[str, list[str]] = {}
    for line in _output_lines(text):
        if line.startswith(("N: ", "W: ")):
            continue
        fields = [field.strip() for field in line.split("|")]
        if len(fields) != 3 or not fields[0] or not fields[1]:
            raise _error("apt-cache madison", "'PACKAGE | VERSION | SOURCE' lines", line)
        if fields[2].endswith(" Sources"):
            continue
        known = versions.setdefault(fields[0], [])
        if fields[1] not in known:
            known.append(fields[1])
    return versions


# --------------------------------------------------------------------------- health

_XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?([0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)\):"
    r"\s*(\d+),\s*(.*?)\s*$"
)
_XID_MARK = "NVRM: Xid"
_XID_CONTEXT = re.compile(r"^(?:pid=[^,]*,\s*)?(?:name=[^,]*,\s*)?")
_LOG_TOOL_ERROR = re.compile(r"^(?:dmesg|journalctl): ")


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


_DMESG_TIME = re.compile(r"\[\s*(\d+\.\d+)\]")


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


# --------------------------------------------------------------------------- HGX services

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


def dcgm_diag(text: str) -> dict[str, Any]:
    """``dcgmi diag -r N -j``: ``{"tests": [{"name", "category", "gpu", "status", "info"}],
    "version": ..., "error": ...}``, one row per GPU and test (statuses upper-cased: PASS,
    FAIL, WARN, SKIP ...). Reads DCGM 3's layout (``DCGM GPU Diagnostic`` > ``test_categories``
    > ``tests`` > ``results`` by ``gpu_ids``, where one result may stand for several GPUs,
    ``"0,1,2,3"``: it becomes one row each) and DCGM 4's (``DCGM Diagnostic``, results by
    ``entity_id``, the version under ``metadata``). ``info`` joins a result's warnings, then
    its info lines."""
    document = _json_document("dcgmi diag", text, ("{",), first_only=True)
    if not isinstance(document, dict):
        raise _error("dcgmi diag", "a JSON object", text)
    root = document.get("DCGM GPU Diagnostic", document.get("DCGM Diagnostic", document))
    if not isinstance(root, dict):
        raise _error("dcgmi diag", "a 'DCGM GPU Diagnostic' object", text)
    metadata = document.get("metadata")
    version = root.get("version") or (metadata.get("version")
                                      if isinstance(metadata, dict) else None)
    rows: list[dict[str, Any]] = []
    categories = root.get("test_categories") or [{"category": None,
                                                  "tests": root.get("tests") or []}]
    for category in categories:
        if not isinstance(category, dict):
            continue
        for test in category.get("tests") or []:
            if not isinstance(test, dict):
                continue
            for result in test.get("results") or []:
                if not isinstance(result, dict):
                    continue
                info = "; ".join([*_dcgm_messages(result.get("warnings")),
                                  *_dcgm_messages(result.get("info"))])
                rows.extend({"name": str(test.get("name")), "category": category.get("category"),
                             "gpu": gpu, "status": str(result.get("status", "")).upper(),
                             "info": info}
                            for gpu in _dcgm_entities(result, text))
    if not rows and not root.get("runtime_error"):
        raise _error("dcgmi diag", "test results", text)
    return {"tests": rows, "version": None if version is None else str(version),
            "error": root.get("runtime_error") or document.get("runtime_error")}


_DCGM_GPU_IDS = re.compile(r"^\d+(?:\s*,\s*\d+)*$")


def _dcgm_entities(result: dict[str, Any], text: str) -> list[str | None]:
    """The GPUs one diag result stands for: DCGM 3's ``gpu_ids`` ("0,1,2", or one number),
    DCGM 4's ``entity_id`` (prefixed with its group when that is not GPU)."""
    ids = result.get("gpu_ids", result.get("gpu_id"))
    if ids is not None:
        if isinstance(ids, bool) or not _DCGM_GPU_IDS.match(str(ids).strip()):
            raise _error("dcgmi diag", "gpu_ids such as '0' or '0,1,2'", text)
        return [gpu.strip() for gpu in str(ids).split(",")]
    entity = result.get("entity_id")
    if entity is None:
        return [None]
    group = result.get("entity_group")
    return [str(entity) if group in (None, "GPU") else f"{group} {entity}"]


def _dcgm_messages(value: Any) -> list[str]:
    """A result's ``warnings`` or ``info``: a string, or a list of strings or of objects
    with their text under ``warning`` (DCGM 4) or ``message``."""
    if value is None or value == "":
        return []
    items = value if isinstance(value, list) else [value]
    return [str(item.get("warning", item.get("message", json.dumps(item))))
            if isinstance(item, dict) else str(item) for item in items]


_OFED = re.compile(r"^(?:MLNX_OFED_LINUX|OFED-internal|OFED)-([0-9][0-9A-Za-z.\-]*?):?$")


def ofed_version(text: str) -> str:
    """The OFED / DOCA-OFED version from ``ofed_info -s`` ("24.10-1.1.4.0")."""
    for line in _output_lines(text):
        if match := _OFED.match(line.strip()):
            return match.group(1)
    raise _error("ofed_info -s", "'MLNX_OFED_LINUX-X.Y-Z:' or 'OFED-internal-X.Y-Z:'", text)


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
