"""The JSON that ``ansible-inventory --list`` prints, as an inventory.

``ansible-inventory -i SOURCE --list --output FILE.json`` runs every inventory plugin,
vault decryption and ``group_vars/`` lookup that Ansible supports, so its output lets
gpufleet use inventories it cannot read itself (dynamic inventory plugins, vault). The
document maps group names to ``hosts``, ``children`` and ``vars`` (or to a plain list of
hosts) and holds host variables under ``_meta.hostvars``; with ``--export`` group variables
stay on their groups. Values Ansible marks unsafe (``{"__ansible_unsafe": ...}``) are never
templated. ansible-inventory decrypts files encrypted with ansible-vault but leaves inline
``!vault`` values encrypted (``{"__ansible_vault": ...}``); those are refused.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from gpufleet.errors import InventoryError
from gpufleet.inventory.files import Limits, Where
from gpufleet.inventory.read_yaml import Unsafe

__all__ = ["JsonGroup", "JsonInventory", "read_json"]

_GROUP_KEYS = frozenset({"hosts", "children", "vars"})
_VAULT = "__ansible_vault"
_UNSAFE = "__ansible_unsafe"


@dataclass
class JsonGroup:
    """One group of the document."""

    hosts: list[str] = field(default_factory=list)
    children: list[str] = field(default_factory=list)
    vars: dict[str, Any] = field(default_factory=dict)


@dataclass
class JsonInventory:
    """Groups in document order and every host's variables."""

    groups: dict[str, JsonGroup]
    hostvars: dict[str, dict[str, Any]]


def _looks_like_listing(document: Any) -> bool:
    if not isinstance(document, dict):
        return False
    if "_meta" in document:
        return True
    return any(isinstance(value, list) or (isinstance(value, dict) and (
        isinstance(value.get("hosts"), list) or isinstance(value.get("children"), list)))
        for value in document.values())


def _depth(value: Any) -> int:
    deepest = 0
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        children = item.values() if isinstance(item, dict) else item if isinstance(
            item, list) else ()
        stack.extend((child, depth + 1) for child in children)
    return deepest


def _names(value: Any, where: Where, what: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise where.error(f"{what} must be a list of names")
    return list(value)


def _value(value: Any, where: Where, key: str) -> Any:
    if isinstance(value, dict):
        if set(value) == {_VAULT}:
            raise InventoryError(f"vault-encrypted value in {where} (variable {key}): "
                                 "ansible-inventory keeps inline !vault values encrypted; "
                                 "keep the secret in a file encrypted with ansible-vault, "
                                 "which ansible-inventory --list decrypts")
        if set(value) == {_UNSAFE} and isinstance(value[_UNSAFE], str):
            return Unsafe(value[_UNSAFE])
        return {name: _value(item, where, key) for name, item in value.items()}
    if isinstance(value, list):
        return [_value(item, where, key) for item in value]
    return value


def _vars(value: Any, where: Where, what: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise where.error(f"{what} must be a mapping")
    return {key: _value(item, where, key) for key, item in value.items()}


def _group(name: str, body: Any, where: Where) -> JsonGroup:
    if isinstance(body, list):
        return JsonGroup(hosts=_names(body, where, f"group '{name}'"))
    if not isinstance(body, dict):
        raise where.error(f"group '{name}' must be a mapping of hosts, children and vars")
    unknown = sorted(set(body) - _GROUP_KEYS)
    if unknown:
        raise where.error(f"unexpected key '{unknown[0]}' in group '{name}' "
                          "(expected hosts, children or vars)")
    return JsonGroup(hosts=_names(body.get("hosts", []), where, f"hosts of group '{name}'"),
                     children=_names(body.get("children", []), where,
                                     f"children of group '{name}'"),
                     vars=_vars(body.get("vars"), where, f"vars of group '{name}'"))


def read_json(text: str, where: Where, bounds: Limits) -> JsonInventory | None:
    """The inventory in an ``ansible-inventory --list`` document, or None when the JSON is
    an ordinary YAML-style inventory (groups mapping to ``hosts:`` mappings)."""
    try:
        document = json.loads(text)
    except RecursionError:
        raise where.error(f"nested more than {bounds.max_depth} levels deep "
                          "(GPUFLEET_MAX_INVENTORY_DEPTH)") from None
    except ValueError:
        return None
    if not _looks_like_listing(document):
        return None
    if _depth(document) > bounds.max_depth:
        raise where.error(f"nested more than {bounds.max_depth} levels deep "
                          "(GPUFLEET_MAX_INVENTORY_DEPTH)")
    meta = document.get("_meta", {})
    hostvars = meta.get("hostvars", {}) if isinstance(meta, dict) else None
    if not isinstance(hostvars, dict):
        raise where.error("_meta.hostvars must be a mapping of hosts to their variables")
    groups = {name: _group(name, body, where) for name, body in document.items()
              if name != "_meta"}
    return JsonInventory(groups, {host: _vars(values, where, f"_meta.hostvars of '{host}'")
                                  for host, values in hostvars.items()})
