"""The inventory model: ``Host`` (its merged variables, its groups, the connection settings
read from them) and ``Inventory`` (hosts and groups in Ansible's order). ``load`` fills it
from YAML, INI, ``ansible-inventory --list`` JSON, or a directory of them.

Hosts, groups, ``group_vars/`` and ``host_vars/`` are read with Ansible's semantics so that
existing inventories work unchanged; docs/inventory.md lists every place where gpufleet
differs and why. Every problem in the input becomes an InventoryError that names the file
and, where known, the line. Each host variable remembers where its value was set, so a
template that cannot be rendered is reported at that place.
"""

from __future__ import annotations

import copy
import hashlib
import os
from collections.abc import Callable, Hashable, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from gpufleet.errors import InventoryError
from gpufleet.inventory.files import read_bytes
from gpufleet.inventory.hosts import parse_port
from gpufleet.inventory.patterns import select_hosts
from gpufleet.inventory.templating import HostVars
from gpufleet.inventory.variables import (
    invalid_setting,
    parse_args,
    parse_bool,
    parse_connection,
    parse_path,
)

__all__ = ["Host", "Inventory"]

_T = TypeVar("_T")


@dataclass
class Host:
    """One inventory host: its fully merged variables and every group it belongs to."""

    name: str
    vars: MutableMapping[str, Any]
    groups: frozenset[str]

    def origin(self, key: str) -> str | None:
        """Where the variable's value is set (``file:line``), when the inventory knows."""
        return self.vars.origin(key) if isinstance(self.vars, HostVars) else None

    def _setting(self, parse: Callable[[Any], _T], keys: tuple[str, ...], default: _T) -> _T:
        for key in keys:
            value = self.vars.get(key)
            if value is not None:
                try:
                    return parse(value)
                except ValueError as exc:
                    where = self.origin(key)
                    place = f" ({where})" if where else ""
                    problem = invalid_setting(key, value, exc)
                    raise InventoryError(f"host '{self.name}'{place}: {problem}") from None
        return default

    @property
    def address(self) -> str:
        """Where to connect: ansible_ssh_host, else ansible_host, else the name (the legacy
        name wins, as it does for Ansible's ssh connection)."""
        return self._setting(str, ("ansible_ssh_host", "ansible_host"), self.name)

    @property
    def port(self) -> int:
        """SSH port: ansible_ssh_port, else ansible_port (also set by ``host:port``), else 22."""
        return self._setting(parse_port, ("ansible_ssh_port", "ansible_port"), 22)

    @property
    def user(self) -> str | None:
        """Remote user: ansible_ssh_user, else ansible_user; None means the controller's
        user, as ssh does."""
        return self._setting(str, ("ansible_ssh_user", "ansible_user"), None)

    @property
    def password(self) -> str | None:
        """SSH password: ansible_ssh_password, ansible_ssh_pass, else ansible_password."""
        keys = ("ansible_ssh_password", "ansible_ssh_pass", "ansible_password")
        return self._setting(str, keys, None)

    @property
    def connection(self) -> str:
        """Either "ssh" or "local"; paramiko and smart count as ssh."""
        return self._setting(parse_connection, ("ansible_connection",), "ssh")

    @property
    def private_key_file(self) -> str | None:
        """SSH private key (ansible_ssh_private_key_file or ansible_private_key_file)."""
        keys = ("ansible_ssh_private_key_file", "ansible_private_key_file")
        return self._setting(parse_path, keys, None)

    @property
    def become(self) -> bool:
        """Whether commands run with privilege escalation (ansible_become)."""
        return self._setting(parse_bool, ("ansible_become",), False)

    @property
    def become_user(self) -> str:
        """The user to become (ansible_become_user), root by default."""
        return self._setting(str, ("ansible_become_user",), "root")

    @property
    def ssh_common_args(self) -> list[str]:
        """Extra ssh arguments: ansible_ssh_common_args then ansible_ssh_extra_args."""
        none: list[str] = []
        common = self._setting(parse_args, ("ansible_ssh_common_args",), none)
        return common + self._setting(parse_args, ("ansible_ssh_extra_args",), none)


@dataclass
class Inventory:
    """Hosts and groups loaded from an inventory file or directory.

    ``groups`` maps every group to all its hosts, children included; ``group_hosts`` gives
    them in Ansible's order.
    """

    path: Path
    hosts: dict[str, Host]
    groups: dict[str, set[str]]
    sources: list[Path]
    _group_vars: dict[str, dict[str, Any]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    _tree: dict[str, tuple[list[str], list[str]]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    _memo: dict[Hashable, Any] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def memo(self, key: Hashable, compute: Callable[[], _T]) -> _T:
        """``compute()`` once per inventory for ``key``: a value every host's plan shares
        (a cluster's address list) costs one computation per run, not one per host. A
        computation that raises is not remembered."""
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]  # type: ignore[no-any-return]

    def select(self, pattern: str | None = None) -> list[Host]:
        """Hosts matching an Ansible host pattern, in the order Ansible lists them."""
        names = select_hosts(pattern or "all", list(self.hosts), list(self.groups),
                             self.group_hosts)
        return [self.hosts[name] for name in names]

    def group_hosts(self, group: str) -> list[str]:
        """The group's hosts as Ansible orders them: its own hosts, then its children's,
        level by level, each level in the order the groups were declared."""
        if group not in self.groups:
            raise InventoryError(f"{self.path}: unknown group '{group}'")
        if not self._tree:
            return [name for name in self.hosts if name in self.groups[group]]
        order: list[str] = [group]
        seen = {group}
        level = [group]
        while level:
            following: list[str] = []
            for name in level:
                for child in self._tree[name][1]:
                    if child not in seen:
                        seen.add(child)
                        following.append(child)
            order.extend(following)
            level = following
        hosts: dict[str, None] = {}
        for name in order:
            hosts.update(dict.fromkeys(self._tree[name][0]))
        return list(hosts)

    def own_hosts(self, group: str) -> list[str]:
        """The hosts listed in the group itself (not through its children), in order."""
        if group not in self.groups:
            raise InventoryError(f"{self.path}: unknown group '{group}'")
        return list(self._tree[group][0]) if self._tree else []

    def children(self, group: str) -> list[str]:
        """The group's direct children, in declaration order."""
        if group not in self.groups:
            raise InventoryError(f"{self.path}: unknown group '{group}'")
        return list(self._tree[group][1]) if self._tree else []

    @property
    def base(self) -> Path:
        """The inventory's directory: where group_vars/, host_vars/ and known_hosts live."""
        return self.path if self.path.is_dir() else self.path.parent

    def digest(self) -> str:
        """SHA-256 over every source file's path (relative to the inventory) and bytes."""
        root = self.base
        entries = sorted((Path(os.path.relpath(src, root)).as_posix(), src) for src in self.sources)
        digest = hashlib.sha256()
        for relative, source in entries:
            data = read_bytes(source)
            digest.update(f"{relative}\0{len(data)}\0".encode())
            digest.update(data)
        return digest.hexdigest()

    def group_vars(self, group: str) -> dict[str, Any]:
        """Variables defined for the group itself: inventory file, then group_vars/."""
        if group not in self.groups:
            raise InventoryError(f"{self.path}: unknown group '{group}'")
        return copy.deepcopy(self._group_vars.get(group, {}))
