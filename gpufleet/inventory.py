"""Ansible-compatible static inventories: YAML, INI, or a directory of them.

Hosts, groups, ``group_vars/`` and ``host_vars/`` are read with Ansible's semantics so that
existing inventories work unchanged. Every problem in the input becomes an InventoryError
that names the file and, where known, the line.
"""

from __future__ import annotations

import ast
import copy
import fnmatch
import hashlib
import ipaddress
import os
import re
import shlex
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from gpufleet.errors import InventoryError

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
_LITERAL_TYPES = (str, int, float, list, dict, type(None))
_ADDRESS_KEYS = ("ansible_host", "ansible_port")
_GROUP_SECTIONS = ("hosts", "children", "vars")

_SECTION = re.compile(r"\[([^:\]\s]+)(?::(\w+))?\]")
_GROUP_NAME = re.compile(r"[^:\]\s]+")
_RANGE = re.compile(r"\[([^\[\]]*)\]")
_BRACKETED = re.compile(r"\[([^\[\]]+)\](?::(.*))?")
_DIGITS = re.compile(r"[0-9]+")
_INTEGER = re.compile(r"-?[0-9]+")
_PATTERN_TERM = re.compile(r"(?:[^:\[\]\s]|\[[^\]]*\])+")


# Locations and values ----------------------------------------------------------------------


@dataclass(frozen=True)
class _Where:
    """A place in an inventory source, for error messages."""

    file: Path
    line: int | None = None

    def __str__(self) -> str:
        return f"{self.file}:{self.line}" if self.line else str(self.file)

    def at(self, line: int | None) -> _Where:
        return _Where(self.file, line)

    def error(self, problem: str) -> InventoryError:
        return InventoryError(f"{self}: {problem}")


def _parse_port(value: Any) -> int:
    text = str(value)
    if isinstance(value, bool) or not _DIGITS.fullmatch(text) or not 1 <= int(text) <= 65535:
        raise ValueError("expected a number from 1 to 65535")
    return int(text)


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


def _parse_args(value: Any) -> list[str]:
    try:
        return shlex.split(str(value))
    except ValueError as exc:
        raise ValueError(f"cannot split into arguments: {exc}") from None


_CHECKS: dict[str, Callable[[Any], object]] = {
    "ansible_port": _parse_port,
    "ansible_ssh_port": _parse_port,
    "ansible_connection": _parse_connection,
    "ansible_become": _parse_bool,
    "ansible_ssh_common_args": _parse_args,
    "ansible_ssh_extra_args": _parse_args,
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
    where: _Where
    lines: Mapping[str, int] = field(default_factory=dict)

    def where_of(self, key: str) -> _Where:
        return self.where.at(self.lines.get(key, self.where.line))

    def check(self) -> None:
        """Reject connection settings gpufleet cannot use, at the line that sets them."""
        for key, value in self.values.items():
            check = _CHECKS.get(key)
            if check is None or value is None:
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
    vars: dict[str, Any]
    groups: frozenset[str]

    def _setting(self, parse: Callable[[Any], _T], keys: tuple[str, ...], default: _T) -> _T:
        for key in keys:
            value = self.vars.get(key)
            if value is not None:
                try:
                    return parse(value)
                except ValueError as exc:
                    problem = _problem(key, value, exc)
                    raise InventoryError(f"host '{self.name}': {problem}") from None
        return default

    @property
    def address(self) -> str:
        """Where to connect: ansible_host (or legacy ansible_ssh_host), else the name."""
        return self._setting(str, ("ansible_host", "ansible_ssh_host"), self.name)

    @property
    def port(self) -> int:
        """SSH port: ansible_port (also set by ``host:port``) or ansible_ssh_port, else 22."""
        return self._setting(_parse_port, ("ansible_port", "ansible_ssh_port"), 22)

    @property
    def user(self) -> str | None:
        """Remote user (ansible_user or ansible_ssh_user); None means the controller's user,
        as ssh does."""
        return self._setting(str, ("ansible_user", "ansible_ssh_user"), None)

    @property
    def connection(self) -> str:
        """Either "ssh" or "local"; paramiko and smart count as ssh."""
        return self._setting(_parse_connection, ("ansible_connection",), "ssh")

    @property
    def private_key_file(self) -> str | None:
        """SSH private key (ansible_ssh_private_key_file or ansible_private_key_file)."""
        keys = ("ansible_ssh_private_key_file", "ansible_private_key_file")
        return self._setting(str, keys, None)

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
    """Hosts and groups loaded from an inventory file or directory."""

    path: Path
    hosts: dict[str, Host]
    groups: dict[str, set[str]]
    sources: list[Path]
    _group_vars: dict[str, dict[str, Any]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def select(self, pattern: str | None = None) -> list[Host]:
        """Hosts matching an Ansible host pattern, in inventory order."""
        terms = _split_pattern(pattern or "all")
        unions = [term for term in terms if term[0] not in "&!"] or ["all"]
        chosen: set[str] = set()
        for term in unions:
            chosen |= self._match(term)
        for term in terms:
            if term[0] == "&":
                chosen &= self._match(term[1:])
        for term in terms:
            if term[0] == "!":
                chosen -= self._match(term[1:])
        return [host for name, host in self.hosts.items() if name in chosen]

    def _match(self, term: str) -> set[str]:
        subscript = _SUBSCRIPT.match(term)
        if subscript and subscript["group"] in self.groups:
            return self._subscript(subscript)
        if term.startswith("~") or any(char in term for char in "*?["):
            regex = _compile_term(term)
            found = {name for name in self.hosts if regex.match(name)}
            for group, members in self.groups.items():
                if regex.match(group):
                    found |= members
            return found
        if term in self.groups:
            return set(self.groups[term])
        if term in self.hosts:
            return {term}
        raise InventoryError(f"host pattern term '{term}' matches no host or group")

    def _subscript(self, match: re.Match[str]) -> set[str]:
        """Ansible's ``group[i]`` and ``group[start:end]`` (end excluded) over the group's
        hosts in inventory order."""
        members = [name for name in self.hosts if name in self.groups[match["group"]]]
        start = int(match["start"]) if match["start"] else None
        if match["colon"] is None:
            index = start or 0
            if not -len(members) <= index < len(members):
                raise InventoryError(f"host pattern {match.group(0)!r}: group "
                                     f"'{match['group']}' has {len(members)} host(s)")
            return {members[index]}
        end = int(match["end"]) if match["end"] else None
        return set(members[start:end])

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
            data = _read_bytes(source)
            digest.update(f"{relative}\0{len(data)}\0".encode())
            digest.update(data)
        return digest.hexdigest()

    def group_vars(self, group: str) -> dict[str, Any]:
        """Variables defined for the group itself: inventory file, then group_vars/."""
        if group not in self.groups:
            raise InventoryError(f"{self.path}: unknown group '{group}'")
        return copy.deepcopy(self._group_vars.get(group, {}))


# Host patterns -----------------------------------------------------------------------------

_SUBSCRIPT = re.compile(r"^(?P<group>[^\[\]]+)\[(?P<start>-?\d*)(?P<colon>:)?(?P<end>-?\d*)\]$")


def _split_pattern(pattern: str) -> list[str]:
    """Split an Ansible host pattern on commas and on colons outside brackets."""
    terms: list[str] = []
    for part in pattern.split(","):
        stripped = part.strip()
        terms.extend([stripped] if _is_ipv6(stripped) else _PATTERN_TERM.findall(stripped))
    return [term for term in terms if term]


def _compile_term(term: str) -> re.Pattern[str]:
    try:
        return re.compile(term[1:] if term.startswith("~") else fnmatch.translate(term))
    except re.error as exc:
        problem = f"host pattern term '{term}' is not a valid expression: {exc}"
        raise InventoryError(problem) from None


# Reading files -----------------------------------------------------------------------------


def _read_bytes(file: Path) -> bytes:
    try:
        return file.read_bytes()
    except OSError as exc:
        raise _Where(file).error(f"cannot read: {exc.strerror or exc}") from None


def _read_text(file: Path) -> str:
    data = _read_bytes(file)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise _Where(file, line).error("not UTF-8 text") from None


def _list_dir(directory: Path) -> list[Path]:
    try:
        return sorted(directory.iterdir(), key=lambda entry: entry.name)
    except OSError as exc:
        raise _Where(directory).error(f"cannot list: {exc.strerror or exc}") from None


def _inventory_files(directory: Path) -> list[Path]:
    """Inventory files of a directory inventory, alphabetically, subdirectories included."""
    files: list[Path] = []
    for entry in _list_dir(directory):
        name = entry.name
        if name.startswith((".", "known_hosts")) or name.endswith(_IGNORED_SUFFIXES):
            continue
        if entry.is_dir():
            if name not in _VARS_DIRS:
                files.extend(_inventory_files(entry))
        elif entry.is_file():
            files.append(entry)
    return files


def _vars_dir_files(directory: Path) -> list[Path]:
    """Files of a group_vars/<group>/ directory in merge order."""
    files: list[Path] = []
    for entry in _list_dir(directory):
        if entry.name.startswith(".") or entry.name.endswith("~"):
            continue
        if entry.is_dir():
            files.extend(_vars_dir_files(entry))
        elif entry.is_file() and entry.suffix in _VARS_SUFFIXES:
            files.append(entry)
    return files


def _vars_files(directory: Path, name: str) -> list[Path]:
    """The group_vars/ or host_vars/ files for one group or host, in Ansible's merge order."""
    if not directory.is_dir() or Path(name).name != name or name in {".", ".."}:
        return []
    files: list[Path] = []
    for suffix in _VARS_SUFFIXES:
        candidate = directory / f"{name}{suffix}"
        if candidate.is_dir():
            files.extend(_vars_dir_files(candidate))
        elif candidate.is_file():
            files.append(candidate)
    return files


# YAML ----------------------------------------------------------------------------------------


class _Mapping(dict[Any, Any]):
    """A YAML mapping that knows the line it starts on and the line of each key."""

    def __init__(self, line: int) -> None:
        super().__init__()
        self.line = line
        self.key_lines: dict[Any, int] = {}


class _LineLoader(yaml.SafeLoader):
    """A SafeLoader that builds _Mapping objects, and reads Ansible's !unsafe strings."""


def _construct_mapping(loader: _LineLoader, node: yaml.MappingNode) -> Iterator[_Mapping]:
    mapping = _Mapping(node.start_mark.line + 1)
    yield mapping
    mapping.update(loader.construct_mapping(node))
    for key_node, _ in node.value:
        mapping.key_lines[loader.construct_object(key_node)] = key_node.start_mark.line + 1


def _construct_unsafe(loader: _LineLoader, node: yaml.ScalarNode) -> str:
    return str(loader.construct_scalar(node))


_LineLoader.add_constructor("tag:yaml.org,2002:map", _construct_mapping)
_LineLoader.add_constructor("!unsafe", _construct_unsafe)


def _parse_yaml(text: str, where: _Where) -> Any:
    loader: _LineLoader | None = None
    try:
        loader = _LineLoader(text)
        return loader.get_single_data()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        reason = exc.problem or exc.context or "malformed document"
        raise where.at(line).error(f"invalid YAML: {reason}") from None
    except yaml.reader.ReaderError as exc:
        line = text.count("\n", 0, exc.position) + 1
        raise where.at(line).error(f"invalid YAML: {exc.reason}") from None
    finally:
        if loader is not None:
            loader.dispose()


def _plain(value: Any) -> Any:
    """The value with every _Mapping turned back into a plain dict."""
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value


def _yaml_entries(value: Any, where: _Where, what: str) -> list[tuple[Any, Any, _Where]]:
    """The (key, value, place of key) entries of a YAML mapping that may be null."""
    if value is None:
        return []
    if not isinstance(value, _Mapping):
        raise where.error(f"{what} must be a mapping, got {_kind(value)}")
    return [(key, item, where.at(value.key_lines[key])) for key, item in value.items()]


def _yaml_vars(value: Any, where: _Where, what: str) -> _Vars:
    entries = _yaml_entries(value, where, what)
    for key, _, at in entries:
        if not isinstance(key, str):
            raise at.error(f"variable names must be strings, got {_kind(key)} {key!r}")
    lines = value.key_lines if isinstance(value, _Mapping) else {}
    try:
        values = {key: _plain(item) for key, item, _ in entries}
    except RecursionError:
        raise where.error(f"{what} nest too deeply or refer to themselves") from None
    return _Vars(values, where, lines)


def _load_vars_file(file: Path) -> _Vars:
    where = _Where(file)
    text = _read_text(file)
    if text.startswith("$ANSIBLE_VAULT"):
        raise where.error("encrypted with ansible-vault, which gpufleet cannot read")
    return _yaml_vars(_parse_yaml(text, where), where, "a variables file")


# INI and host names --------------------------------------------------------------------------


def _strip_comment(line: str) -> str:
    """The line without a trailing ``# comment`` (a ``#`` after whitespace, outside quotes)."""
    quote = ""
    for index, char in enumerate(line):
        if quote:
            quote = "" if char == quote else quote
        elif char in "\"'":
            quote = char
        elif char == "#" and index and line[index - 1].isspace():
            return line[:index].rstrip()
    return line


def _literal(text: str) -> Any:
    """An inline INI host value read as a Python literal where it is one, else the text."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            value = ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return text
    return value if isinstance(value, _LITERAL_TYPES) else text


def _unquote(text: str) -> str:
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        return text[1:-1]
    return text


def _is_ipv6(text: str) -> bool:
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return False
    return True


def _bracketed_ipv6(token: str) -> re.Match[str] | None:
    match = _BRACKETED.fullmatch(token)
    return match if match and _is_ipv6(match.group(1)) else None


def _port_in(token: str, text: str | None, where: _Where) -> int | None:
    if text is None:
        return None
    try:
        return _parse_port(text)
    except ValueError as exc:
        raise where.error(f"invalid port '{text}' in host '{token}': {exc}") from None


def _host_names(token: str, where: _Where) -> tuple[list[str], int | None]:
    """Expand an inventory host entry (ranges, ``host:port``, IPv6) to names and a port."""
    bracketed = _bracketed_ipv6(token)
    if bracketed:
        return [bracketed.group(1)], _port_in(token, bracketed.group(2), where)
    colons = _RANGE.sub("", token).count(":")
    if colons > 1:
        if not _is_ipv6(token):
            raise where.error(f"invalid host '{token}': expected name, name:port or IPv6 address")
        return [token], None
    if colons == 1:
        name, _, port = token.rpartition(":")
        return _expand_ranges(name, token, where), _port_in(token, port, where)
    return _expand_ranges(token, token, where), None


def _expand_ranges(pattern: str, token: str, where: _Where) -> list[str]:
    """Expand every ``[start:end]`` or ``[start:end:step]`` range in a host name."""
    names = [""]
    position = 0
    for match in _RANGE.finditer(pattern):
        try:
            items = _range_items(match.group(1))
        except ValueError as exc:
            raise where.error(f"invalid host range '{token}': {exc}") from None
        prefix = pattern[position : match.start()]
        names = [name + prefix + item for name in names for item in items]
        position = match.end()
    return [name + pattern[position:] for name in names]


def _range_items(body: str) -> list[str]:
    parts = body.split(":")
    if len(parts) not in (2, 3):
        raise ValueError("expected [start:end] or [start:end:step]")
    start, end, step = parts[0] or "0", parts[1], parts[2] if len(parts) == 3 else "1"
    if not end:
        raise ValueError("end is missing")
    if not _DIGITS.fullmatch(step) or int(step) == 0:
        raise ValueError(f"step must be a positive integer, got '{step}'")
    if _DIGITS.fullmatch(start) and _DIGITS.fullmatch(end):
        return _number_items(start, end, int(step))
    if _is_letter(start) and _is_letter(end) and start.islower() == end.islower():
        return [chr(code) for code in _ordered(start, end, ord(start), ord(end), int(step))]
    raise ValueError("start and end must be two numbers or two letters of the same case")


def _number_items(start: str, end: str, step: int) -> list[str]:
    width = len(start) if start.startswith("0") and len(start) > 1 else 0
    if width and len(end) != width:
        raise ValueError("zero-padded start and end must have the same width")
    return [str(number).zfill(width) for number in _ordered(start, end, int(start), int(end), step)]


def _ordered(start: str, end: str, first: int, last: int, step: int) -> range:
    if first > last:
        raise ValueError(f"start {start} is after end {end}")
    return range(first, last + 1, step)


def _is_letter(text: str) -> bool:
    return len(text) == 1 and text.isascii() and text.isalpha()


def _priority(value: Any, where: _Where) -> int:
    if isinstance(value, bool) or not _INTEGER.fullmatch(str(value)):
        raise where.error(_problem("ansible_group_priority", value, "expected an integer"))
    return int(str(value))


# Building ------------------------------------------------------------------------------------


@dataclass
class _GroupDef:
    """A group as declared across the inventory files."""

    vars: dict[str, Any] = field(default_factory=dict)
    children: dict[str, _Where] = field(default_factory=dict)
    hosts: dict[str, None] = field(default_factory=dict)
    priority: int = 1


@dataclass
class _HostDef:
    """A host as declared across the inventory files."""

    vars: dict[str, Any] = field(default_factory=dict)
    addresses: dict[str, tuple[Any, _Where]] = field(default_factory=dict)


class _Builder:
    """Collects groups and hosts from inventory files, then resolves them to an Inventory."""

    def __init__(self) -> None:
        self.groups: dict[str, _GroupDef] = {"all": _GroupDef(), "ungrouped": _GroupDef()}
        self.hosts: dict[str, _HostDef] = {}
        self.sources: list[Path] = []
        self.defined: set[str] = {"all", "ungrouped"}
        self.references: list[tuple[str, _Where, str]] = []

    def group(self, name: str) -> _GroupDef:
        return self.groups.setdefault(name, _GroupDef())

    def read(self, file: Path) -> None:
        """Read one inventory file, choosing YAML or INI by extension or content."""
        text = _read_text(file)
        self.sources.append(file)
        where = _Where(file)
        suffix = file.suffix.lower()
        if suffix in _YAML_SUFFIXES:
            self.read_yaml(_parse_yaml(text, where), where)
        elif suffix == ".ini":
            self.read_ini(text, file)
        elif text.startswith("#!"):
            raise where.error("inventory scripts are not supported; use a static YAML or INI file")
        else:
            self.read_sniffed(text, where)

    def read_sniffed(self, text: str, where: _Where) -> None:
        try:
            data = _parse_yaml(text, where)
        except InventoryError:
            data = None
        if isinstance(data, _Mapping):
            self.read_yaml(data, where)
        else:
            self.read_ini(text, where.file)

    def read_yaml(self, data: Any, where: _Where) -> None:
        if data is not None and not isinstance(data, _Mapping):
            raise where.error(f"a YAML inventory must be a mapping of groups, got {_kind(data)}")
        for name, body, at in _yaml_entries(data, where, "inventory"):
            self.yaml_group(name, body, at, None)

    def yaml_group(self, name: Any, body: Any, where: _Where, parent: str | None) -> None:
        if not isinstance(name, str):
            raise where.error(f"group names must be strings, got {_kind(name)} {name!r}")
        self.group(name)
        self.defined.add(name)
        if parent is not None:
            self.add_child(parent, name, where)
        if body is not None and not isinstance(body, _Mapping):
            expected = "a mapping of hosts, children and vars"
            raise where.error(f"group '{name}' must be {expected}, got {_kind(body)}")
        for key, value, at in _yaml_entries(body, where, f"group '{name}'"):
            if key not in _GROUP_SECTIONS:
                expected = "expected hosts, children or vars"
                raise at.error(f"unexpected key '{key}' in group '{name}' ({expected})")
            what = f"'{key}' of group '{name}'"
            if key == "vars":
                self.add_group_vars(name, _yaml_vars(value, at, what))
            elif key == "children":
                for child, child_body, child_at in _yaml_entries(value, at, what):
                    self.yaml_group(child, child_body, child_at, name)
            else:
                for host, host_body, host_at in _yaml_entries(value, at, what):
                    self.yaml_host(host, host_body, host_at, name)

    def yaml_host(self, token: Any, body: Any, where: _Where, group: str) -> None:
        if not isinstance(token, str):
            raise where.error(f"host names must be strings, got {_kind(token)} {token!r}")
        self.add_hosts(token, _yaml_vars(body, where, f"vars of host '{token}'"), group)

    def read_ini(self, text: str, file: Path) -> None:
        group, kind = "ungrouped", "hosts"
        for number, raw in enumerate(text.splitlines(), start=1):
            line = raw.strip()
            if not line or line[0] in "#;":
                continue
            where = _Where(file, number)
            line = _strip_comment(line)
            section = _SECTION.fullmatch(line)
            if section:
                group, kind = self.ini_section(section, where)
            elif line.startswith("[") and not _bracketed_ipv6(line.split()[0]):
                raise where.error(f"invalid section header '{line}'")
            elif kind == "hosts":
                self.ini_host(line, group, where)
            elif kind == "vars":
                self.ini_var(line, group, where)
            else:
                self.ini_child(line, group, where)

    def ini_section(self, section: re.Match[str], where: _Where) -> tuple[str, str]:
        name, kind = section.group(1), section.group(2) or "hosts"
        if kind not in _GROUP_SECTIONS:
            expected = "expected hosts, children or vars"
            raise where.error(f"unknown section type '{kind}' in '[{name}:{kind}]' ({expected})")
        self.group(name)
        if kind == "vars":
            self.references.append((name, where, f"section [{name}:vars] names undefined group"))
        else:
            self.defined.add(name)
        return name, kind

    def ini_host(self, line: str, group: str, where: _Where) -> None:
        try:
            token, *assignments = shlex.split(line)
        except ValueError as exc:
            raise where.error(f"cannot parse host line: {exc}") from None
        values: dict[str, Any] = {}
        for assignment in assignments:
            key, equals, value = assignment.partition("=")
            if not equals or not key:
                problem = f"expected key=value after host '{token}', got '{assignment}'"
                raise where.error(problem)
            values[key] = _literal(value)
        self.add_hosts(token, _Vars(values, where), group)

    def ini_var(self, line: str, group: str, where: _Where) -> None:
        key, equals, value = line.partition("=")
        key = key.strip()
        if not equals or len(key.split()) != 1:
            raise where.error(f"expected key=value in [{group}:vars], got '{line}'")
        self.add_group_vars(group, _Vars({key: _unquote(value.strip())}, where))

    def ini_child(self, line: str, group: str, where: _Where) -> None:
        if not _GROUP_NAME.fullmatch(line):
            raise where.error(f"expected one group name in [{group}:children], got '{line}'")
        self.add_child(group, line, where)
        self.references.append((line, where, f"section [{group}:children] names undefined group"))

    def add_child(self, parent: str, child: str, where: _Where) -> None:
        if child == "all":
            raise where.error(f"group 'all' cannot be a child of group '{parent}'")
        self.group(child)
        self.group(parent).children.setdefault(child, where)

    def add_group_vars(self, group: str, variables: _Vars) -> None:
        variables.check()
        values = dict(variables.values)
        if "ansible_group_priority" in values:
            where = variables.where_of("ansible_group_priority")
            self.groups[group].priority = _priority(values.pop("ansible_group_priority"), where)
        self.groups[group].vars.update(values)

    def add_hosts(self, token: str, variables: _Vars, group: str) -> None:
        variables.check()
        where = variables.where
        names, port = _host_names(token, where)
        values = variables.values if port is None else {"ansible_port": port, **variables.values}
        for name in names:
            if not name:
                raise where.error(f"missing host name in '{token}'")
            self.define_host(name, values, where)
            self.groups[group].hosts[name] = None

    def define_host(self, name: str, values: dict[str, Any], where: _Where) -> None:
        host = self.hosts.setdefault(name, _HostDef())
        for key in _ADDRESS_KEYS:
            if key not in values:
                continue
            seen, seen_at = host.addresses.setdefault(key, (values[key], where))
            if str(seen) != str(values[key]):
                here, there = _shown(key, values[key]), _shown(key, seen)
                problem = f"host '{name}' defined twice with different addresses"
                raise where.error(f"{problem}: {here} here, {there} at {seen_at}")
        host.vars.update(values)

    def build(self, path: Path) -> Inventory:
        """Check references and cycles, then merge variables into the final Inventory."""
        for group, where, problem in self.references:
            if group not in self.defined:
                raise where.error(f"{problem} '{group}'")
        self.check_cycles()
        members = self.members()
        depth = self.depths()
        root = path if path.is_dir() else path.parent
        group_files = {name: self.vars_from(root / "group_vars", name) for name in self.groups}
        host_files = {name: self.vars_from(root / "host_vars", name) for name in self.hosts}
        hosts: dict[str, Host] = {}
        for name, definition in self.hosts.items():
            groups = [group for group, names in members.items() if name in names]
            order = sorted(groups, key=lambda g: (depth[g], self.groups[g].priority, g))
            layers = [self.groups[g].vars for g in order] + [group_files[g] for g in order]
            merged = _merge(*layers, definition.vars, host_files[name])
            hosts[name] = Host(name, copy.deepcopy(merged), frozenset(groups))
        inventory = Inventory(path, hosts, members, list(self.sources))
        inventory._group_vars = {
            name: _merge(group.vars, group_files[name]) for name, group in self.groups.items()
        }
        return inventory

    def check_cycles(self) -> None:
        state: dict[str, bool] = {}
        trail: list[str] = []

        def visit(group: str) -> None:
            state[group] = True
            trail.append(group)
            for child, where in self.groups[group].children.items():
                if state.get(child):
                    cycle = " -> ".join([*trail[trail.index(child) :], child])
                    raise where.error(f"group children form a cycle: {cycle}")
                if child not in state:
                    visit(child)
            trail.pop()
            state[group] = False

        for group in self.groups:
            if group not in state:
                visit(group)

    def members(self) -> dict[str, set[str]]:
        """Host names of every group, children included; ``ungrouped`` as Ansible defines it."""
        listed: dict[str, set[str]] = {name: set() for name in self.hosts}
        for group, definition in self.groups.items():
            for name in definition.hosts:
                listed[name].add(group)
        implicit = {"all", "ungrouped"}
        found: dict[str, set[str]] = {
            "all": set(self.hosts),
            "ungrouped": {name for name, groups in listed.items() if groups <= implicit},
        }

        def collect(group: str) -> set[str]:
            if group not in found:
                definition = self.groups[group]
                found[group] = set(definition.hosts).union(*map(collect, definition.children))
            return found[group]

        return {group: collect(group) for group in self.groups}

    def depths(self) -> dict[str, int]:
        """Each group's depth: the longest chain of parents up to ``all``."""
        parents: dict[str, list[str]] = {group: [] for group in self.groups}
        for group, definition in self.groups.items():
            for child in definition.children:
                parents[child].append(group)
        depth: dict[str, int] = {"all": 0}

        def measure(group: str) -> int:
            if group not in depth:
                depth[group] = 1 + max(map(measure, parents[group]), default=0)
            return depth[group]

        return {group: measure(group) for group in self.groups}

    def vars_from(self, directory: Path, name: str) -> dict[str, Any]:
        merged: dict[str, Any] = {}
        for file in _vars_files(directory, name):
            variables = _load_vars_file(file)
            variables.check()
            self.sources.append(file)
            merged.update(variables.values)
        return merged


def _shown(key: str, value: Any) -> str:
    return f"port {value}" if key == "ansible_port" else str(value)


def _merge(*layers: Mapping[str, Any]) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for layer in layers:
        merged.update(layer)
    return merged


# Public functions ----------------------------------------------------------------------------


def resolve_inventory(name: str, base: Path = Path("inventory")) -> Path:
    """Find inventory ``name`` as base/name.yml, .yaml, .ini or base/name, else as a path."""
    if not name:
        raise InventoryError("no inventory given")
    tried = [*(base / f"{name}{suffix}" for suffix in _NAME_SUFFIXES), base / name, Path(name)]
    tried = list(dict.fromkeys(tried))
    for candidate in tried:
        if candidate.exists():
            return candidate
    raise InventoryError(f"inventory '{name}' not found; tried {', '.join(map(str, tried))}")


def load_inventory(path: str | Path) -> Inventory:
    """Load an inventory file or directory, or an inventory name resolved under ./inventory."""
    target = resolve_inventory(str(path))
    builder = _Builder()
    files = _inventory_files(target) if target.is_dir() else [target]
    if not files:
        raise _Where(target).error("no inventory files found")
    for file in files:
        builder.read(file)
    return builder.build(target)
