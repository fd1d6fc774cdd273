"""Kernel modules as the node's tools report them: ``modinfo`` (kmod) and ``dkms status``,
whose line changed in dkms 3 (``nvidia, 535.104.05, K, ARCH: STATE`` before,
``nvidia/535.104.05, K, ARCH: STATE`` since; Ubuntu 22.04's 2.8.7 already prints the
newer one)."""

from __future__ import annotations

import re
from typing import Any

from gpufleet.facts.parsers._capture import _error, _output_lines

_MODINFO_FIELD = re.compile(r"^([a-z_][a-z0-9_.]*):\s*(.*)$")
_DKMS_NEW = re.compile(r"^(?P<module>[^,/\s]+)/(?P<version>[^,\s]+)"
                       r"(?:, (?P<kernel>[^,\s]+), (?P<arch>[^,:\s]+))?: (?P<state>.+)$")
_DKMS_OLD = re.compile(r"^(?P<module>[^,/\s]+), (?P<version>[^,\s]+)"
                       r"(?:, (?P<kernel>[^,\s]+), (?P<arch>[^,:\s]+))?: (?P<state>.+)$")
DKMS_STATES = ("added", "built", "installed")
_DKMS_NOTE = re.compile(r"^(Error!|Warning:|WARNING:|Error:|File: |Deprecated feature)")


def modinfo(text: str) -> dict[str, Any]:
    """Parse ``modinfo MODULE``: each field by name, a string, or a list where the field
    repeats (``alias``, ``parm``, ``firmware``); a signature's indented lines join its
    first. ``modinfo: ERROR: ...`` (no such module for that kernel) is a ParseError naming
    it."""
    fields: dict[str, Any] = {}
    last: str | None = None
    for line in _output_lines(text):
        if line[0] in " \t" and last is not None:  # a signature's next bytes
            value = fields[last]
            if isinstance(value, list):
                value[-1] += line.strip()
            else:
                fields[last] = value + line.strip()
            continue
        if line.startswith("modinfo:"):
            raise _error("modinfo", "a module's fields", line)
        match = _MODINFO_FIELD.match(line)
        if not match:
            raise _error("modinfo", "'field: value' lines", line)
        name, value = match.group(1), match.group(2).rstrip()
        last = name
        if name not in fields:
            fields[name] = value
        elif isinstance(fields[name], list):
            fields[name].append(value)
        else:
            fields[name] = [fields[name], value]
    if "filename" not in fields and "vermagic" not in fields:
        raise _error("modinfo", "a filename or vermagic field", text)
    return fields


def vermagic_release(vermagic: str) -> str:
    """The kernel release a module was built for: the first word of its vermagic
    (``6.8.0-90-generic SMP preempt mod_unload modversions``)."""
    words = vermagic.split()
    if not words:
        raise _error("modinfo", "a vermagic that starts with a kernel release", vermagic)
    return words[0]


def dkms_status(text: str) -> dict[str, Any]:
    """Parse ``dkms status``: ``modules``, one entry per line (``module``, ``version``,
    ``kernel`` and ``arch``, None for a module only added, ``state``: added, built or
    installed, and ``note``, what dkms adds in parentheses), and ``notes``, the errors and
    warnings dkms printed beside them (``Error! Could not locate dkms.conf file.``)."""
    modules: list[dict[str, Any]] = []
    notes: list[str] = []
    for line in _output_lines(text):
        stripped = line.strip()
        if _DKMS_NOTE.match(stripped):
            notes.append(stripped)
            continue
        match = _DKMS_NEW.match(stripped) or _DKMS_OLD.match(stripped)
        if not match:
            raise _error("dkms status", "'MODULE/VERSION, KERNEL, ARCH: STATE' lines", line)
        state, _, note = match.group("state").partition(" ")
        if state.rstrip(",") not in DKMS_STATES:
            raise _error("dkms status", f"a state of {', '.join(DKMS_STATES)}", line)
        modules.append({"module": match.group("module"), "version": match.group("version"),
                        "kernel": match.group("kernel"), "arch": match.group("arch"),
                        "state": state.rstrip(","), "note": note.strip("() ") or None})
    return {"modules": modules, "notes": notes}
