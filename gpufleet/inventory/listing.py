"""What gpufleet resolved from an inventory, shown without contacting any host: the
``ansible-inventory --list`` document, the ``--graph`` tree, and one host's merged
variables with where each is set. Templates are rendered and secrets redacted, as every
report does."""

from __future__ import annotations

import math
from collections.abc import Callable
from json.encoder import encode_basestring_ascii
from typing import Any

from gpufleet.inventory.model import Host, Inventory
from gpufleet.inventory.read_yaml import Unsafe
from gpufleet.inventory.secrets import MASK, is_secret_name, redact

ALL, UNGROUPED = "all", "ungrouped"
_PLAIN = frozenset({int, float, bool, type(None)})  # shown as they are


def _safe(key: str, value: Any) -> Any:
    """A value as shown: a secret's value masked, secrets inside text redacted, unsafe
    strings as plain strings."""
    if is_secret_name(key) and value not in (None, ""):
        return MASK
    if type(value) in _PLAIN:
        return value
    if isinstance(value, str):
        return redact(str(value) if isinstance(value, Unsafe) else value)
    if isinstance(value, dict):
        return {k: _safe(str(k), v) for k, v in value.items()}
    if isinstance(value, list):
        return [_safe(key, v) for v in value]
    return value


def host_vars(host: Host) -> dict[str, Any]:
    """The host's merged variables, rendered, secrets masked, sorted by name."""
    return {key: _safe(key, host.vars[key]) for key in sorted(host.vars)}


def origins(host: Host) -> dict[str, str | None]:
    """Where each of the host's variables is set (``file:line``), by name."""
    return {key: host.origin(key) for key in sorted(host.vars)}


def _ungrouped(inventory: Inventory) -> list[str]:
    grouped = set().union(*(members for group, members in inventory.groups.items()
                            if group not in (ALL, UNGROUPED)))
    return [name for name in inventory.hosts if name not in grouped]


def _top_groups(inventory: Inventory) -> list[str]:
    children = inventory.children(ALL)
    if children:
        return [c for c in children if c != UNGROUPED]
    nested = {c for g in inventory.groups for c in inventory.children(g)}
    return [g for g in inventory.groups if g not in (ALL, UNGROUPED) and g not in nested]


def listing(inventory: Inventory) -> dict[str, Any]:
    """The ``ansible-inventory --list`` document: each group's own hosts and children,
    ``all`` with ``ungrouped`` first, and every host's variables under ``_meta``."""
    doc: dict[str, Any] = {"_meta": {"hostvars": {
        name: host_vars(host) for name, host in inventory.hosts.items() if host.vars}}}
    groups: dict[str, Any] = {ALL: {"children": [UNGROUPED, *_top_groups(inventory)]}}
    ungrouped = _ungrouped(inventory)
    if ungrouped:
        groups[UNGROUPED] = {"hosts": ungrouped}
    for group in inventory.groups:
        if group in (ALL, UNGROUPED):
            continue
        body: dict[str, Any] = {}
        if inventory.own_hosts(group):
            body["hosts"] = inventory.own_hosts(group)
        if inventory.children(group):
            body["children"] = inventory.children(group)
        if body:
            groups[group] = body
    doc.update(sorted(groups.items()))
    return doc


def graph(inventory: Inventory) -> str:
    """The group tree as ``ansible-inventory --graph`` draws it."""
    lines = [f"@{ALL}:"]

    def walk(group: str, depth: int) -> None:
        prefix = "  |" * depth + "--"
        lines.append(f"{prefix}@{group}:")
        for child in (_top_groups(inventory) if group == ALL else inventory.children(group)):
            walk(child, depth + 1)
        hosts = _ungrouped(inventory) if group == UNGROUPED else inventory.own_hosts(group)
        lines.extend("  |" * (depth + 1) + f"--{host}" for host in hosts)

    walk(UNGROUPED, 1)
    for group in _top_groups(inventory):
        walk(group, 1)
    return "\n".join(lines) + "\n"


# The listing as JSON -------------------------------------------------------------------------

_INDENT = "    "


def dumps(document: Any) -> str:
    """``json.dumps(document, indent=4, default=str)``, the same text written without the
    pure-Python encoder's generators (the C encoder does not indent)."""
    out: list[str] = []
    _encode(document, out, "\n")
    return "".join(out)


def _float(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return float.__repr__(value)


# The JSON of a value of exactly these types (a subclass is written as json.dumps does).
_SCALARS: dict[type, Callable[[Any], str]] = {
    str: encode_basestring_ascii, int: int.__repr__, float: _float,
    bool: lambda value: "true" if value else "false", type(None): lambda value: "null"}


def _scalar(value: Any) -> str | None:
    """The JSON of a string, number, boolean or null; None for anything else."""
    if isinstance(value, str):
        return encode_basestring_ascii(value)
    if value is None or value is True or value is False:
        return "null" if value is None else "true" if value else "false"
    if isinstance(value, int):
        return int.__repr__(value)
    if isinstance(value, float):
        return _float(value)
    return None


def _key(key: Any) -> str:
    if isinstance(key, str):
        return encode_basestring_ascii(key)
    if isinstance(key, (int, float)) or key is None:  # bool is an int
        return encode_basestring_ascii(_scalar(key) or "")
    raise TypeError(f"keys must be str, int, float, bool or None, not {type(key).__name__}")


def _encode(value: Any, out: list[str], newline: str) -> None:
    """Append the JSON of ``value``, its lines after the first starting with ``newline``."""
    text = _scalar(value)
    if text is not None:
        out.append(text)
        return
    if not isinstance(value, (dict, list, tuple)):
        _encode(str(value), out, newline)  # json.dumps's default=str
        return
    if not value:
        out.append("{}" if isinstance(value, dict) else "[]")
        return
    inner = newline + _INDENT
    scalars = _SCALARS
    if isinstance(value, dict):
        separator = "{" + inner
        for key, item in value.items():
            name = encode_basestring_ascii(key) if type(key) is str else _key(key)
            write = scalars.get(type(item))
            if write is not None:
                out.append(separator + name + ": " + write(item))
            else:
                out.append(separator + name + ": ")
                _encode(item, out, inner)
            separator = "," + inner
        out.append(newline + "}")
        return
    separator = "[" + inner
    for item in value:
        write = scalars.get(type(item))
        if write is not None:
            out.append(separator + write(item))
        else:
            out.append(separator)
            _encode(item, out, inner)
        separator = "," + inner
    out.append(newline + "]")
