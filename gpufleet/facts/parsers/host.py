"""The host's performance state as sysfs and procfs show it, read with ``grep -H ''``
(``PATH:LINE`` per line, as ``grep . FILES`` prints it): the CPU frequency governors, the
cpuidle driver and its C-state limit, automatic NUMA balancing, transparent huge pages, the
neighbour table thresholds, the ARP sysctls of interfaces; and ``/proc/swaps`` and the swap
entries of ``/etc/fstab``."""

from __future__ import annotations

import re
from typing import Any

from gpufleet.facts.parsers._capture import _error, _int, _is_capture_note, _lines

_CPU_GOVERNOR = re.compile(r"^/sys/devices/system/cpu/cpu(\d+)/cpufreq/scaling_governor$")
_NET_CONF = re.compile(r"^/proc/sys/net/ipv4/conf/([^/]+)/(arp_ignore|arp_announce|rp_filter)$")
_GC_THRESH = re.compile(r"^/proc/sys/net/ipv4/neigh/default/gc_thresh([123])$")
_SELECTED = re.compile(r"\[([^\]\s]+)\]")
_OCTAL = re.compile(r"\\([0-7]{3})")
SWAPS = "/proc/swaps"
FSTAB = "/etc/fstab"
_SINGLE = {
    "/sys/devices/system/cpu/cpu0/cpufreq/scaling_driver": "cpufreq_driver",
    "/sys/devices/system/cpu/cpu0/cpufreq/scaling_available_governors": "available_governors",
    "/proc/sys/kernel/numa_balancing": "numa_balancing",
    "/sys/kernel/mm/transparent_hugepage/enabled": "thp_enabled",
    "/sys/kernel/mm/transparent_hugepage/defrag": "thp_defrag",
    "/sys/devices/system/cpu/cpuidle/current_driver": "cpuidle_driver",
    "/sys/module/intel_idle/parameters/max_cstate": "intel_idle_max_cstate",
    "/sys/module/processor/parameters/max_cstate": "processor_max_cstate",
    "/proc/cmdline": "cmdline",
}


def grep_lines(text: str) -> list[tuple[str, str]]:
    """``(path, line)`` of each line ``grep -H '' FILES`` (or ``grep . FILES``) printed; the
    path is everything before the first ``:`` (sysfs and procfs paths hold none)."""
    pairs = []
    for line in _lines(text):
        if not line.strip() or _is_capture_note(line):
            continue
        path, sep, value = line.partition(":")
        if not sep or not path.startswith("/"):
            raise _error("grep -H", "'PATH:LINE' lines", line)
        pairs.append((path, value))
    return pairs


def selected(value: str, source: str) -> str:
    """The bracketed choice of a sysfs file that lists its choices (``always [madvise]
    never``: ``madvise``)."""
    found = _SELECTED.findall(value)
    if len(found) != 1:
        raise _error(source, "one [choice] among the choices", value)
    return str(found[0])


def proc_swaps(text: str) -> list[dict[str, Any]]:
    """``/proc/swaps``: each active swap's ``name`` (the kernel's ``\\040`` escapes decoded),
    ``type``, ``size_kib``, ``used_kib`` and ``priority``; [] under the header alone. A text
    without the header is refused (not read as "no swap")."""
    lines = [line for line in _lines(text) if line.strip() and not _is_capture_note(line)]
    if not lines or lines[0].split()[:2] != ["Filename", "Type"]:
        raise _error(SWAPS, "the 'Filename Type Size Used Priority' header", text)
    swaps = []
    for line in lines[1:]:
        fields = line.split()
        if len(fields) != 5:
            raise _error(SWAPS, "'NAME TYPE SIZE USED PRIORITY' rows", line)
        name = _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), fields[0])
        swaps.append({"name": name, "type": fields[1],
                      "size_kib": _int(SWAPS, fields[2], line),
                      "used_kib": _int(SWAPS, fields[3], line),
                      "priority": _int(SWAPS, fields[4], line)})
    return swaps


def fstab_swaps(lines: list[tuple[int, str]]) -> list[dict[str, Any]]:
    """The swap entries of ``/etc/fstab`` (its numbered lines): ``line`` and ``spec`` of each
    uncommented entry whose type is ``swap``."""
    found = []
    for number, line in lines:
        fields = line.split()
        if len(fields) >= 3 and not fields[0].startswith("#") and fields[2] == "swap":
            found.append({"line": number, "spec": fields[0]})
    return found


def host_state(text: str, root: str = "") -> dict[str, Any]:
    """The host-state fact: ``grep -H ''`` over the files under ``root`` (the lab's stand-in
    of the kernel's host-wide state; empty on a real node), the interfaces' ARP sysctls and
    ``/etc/fstab``.

    Keys: ``governors`` (CPU -> governor; {} without cpufreq), ``cpufreq_driver``,
    ``available_governors``, ``numa_balancing`` (None where the kernel has none),
    ``thp_enabled``, ``thp_defrag``, ``cpuidle_driver``, ``intel_idle_max_cstate``,
    ``processor_max_cstate``, ``cmdline``, ``gc_thresh`` ({1: N, 2: N, 3: N}; {} where this
    network namespace has no default neighbour table), ``net`` (interface -> sysctl ->
    value), ``swaps`` (:func:`proc_swaps`) and ``fstab_swaps``. A missing file is None, never
    a default; the fact is refused without ``/proc/swaps``.
    """
    state: dict[str, Any] = {key: None for key in _SINGLE.values()}
    state.update(governors={}, gc_thresh={}, net={})
    swaps: list[str] = []
    fstab: list[tuple[int, str]] = []
    for full, value in grep_lines(text):
        if full == FSTAB:
            fstab.append((len(fstab) + 1, value))
        elif match := _NET_CONF.match(full):  # per network namespace: never under the root
            state["net"].setdefault(match.group(1), {})[match.group(2)] = \
                _int("sysctl", value.strip(), value)
        elif root and not full.startswith(root + "/"):
            raise _error("host state", f"paths under {root}", f"{full}:{value}")
        elif full.removeprefix(root) == SWAPS:
            swaps.append(value)
        else:
            _record(state, full.removeprefix(root), value)
    if not swaps:
        raise _error("host state", f"{root}{SWAPS}", text)
    state["swaps"] = proc_swaps("\n".join(swaps))
    state["fstab_swaps"] = fstab_swaps(fstab)
    for key in ("numa_balancing", "intel_idle_max_cstate", "processor_max_cstate"):
        if state[key] is not None:
            state[key] = _int(key, state[key], state[key])
    if state["available_governors"] is not None:
        state["available_governors"] = state["available_governors"].split()
    for key in ("thp_enabled", "thp_defrag"):
        if state[key] is not None:
            state[key] = selected(state[key], key)
    return state


def _record(state: dict[str, Any], path: str, value: str) -> None:
    """Keep one line of a state file (a CPU's governor, a threshold, a single-line file); a
    file the fact does not read is refused (a line it cannot place is never dropped)."""
    if match := _CPU_GOVERNOR.match(path):
        state["governors"][int(match.group(1))] = value.strip()
    elif match := _GC_THRESH.match(path):
        state["gc_thresh"][int(match.group(1))] = _int("sysctl", value.strip(), value)
    elif path in _SINGLE:
        state[_SINGLE[path]] = value.strip()
    else:
        raise _error("host state", "a file the fact reads", f"{path}:{value}")
