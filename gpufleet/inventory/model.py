"""Ansible-compatible static inventories: YAML, INI, ``ansible-inventory --list`` JSON, or a
directory of them.

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
import shlex
import unicodedata
from collections.abc import (
    Callable,
    Hashable,
    Iterable,
    Iterator,
    Mapping,
    MutableMapping,
    Sequence,
)
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from gpufleet.errors import InventoryError
from gpufleet.inventory.files import (
    Limits,
    Where,
    check_path_text,
    limits,
    list_dir,
    read_bytes,
    read_text,
)
from gpufleet.inventory.hosts import host_names, parse_port
from gpufleet.inventory.patterns import select_hosts
from gpufleet.inventory.read_ini import ChildLine, HostLine, Section, VarLine, read_ini
from gpufleet.inventory.read_json import JsonInventory, read_json
from gpufleet.inventory.read_yaml import Mapping as YamlMapping
from gpufleet.inventory.read_yaml import Vaulted, parse_yaml
from gpufleet.inventory.secrets import holds_secret, remember_secret
from gpufleet.inventory.templating import (
    Fleet,
    HostVars,
    SharedRenders,
    is_template,
    needs_render,
)

__all__ = ["Host", "Inventory", "load_inventory", "resolve_inventory"]

_T = TypeVar("_T")

_NAME_SUFFIXES = (".yml", ".yaml", ".ini")
_YAML_SUFFIXES = frozenset({".yml", ".yaml", ".json"})
_VARS_SUFFIXES = ("", ".yml", ".yaml", ".json")
_VARS_DIRS = frozenset({"group_vars", "host_vars"})
_IGNORED_SUFFIXES = (
    ".md", ".retry", ".pyc", ".pyo", ".swp", ".bak", ".orig", ".rst", ".txt", ".cfg", "~",
)  # fmt: skip
_SSH_ALIASES = frozenset({"ssh", "paramiko", "paramiko_ssh", "smart"})
_TRUE = frozenset({"yes", "true", "1"})
_FALSE = frozenset({"no", "false", "0"})
_ADDRESS_KEYS = ("ansible_host", "ansible_port")
_GROUP_SECTIONS = ("hosts", "children", "vars")
_VAULT_HINT = "gpufleet cannot decrypt vault; pass `ansible-inventory --list` JSON instead"
_PATH_KEYS = ("gpufleet_known_hosts", "ansible_ssh_private_key_file", "ansible_private_key_file")


# Connection settings -------------------------------------------------------------------------


def _parse_connection(value: Any) -> str:
    name = str(value).removeprefix("ansible.builtin.")
    if name == "local":
        return "local"
    if name in _SSH_ALIASES:
        return "ssh"
    raise ValueError("unknown connection type (supported: ssh, local)")


def _parse_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE or text in _FALSE:
        return text in _TRUE
    raise ValueError("expected a boolean (yes/no, true/false or 1/0)")


def _parse_path(value: Any) -> str:
    text = str(value)
    try:
        check_path_text(text, "the path")
    except InventoryError as exc:
        raise ValueError(str(exc)) from None
    return text


def ssh_option(args: list[str], name: str) -> str | None:
    """The value of ``-o Name=value`` (or ``-J value`` for ProxyJump) in ssh arguments."""
    key = name.lower() + "="
    for index, arg in enumerate(args):
        candidate = args[index + 1] if arg == "-o" and index + 1 < len(args) else arg
        candidate = candidate[2:] if candidate.startswith("-o") else candidate
        if candidate.lower().startswith(key):
            return candidate.split("=", 1)[1]
        if name == "ProxyJump" and arg == "-J" and index + 1 < len(args):
            return args[index + 1]
        if name == "ProxyJump" and arg.startswith("-J") and len(arg) > 2:
            return arg[2:]
    return None


def parse_jump(value: str) -> tuple[str | None, str, int] | None:
    """A ProxyJump value as (user, host, port); None for ``none``. One hop only."""
    if value.lower() == "none":
        return None
    if "," in value:
        raise ValueError("multi-hop ProxyJump is not supported (one [user@]host[:port] only)")
    text = value.removeprefix("ssh://")
    user, at, rest = text.rpartition("@")
    if at and not user:
        raise ValueError("empty user before '@'")
    if rest.startswith("["):
        address, _, port_text = rest[1:].partition("]")
        port_text = port_text.removeprefix(":")
    else:
        address, _, port_text = rest.partition(":")
    if not address or any(char.isspace() or char in "/'\"`$;&|<>" for char in address):
        raise ValueError("expected [user@]host[:port]")
    port = parse_port(port_text) if port_text else 22
    return (user or None), address, port


def _parse_args(value: Any) -> list[str]:
    try:
        args = shlex.split(str(value))
    except ValueError as exc:
        raise ValueError(f"cannot split into arguments: {exc}") from None
    jump = ssh_option(args, "ProxyJump")
    if jump is not None:
        try:
            parse_jump(jump)
        except ValueError as exc:
            raise ValueError(f"ProxyJump '{jump}': {exc}") from None
    known = ssh_option(args, "UserKnownHostsFile")
    if known is not None:
        for path in known.split():
            _parse_path(path)
    return args


_CHECKS: dict[str, Callable[[Any], object]] = {
    "ansible_port": parse_port,
    "ansible_ssh_port": parse_port,
    "ansible_connection": _parse_connection,
    "ansible_become": _parse_bool,
    "ansible_ssh_common_args": _parse_args,
    "ansible_ssh_extra_args": _parse_args,
    **{key: _parse_path for key in _PATH_KEYS},
}


def _problem(key: str, value: Any, reason: object) -> str:
    return f"invalid {key} {value!r}: {reason}"


def _kind(value: Any) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return "a string"
    return type(value).__name__


@dataclass
class _Vars:
    """Variables set in one place, with the line each one is set on where known."""

    values: dict[str, Any]
    where: Where
    lines: Mapping[str, int] = field(default_factory=dict)

    def where_of(self, key: str) -> Where:
        return self.where.at(self.lines.get(key, self.where.line))

    def origins(self) -> dict[str, str]:
        """``str(self.where_of(key))`` of every key."""
        file, default, lines = str(self.where.file), self.where.line, self.lines
        return {key: f"{file}:{line}" if (line := lines.get(key, default)) else file
                for key in self.values}

    def check(self) -> None:
        """Reject connection settings gpufleet cannot use, at the line that sets them (a
        template is checked once rendered, when the host's setting is read)."""
        for key, value in self.values.items():
            check = _CHECKS.get(key)
            if check is None or value is None or is_template(value):
                continue
            try:
                check(value)
            except ValueError as exc:
                raise self.where_of(key).error(_problem(key, value, exc)) from None


# Public model ------------------------------------------------------------------------------


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
                    problem = _problem(key, value, exc)
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
        return self._setting(_parse_connection, ("ansible_connection",), "ssh")

    @property
    def private_key_file(self) -> str | None:
        """SSH private key (ansible_ssh_private_key_file or ansible_private_key_file)."""
        keys = ("ansible_ssh_private_key_file", "ansible_private_key_file")
        return self._setting(_parse_path, keys, None)

    @property
    def become(self) -> bool:
        """Whether commands run with privilege escalation (ansible_become)."""
        return self._setting(_parse_bool, ("ansible_become",), False)

    @property
    def become_user(self) -> str:
        """The user to become (ansible_become_user), root by default."""
        return self._setting(str, ("ansible_become_user",), "root")

    @property
    def ssh_common_args(self) -> list[str]:
        """Extra ssh arguments: ansible_ssh_common_args then ansible_ssh_extra_args."""
        none: list[str] = []
        common = self._setting(_parse_args, ("ansible_ssh_common_args",), none)
        return common + self._setting(_parse_args, ("ansible_ssh_extra_args",), none)


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


# Reading files -----------------------------------------------------------------------------


def _identity(directory: Path) -> tuple[int, int]:
    """The directory itself (device and inode), whatever links lead to it."""
    try:
        info = directory.stat()
    except OSError as exc:
        raise Where(directory).error(f"cannot read: {exc.strerror or exc}") from None
    return info.st_dev, info.st_ino


def _descend(directory: Path, above: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
    """``above`` with ``directory`` added; a directory that is one of those it is inside
    (a link to ``.`` or to a parent) is a loop that would be listed forever."""
    identity = _identity(directory)
    if identity in above:
        raise Where(directory).error("a symbolic link loop: this directory is one it is "
                                     "inside; remove the link")
    return (*above, identity)


def _inventory_files(directory: Path, above: tuple[tuple[int, int], ...] = ()) -> list[Path]:
    """Inventory files of a directory inventory, alphabetically, subdirectories included."""
    inside = _descend(directory, above)
    files: list[Path] = []
    for entry in list_dir(directory):
        name = entry.name
        if name.startswith((".", "known_hosts")) or name.endswith(_IGNORED_SUFFIXES):
            continue
        if entry.is_dir():
            if name not in _VARS_DIRS:
                files.extend(_inventory_files(entry, inside))
        elif entry.is_file():
            files.append(entry)
    return files


def _vars_dir_files(directory: Path, above: tuple[tuple[int, int], ...] = ()) -> list[Path]:
    """Files of a group_vars/<group>/ directory in merge order (as Ansible's loader lists
    them: sorted; directories without an extension recursed; files without an extension
    or ending in .yml, .yaml or .json)."""
    inside = _descend(directory, above)
    files: list[Path] = []
    for entry in list_dir(directory):
        if entry.name.startswith(".") or entry.name.endswith("~"):
            continue
        if entry.is_dir():
            if not entry.suffix:
                files.extend(_vars_dir_files(entry, inside))
        elif entry.suffix in _VARS_SUFFIXES:
            files.append(entry)
    return files


def _folded(name: str) -> str:
    """A file name folded so that names any file system takes for one (by case or
    Unicode normalisation) fold the same."""
    return unicodedata.normalize("NFKD", unicodedata.normalize("NFKD", name).casefold())


def _listed(directory: Path) -> frozenset[str] | None:
    """The folded names of a directory's entries; None when it cannot be listed."""
    try:
        return frozenset(_folded(entry) for entry in os.listdir(directory))
    except OSError:
        return None


def _vars_files(directory: Path, name: str, listed: frozenset[str] | None) -> list[Path]:
    """The group_vars/ or host_vars/ files of one group or host: only the first of NAME,
    NAME.yml, NAME.yaml and NAME.json that exists is read (a directory stands for its
    files), as Ansible's host_group_vars plugin does. ``listed`` (``_listed(directory)``)
    spares looking for a name the directory cannot hold."""
    if "/" in name or name in {".", ".."}:  # a name that is not one file name
        return []
    folded = _folded(name)
    for suffix in _VARS_SUFFIXES:
        if listed is not None and folded + suffix not in listed:
            continue
        candidate = directory / f"{name}{suffix}"
        if candidate.is_dir():
            return _vars_dir_files(candidate)
        if candidate.exists():
            return [candidate]
    return []


def _vault_error(where: Where, key: str | None) -> InventoryError:
    variable = f" (variable {key})" if key else ""
    return InventoryError(f"vault-encrypted value in {where}{variable}: {_VAULT_HINT}")


_LEAVES = frozenset({str, int, float, bool, type(None)})


def _checked(value: Any, where: Where, key: str) -> Any:
    """``plain(value)``, refusing a vault-encrypted value in it (at that value's line)."""
    if isinstance(value, Vaulted):
        raise _vault_error(where.at(value.line), key)
    if isinstance(value, dict):
        return {name: item if type(item) in _LEAVES else _checked(item, where, key)
                for name, item in value.items()}
    if isinstance(value, list):
        return [item if type(item) in _LEAVES else _checked(item, where, key)
                for item in value]
    return value


def _yaml_entries(value: Any, where: Where, what: str) -> list[tuple[Any, Any, Where]]:
    """The (key, value, place of key) entries of a YAML mapping that may be null."""
    if value is None:
        return []
    if isinstance(value, Vaulted):
        raise _vault_error(where.at(value.line), None)
    if not isinstance(value, YamlMapping):
        raise where.error(f"{what} must be a mapping, got {_kind(value)}")
    return [(key, item, where.at(value.key_lines[key])) for key, item in value.items()]


def _yaml_vars(value: Any, where: Where, what: str) -> _Vars:
    if not isinstance(value, YamlMapping):
        _yaml_entries(value, where, what)  # None is no variables; anything else is refused
        return _Vars({}, where, {})
    values: dict[str, Any] = {}
    for key, item in value.items():
        if not isinstance(key, str):
            at = where.at(value.key_lines[key])
            raise at.error(f"variable names must be strings, got {_kind(key)} {key!r}")
        if isinstance(item, (dict, list, Vaulted)):
            values[key] = _checked(item, where, key)
        else:
            values[key] = item
    return _Vars(values, where, value.key_lines)


def _load_vars_file(file: Path, bounds: Limits) -> _Vars:
    where = Where(file)
    text = read_text(file)
    if text.startswith("$ANSIBLE_VAULT"):
        raise where.error(f"encrypted with ansible-vault; {_VAULT_HINT}")
    return _yaml_vars(parse_yaml(text, where, bounds), where, "a variables file")


def _priority(value: Any, where: Where) -> int:
    text = str(value).strip()
    if isinstance(value, bool) or not text.lstrip("-").isdigit():
        raise where.error(_problem("ansible_group_priority", value, "expected an integer"))
    return int(text)


# Building ------------------------------------------------------------------------------------


@dataclass
class _GroupDef:
    """A group as declared across the inventory files."""

    vars: dict[str, Any] = field(default_factory=dict)
    origins: dict[str, str] = field(default_factory=dict)
    children: dict[str, Where] = field(default_factory=dict)
    hosts: dict[str, None] = field(default_factory=dict)
    priority: int = 1


@dataclass
class _HostDef:
    """A host as declared across the inventory files."""

    vars: dict[str, Any] = field(default_factory=dict)
    origins: dict[str, str] = field(default_factory=dict)
    addresses: dict[str, tuple[Any, Where]] = field(default_factory=dict)
    source: str | None = None  # the file that named it first (Ansible's inventory_file)


class _Builder:
    """Collects groups and hosts from inventory files, then resolves them to an Inventory."""

    def __init__(self, bounds: Limits) -> None:
        self.bounds = bounds
        self.groups: dict[str, _GroupDef] = {"all": _GroupDef(), "ungrouped": _GroupDef()}
        self.groups["all"].children["ungrouped"] = Where(Path("all"))
        self.hosts: dict[str, _HostDef] = {}
        self.sources: list[Path] = []
        self.complete = False  # an ansible-inventory document: no group_vars/ to add

    def group(self, name: str) -> _GroupDef:
        return self.groups.setdefault(name, _GroupDef())

    def read(self, file: Path) -> None:
        """Read one inventory file, choosing the format by extension or content."""
        text = read_text(file)
        self.sources.append(file)
        where = Where(file)
        suffix = file.suffix.lower()
        listing = read_json(text, where, self.bounds) if suffix == ".json" else None
        if listing is not None:
            self.read_json(listing, where)
        elif suffix in _YAML_SUFFIXES:
            self.read_yaml(parse_yaml(text, where, self.bounds), where)
        elif suffix == ".ini":
            self.read_ini(text, where)
        elif text.startswith("#!"):
            raise where.error("inventory scripts are not supported; use a static YAML or INI "
                              "file, or the output of `ansible-inventory --list`")
        else:
            self.read_sniffed(text, where)

    def read_sniffed(self, text: str, where: Where) -> None:
        try:
            data = parse_yaml(text, where, self.bounds)
        except InventoryError:
            data = None
        if isinstance(data, YamlMapping):
            self.read_yaml(data, where)
        else:
            self.read_ini(text, where)

    # YAML

    def read_yaml(self, data: Any, where: Where) -> None:
        if data is not None and not isinstance(data, YamlMapping):
            raise where.error(f"a YAML inventory must be a mapping of groups, got {_kind(data)}")
        for name, body, at in _yaml_entries(data, where, "inventory"):
            self.yaml_group(name, body, at, None, 0)

    def yaml_group(self, name: Any, body: Any, where: Where, parent: str | None,
                   depth: int) -> None:
        if not isinstance(name, str):
            raise where.error(f"group names must be strings, got {_kind(name)} {name!r}")
        if depth > self.bounds.max_depth:
            raise where.error(f"groups nest more than {self.bounds.max_depth} levels deep "
                              "(GPUFLEET_MAX_INVENTORY_DEPTH)")
        self.group(name)
        if body is not None and not isinstance(body, YamlMapping):
            expected = "a mapping of hosts, children and vars"
            raise where.error(f"group '{name}' must be {expected}, got {_kind(body)}")
        for key, section, at in _yaml_entries(body, where, f"group '{name}'"):
            if key not in _GROUP_SECTIONS:
                expected = "expected hosts, children or vars"
                raise at.error(f"unexpected key '{key}' in group '{name}' ({expected})")
            what = f"'{key}' of group '{name}'"
            value = _one_entry(section, at) if isinstance(section, str) else section
            if key == "vars":
                self.add_group_vars(name, _yaml_vars(value, at, what))
            elif key == "children":
                for child, child_body, child_at in _yaml_entries(value, at, what):
                    self.yaml_group(child, child_body, child_at, name, depth + 1)
                    self.add_child(name, child, child_at)
            else:
                for host, host_body, host_at in _yaml_entries(value, at, what):
                    self.yaml_host(host, host_body, host_at, name)

    def yaml_host(self, token: Any, body: Any, where: Where, group: str) -> None:
        if not isinstance(token, str):
            raise where.error(f"host names must be strings, got {_kind(token)} {token!r}")
        self.add_hosts(token, _yaml_vars(body, where, f"vars of host '{token}'"), group)

    # INI

    def read_ini(self, text: str, where: Where) -> None:
        """Read INI entries. A group named by ``:children`` or ``:vars`` before it exists must
        be declared (``[group]`` or ``[group:children]``) later in the same file; a child
        joins its parent when it is declared, as Ansible does."""
        pending: dict[str, tuple[str, list[tuple[str, Where]]]] = {}
        for entry in read_ini(text, where):
            if isinstance(entry, Section):
                self.ini_section(entry, pending)
            elif isinstance(entry, HostLine):
                self.add_hosts(entry.token, _Vars(entry.values, entry.where), entry.group)
            elif isinstance(entry, VarLine):
                self.add_group_vars(entry.group, _Vars({entry.key: entry.value}, entry.where))
            else:
                self.ini_child(entry, pending)
        for name, (kind, places) in pending.items():
            parent, at = places[-1]
            if kind == "vars":
                raise at.error(f"section [{name}:vars] names undefined group '{name}'")
            raise at.error(f"section [{parent}:children] names undefined group '{name}'")

    def ini_section(self, entry: Section,
                    pending: dict[str, tuple[str, list[tuple[str, Where]]]]) -> None:
        if entry.name not in self.groups and entry.kind == "vars" and entry.name not in pending:
            pending[entry.name] = ("vars", [(entry.name, entry.where)])
        self.group(entry.name)
        if entry.kind == "vars" or entry.name not in pending:
            return
        kind, places = pending.pop(entry.name)
        if kind == "children":
            for parent, at in places:
                self.add_child(parent, entry.name, at)

    def ini_child(self, entry: ChildLine,
                  pending: dict[str, tuple[str, list[tuple[str, Where]]]]) -> None:
        if entry.child == "all":
            raise entry.where.error(f"group 'all' cannot be a child of group '{entry.group}'")
        if entry.child in self.groups:
            self.add_child(entry.group, entry.child, entry.where)
        else:
            pending.setdefault(entry.child, ("children", []))[1].append(
                (entry.group, entry.where))

    # ansible-inventory JSON

    def read_json(self, document: JsonInventory, where: Where) -> None:
        self.complete = True
        for name, group in document.groups.items():
            self.group(name)
            if group.vars:
                self.add_group_vars(name, _Vars(group.vars, where))
        for name, group in document.groups.items():
            for child in group.children:
                self.add_child(name, child, where)
            for host in group.hosts:
                self.define_host(host, {}, {}, where)
                self.groups[name].hosts[host] = None
        for host, values in document.hostvars.items():
            variables = _Vars(values, where)
            variables.check()
            self.define_host(host, values, variables.origins(), where)

    # Common

    def add_child(self, parent: str, child: str, where: Where) -> None:
        if child == "all":
            raise where.error(f"group 'all' cannot be a child of group '{parent}'")
        self.group(child)
        self.group(parent).children.setdefault(child, where)

    def add_group_vars(self, group: str, variables: _Vars) -> None:
        variables.check()
        values = dict(variables.values)
        origins = variables.origins()
        if "ansible_group_priority" in values:
            where = variables.where_of("ansible_group_priority")
            self.groups[group].priority = _priority(values.pop("ansible_group_priority"), where)
            origins.pop("ansible_group_priority")
        self.groups[group].vars.update(values)
        self.groups[group].origins.update(origins)

    def add_hosts(self, token: str, variables: _Vars, group: str) -> None:
        variables.check()
        where = variables.where
        names, port = host_names(token, where, self.bounds.max_hosts)
        values = variables.values
        origins = variables.origins()
        if port is not None:
            values = {"ansible_port": port, **values}
            origins = {"ansible_port": str(where), **origins}
        for name in names:
            if not name:
                raise where.error(f"missing host name in '{token}'")
            self.define_host(name, values, origins, where)
            self.groups[group].hosts[name] = None

    def define_host(self, name: str, values: dict[str, Any], origins: dict[str, str],
                    where: Where) -> None:
        host = self.hosts.get(name)
        if host is None:
            if len(self.hosts) >= self.bounds.max_hosts:
                raise where.error(f"more than {self.bounds.max_hosts} hosts "
                                  "(GPUFLEET_MAX_HOSTS)")
            host = self.hosts[name] = _HostDef(source=os.path.abspath(where.file))
        for key in _ADDRESS_KEYS:
            if key not in values:
                continue
            seen, seen_at = host.addresses.setdefault(key, (values[key], where))
            if str(seen) != str(values[key]):
                here, there = _shown(key, values[key]), _shown(key, seen)
                problem = f"host '{name}' defined twice with different addresses"
                raise where.error(f"{problem}: {here} here, {there} at {seen_at}")
        host.vars.update(values)
        host.origins.update(origins)

    def build(self, path: Path) -> Inventory:
        """Check cycles, then merge variables into the final Inventory."""
        self.reconcile()
        self.check_cycles()
        members = self.members()
        depth = self.depths()
        root = path if path.is_dir() else path.parent
        none: tuple[dict[str, Any], dict[str, str]] = ({}, {})
        group_dir, host_dir = root / "group_vars", root / "host_vars"
        read_group = not self.complete and group_dir.is_dir()
        read_host = not self.complete and host_dir.is_dir()
        group_listed = _listed(group_dir) if read_group else None
        host_listed = _listed(host_dir) if read_host else None
        group_files = {name: self.vars_from(group_dir, name, group_listed) if read_group
                       else none for name in self.groups}
        host_files = {name: self.vars_from(host_dir, name, host_listed) if read_host else none
                      for name in self.hosts}
        host_groups: dict[str, list[str]] = {name: [] for name in self.hosts}
        for group, names in members.items():
            for name in names:
                host_groups[name].append(group)
        by_groups: dict[frozenset[str], _Layer] = {}
        hosts: dict[str, Host] = {}
        fleet = Fleet()
        for name, definition in self.hosts.items():
            groups = frozenset(host_groups[name])
            shared = by_groups.get(groups)
            if shared is None:
                order = sorted(groups, key=lambda g: (depth[g], self.groups[g].priority, g))
                layers = [(self.groups[g].vars, self.groups[g].origins) for g in order]
                shared = by_groups[groups] = _Layer(
                    *_merge(layers + [group_files[g] for g in order]))
            fleet.hosts[name] = shared.host_vars(name, definition, host_files[name], fleet,
                                                 sorted(groups - {"all"}))
            hosts[name] = Host(name, fleet.hosts[name], groups)
        inventory = Inventory(path, hosts, members, list(self.sources))
        inventory._group_vars = {
            name: _merge([(group.vars, group.origins), group_files[name]])[0]
            for name, group in self.groups.items()
        }
        inventory._tree = {name: (list(group.hosts), list(group.children))
                           for name, group in self.groups.items()}
        fleet.groups.update((name, inventory.group_hosts(name)) for name in self.groups)
        return inventory

    def reconcile(self) -> None:
        """Ansible's last step: groups without a parent become children of ``all``; hosts in
        no group but ``all`` are ``ungrouped``, and only those."""
        has_parent = {child for group in self.groups.values() for child in group.children}
        for name in self.groups:
            if name != "all" and name not in has_parent:
                self.groups["all"].children.setdefault(name, Where(Path("all")))
        listed: dict[str, set[str]] = {name: set() for name in self.hosts}
        for group, definition in self.groups.items():
            for name in definition.hosts:
                listed[name].add(group)
        ungrouped = self.groups["ungrouped"].hosts
        for name in list(ungrouped):
            if listed[name] - {"all", "ungrouped"}:
                del ungrouped[name]
        for name, groups in listed.items():
            if groups <= {"all"}:
                ungrouped[name] = None

    def check_cycles(self) -> None:
        """Refuse children that form a cycle (iteratively: any depth is safe)."""
        state: dict[str, int] = {}
        for start in self.groups:
            if start in state:
                continue
            trail: list[str] = []
            stack: list[tuple[str, Iterator[tuple[str, Where]]]] = []
            state[start] = 1
            trail.append(start)
            stack.append((start, iter(self.groups[start].children.items())))
            while stack:
                group, children = stack[-1]
                step = next(children, None)
                if step is None:
                    stack.pop()
                    trail.pop()
                    state[group] = 2
                    continue
                child, where = step
                if state.get(child) == 1:
                    cycle = " -> ".join([*trail[trail.index(child):], child])
                    raise where.error(f"group children form a cycle: {cycle}")
                if child not in state:
                    state[child] = 1
                    trail.append(child)
                    stack.append((child, iter(self.groups[child].children.items())))

    def topological(self) -> list[str]:
        """Groups ordered so that every group comes after all of its parents."""
        parents: dict[str, int] = dict.fromkeys(self.groups, 0)
        for group in self.groups.values():
            for child in group.children:
                parents[child] += 1
        ready = [name for name, count in parents.items() if count == 0]
        order: list[str] = []
        while ready:
            name = ready.pop()
            order.append(name)
            for child in self.groups[name].children:
                parents[child] -= 1
                if parents[child] == 0:
                    ready.append(child)
        return order

    def members(self) -> dict[str, set[str]]:
        """Host names of every group, children included."""
        found: dict[str, set[str]] = {}
        for name in reversed(self.topological()):
            definition = self.groups[name]
            found[name] = set(definition.hosts).union(
                *(found[child] for child in definition.children))
        found["all"] = set(self.hosts)
        return {name: found[name] for name in self.groups}

    def depths(self) -> dict[str, int]:
        """Each group's depth: the longest chain of parents up to ``all``."""
        depth: dict[str, int] = dict.fromkeys(self.groups, 0)
        for name in self.topological():
            for child in self.groups[name].children:
                depth[child] = max(depth[child], depth[name] + 1)
        return depth

    def vars_from(self, directory: Path, name: str, listed: frozenset[str] | None
                  ) -> tuple[dict[str, Any], dict[str, str]]:
        values: dict[str, Any] = {}
        origins: dict[str, str] = {}
        for file in _vars_files(directory, name, listed):
            variables = _load_vars_file(file, self.bounds)
            variables.check()
            self.sources.append(file)
            values.update(variables.values)
            origins.update(variables.origins())
        return values, origins


def _one_entry(value: str, where: Where) -> YamlMapping:
    """Ansible reads ``hosts: name`` (also ``children:``, ``vars:``) as a mapping of that one
    name to nothing."""
    mapping = YamlMapping(where.line or 0)
    mapping[value] = None
    mapping.key_lines[value] = where.line or 0
    return mapping


def _shown(key: str, value: Any) -> str:
    return f"port {value}" if key == "ansible_port" else str(value)


def _merge(layers: Iterable[tuple[Mapping[str, Any], Mapping[str, str]]]
           ) -> tuple[dict[str, Any], dict[str, str]]:
    """Values merged key by key, later layers winning, with where each winner is set (every
    layer's origins name exactly its own keys)."""
    values: dict[str, Any] = {}
    origins: dict[str, str] = {}
    for layer_values, layer_origins in layers:
        values.update(layer_values)
        origins.update(layer_origins)
    return values, origins


class _Layer:
    """The group variables every host of one combination of groups shares, merged once:
    which of them are secrets and which need rendering is worked out once too, and a
    template that none of its hosts' own variables reach is rendered once for them all."""

    def __init__(self, values: dict[str, Any], origins: dict[str, str]) -> None:
        self.values = values
        self.origins = origins
        self.secrets = [key for key, value in values.items() if holds_secret(key, value)]
        self.templated = {key for key, value in values.items() if needs_render(value)}
        self.renders = SharedRenders(values)

    def host_vars(self, name: str, definition: _HostDef,
                  files: tuple[dict[str, Any], dict[str, str]], fleet: Fleet,
                  group_names: list[str]) -> HostVars:
        """A host's variables: these, then its own from inventory files and host_vars/.
        The values stay shared; HostVars copies a list or mapping when it is read."""
        values, origins = dict(self.values), dict(self.origins)
        values.update(definition.vars)
        origins.update(definition.origins)
        values.update(files[0])
        origins.update(files[1])
        own = definition.vars.keys() | files[0].keys()
        for key in (*self.secrets, *own):
            remember_secret(key, values[key])
        templated = (self.templated - own) | {key for key in own if needs_render(values[key])}
        return HostVars(name, values, origins, templated, shared=self.renders, own=own,
                        fleet=fleet, source=definition.source, group_names=group_names)


# Public functions ----------------------------------------------------------------------------


def resolve_inventory(name: str, bases: Sequence[Path] = (Path("inventory"),)) -> Path:
    """Find inventory ``name``: a bare name as BASE/name.yml, .yaml, .ini or BASE/name in
    each base in turn, then ./name; a path (it has a ``/``) exactly as given, or under the
    first base."""
    if not name:
        raise InventoryError("no inventory given")
    check_path_text(name, "inventory")
    path = Path(name)
    if "/" in name or path.is_absolute():
        tried = [path] if path.is_absolute() else [path, bases[0] / name]
    else:
        tried = [candidate for base in bases
                 for candidate in [*(base / f"{name}{suffix}" for suffix in _NAME_SUFFIXES),
                                   base / name]]
        tried.append(path)
    tried = list(dict.fromkeys(tried))
    for candidate in tried:
        if candidate.exists():
            return candidate
    raise InventoryError(f"inventory '{name}' not found; tried {', '.join(map(str, tried))}")


def load_inventory(path: str | Path) -> Inventory:
    """Load an inventory file or directory, or an inventory name resolved under ./inventory."""
    target = resolve_inventory(str(path))
    bounds = limits()
    builder = _Builder(bounds)
    files = _inventory_files(target) if target.is_dir() else [target]
    if not files:
        raise Where(target).error("no inventory files found")
    for file in files:
        builder.read(file)
    return builder.build(target)
