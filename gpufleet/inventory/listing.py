"""What gpufleet resolved from an inventory, shown without contacting any host: the
``ansible-inventory --list`` document, the ``--graph`` tree, and one host's merged
variables with where each is set. Templates are rendered and secrets redacted, as every
report does."""

from __future__ import annotations

from typing import Any

from gpufleet.inventory.model import Host, Inventory
from gpufleet.inventory.read_yaml import Unsafe
from gpufleet.inventory.secrets import MASK, is_secret_name, redact

ALL, UNGROUPED = "all", "ungrouped"


def _safe(key: str, value: Any) -> Any:
    """A value as shown: a secret's value masked, secrets inside text redacted, unsafe
    strings as plain strings."""
    if is_secret_name(key) and value not in (None, ""):
        return MASK
    if isinstance(value, dict):
        return {k: _safe(str(k), v) for k, v in value.items()}
    if isinstance(value, list):
        return [_safe(key, v) for v in value]
    if isinstance(value, Unsafe):
        return redact(str(value))
    if isinstance(value, str):
        return redact(value)
    return value


def host_vars(host: Host) -> dict[str, Any]:
    """The host's merged variables, rendered, secrets masked, sorted by name."""
    return {key: _safe(key, host.vars[key]) for key in sorted(host.vars)}


def origins(host: Host) -> dict[str, str | None]:
    """Where each of the host's variables is set (``file:line``), by name."""
    return {key: host.origin(key) for key in sorted(host.vars)}


def _ungrouped(inventory: Inventory) -> list[str]:
    return [name for name in inventory.hosts
            if not any(name in members for group, members in inventory.groups.items()
                       if group not in (ALL, UNGROUPED))]


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
