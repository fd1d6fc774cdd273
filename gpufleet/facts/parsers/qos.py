"""``mlnx_qos -i IFACE`` and iproute2's ``dcb [-j] [-s] pfc show``: an RDMA NIC's trust
state, DSCP map, traffic classes and the priorities with PFC on; and the roce_qos role's fact,
which carries their output per port with the port's ECN settings."""

from __future__ import annotations

import base64
import re
from collections.abc import Callable
from typing import Any

from gpufleet.errors import ParseError
from gpufleet.facts.parsers._capture import _error, _int, _json_document, _lines, _output_lines

_PRIORITIES = range(8)


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


def roce_qos_fact(text: str) -> dict[str, Any]:
    """The ``roce_qos`` fact: ``tool TOOL`` (``mlnx_qos``, ``dcb`` or ``none``), then per port
    ``port NAME RC BASE64`` (the tool's output, ``mlnx_qos -i NAME`` or ``dcb -j pfc show dev
    NAME``, and its exit status) and ``ecn NAME roce_np|roce_rp PRIO 0|1`` lines.

    Returns ``tool`` and ``ports``: NAME -> ``trust`` (None under dcb), ``pfc`` (sorted
    priorities with PFC on), ``ecn`` (prio -> (roce_np, roce_rp), None for one not read)
    and ``error`` (why the
    tool's view is missing, else None). A port whose tool output is unreadable keeps its
    error; the others are read.
    """
    tool: str | None = None
    ports: dict[str, dict[str, Any]] = {}
    for line in _output_lines(text):
        fields = line.split()
        if fields[0] == "tool" and len(fields) == 2:
            tool = fields[1]
        elif fields[0] == "port" and len(fields) in (3, 4):
            name, rc = fields[1], _int("roce_qos", fields[2], line)
            try:
                output = base64.b64decode(fields[3] if len(fields) == 4 else "",
                                          validate=True).decode(errors="replace")
            except ValueError:
                raise _error("roce_qos", "base64 tool output", line) from None
            ports[name] = _roce_port(tool, rc, output)
        elif fields[0] == "ecn" and len(fields) == 5 and fields[2] in ("roce_np", "roce_rp") \
                and fields[4] in ("0", "1"):
            port = ports.setdefault(fields[1], _roce_port(tool, 127, ""))
            prio = _int("roce_qos", fields[3], line)
            np_rp: list[bool | None] = list(port["ecn"].get(prio, (None, None)))
            np_rp[fields[2] == "roce_rp"] = fields[4] == "1"
            port["ecn"][prio] = (np_rp[0], np_rp[1])
        else:
            raise _error("roce_qos", "tool, port or ecn lines", line)
    if tool is None:
        raise _error("roce_qos", "a 'tool' line", text)
    return {"tool": tool, "ports": ports}


def _roce_port(tool: str | None, rc: int, output: str) -> dict[str, Any]:
    """One port's trust and PFC from its tool's output, or why they are unknown."""
    port: dict[str, Any] = {"trust": None, "pfc": None, "ecn": {}, "error": None}
    if tool not in ("mlnx_qos", "dcb"):
        port["error"] = "neither mlnx_qos nor dcb on the node"
    elif rc != 0:
        last = [line.strip() for line in output.splitlines() if line.strip()]
        port["error"] = f"{tool} failed (exit {rc}): {last[-1] if last else 'no output'}"
    else:
        try:
            if tool == "mlnx_qos":
                parsed = mlnx_qos(output)
                port["trust"], port["pfc"] = parsed["trust"], parsed["pfc_enabled"]
            else:
                port["pfc"] = dcb_pfc_json(output)["prio_pfc"]
        except ParseError as exc:
            port["error"] = f"{tool} output unreadable: {exc}"
    return port
