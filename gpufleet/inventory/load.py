"""Loading an inventory: finding it by name or path, reading its files (YAML, INI,
``ansible-inventory --list`` JSON) into declared groups and hosts, then resolving them as
Ansible does (``all`` and ``ungrouped``, no cycles, depth and priority) into an
``Inventory``."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufleet.errors import InventoryError
from gpufleet.inventory.directory import folded_names, inventory_files, vars_files
from gpufleet.inventory.files import Limits, Where, check_path_text, limits, read_text
from gpufleet.inventory.hosts import host_names
from gpufleet.inventory.model import Host, Inventory
from gpufleet.inventory.precedence import Layer, merge_layers
from gpufleet.inventory.read_ini import ChildLine, HostLine, Section, VarLine, read_ini
from gpufleet.inventory.read_json import JsonInventory, read_json
from gpufleet.inventory.read_yaml import Mapping as YamlMapping
from gpufleet.inventory.read_yaml import parse_yaml
from gpufleet.inventory.templating import Fleet
from gpufleet.inventory.variables import (
    Vars,
    group_priority,
    load_vars_file,
    type_name,
    yaml_entries,
    yaml_vars,
)

_NAME_SUFFIXES = (".yml", ".yaml", ".ini")

_YAML_SUFFIXES = frozenset({".yml", ".yaml", ".json"})

_ADDRESS_KEYS = ("ansible_host", "ansible_port")

_GROUP_SECTIONS = ("hosts", "children", "vars")


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
            raise where.error("a YAML inventory must be a mapping of groups, got "
                              f"{type_name(data)}")
        for name, body, at in yaml_entries(data, where, "inventory"):
            self.yaml_group(name, body, at, None, 0)

    def yaml_group(self, name: Any, body: Any, where: Where, parent: str | None,
                   depth: int) -> None:
        if not isinstance(name, str):
            raise where.error(f"group names must be strings, got {type_name(name)} {name!r}")
        if depth > self.bounds.max_depth:
            raise where.error(f"groups nest more than {self.bounds.max_depth} levels deep "
                              "(GPUFLEET_MAX_INVENTORY_DEPTH)")
        self.group(name)
        if body is not None and not isinstance(body, YamlMapping):
            expected = "a mapping of hosts, children and vars"
            raise where.error(f"group '{name}' must be {expected}, got {type_name(body)}")
        for key, section, at in yaml_entries(body, where, f"group '{name}'"):
            if key not in _GROUP_SECTIONS:
                expected = "expected hosts, children or vars"
                raise at.error(f"unexpected key '{key}' in group '{name}' ({expected})")
            what = f"'{key}' of group '{name}'"
            value = _one_entry(section, at) if isinstance(section, str) else section
            if key == "vars":
                self.add_group_vars(name, yaml_vars(value, at, what))
            elif key == "children":
                for child, child_body, child_at in yaml_entries(value, at, what):
                    self.yaml_group(child, child_body, child_at, name, depth + 1)
                    self.add_child(name, child, child_at)
            else:
                for host, host_body, host_at in yaml_entries(value, at, what):
                    self.yaml_host(host, host_body, host_at, name)

    def yaml_host(self, token: Any, body: Any, where: Where, group: str) -> None:
        if not isinstance(token, str):
            raise where.error(f"host names must be strings, got {type_name(token)} {token!r}")
        self.add_hosts(token, yaml_vars(body, where, f"vars of host '{token}'"), group)

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
                self.add_hosts(entry.token, Vars(entry.values, entry.where), entry.group)
            elif isinstance(entry, VarLine):
                self.add_group_vars(entry.group, Vars({entry.key: entry.value}, entry.where))
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
                self.add_group_vars(name, Vars(group.vars, where))
        for name, group in document.groups.items():
            for child in group.children:
                self.add_child(name, child, where)
            for host in group.hosts:
                self.define_host(host, {}, {}, where)
                self.groups[name].hosts[host] = None
        for host, values in document.hostvars.items():
            variables = Vars(values, where)
            variables.check()
            self.define_host(host, values, variables.origins(), where)

    # Common

    def add_child(self, parent: str, child: str, where: Where) -> None:
        if child == "all":
            raise where.error(f"group 'all' cannot be a child of group '{parent}'")
        self.group(child)
        self.group(parent).children.setdefault(child, where)

    def add_group_vars(self, group: str, variables: Vars) -> None:
        variables.check()
        values = dict(variables.values)
        origins = variables.origins()
        if "ansible_group_priority" in values:
            where = variables.where_of("ansible_group_priority")
            self.groups[group].priority = group_priority(values.pop("ansible_group_priority"),
                                                         where)
            origins.pop("ansible_group_priority")
        self.groups[group].vars.update(values)
        self.groups[group].origins.update(origins)

    def add_hosts(self, token: str, variables: Vars, group: str) -> None:
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
        group_listed = folded_names(group_dir) if read_group else None
        host_listed = folded_names(host_dir) if read_host else None
        group_files = {name: self.vars_from(group_dir, name, group_listed) if read_group
                       else none for name in self.groups}
        host_files = {name: self.vars_from(host_dir, name, host_listed) if read_host else none
                      for name in self.hosts}
        host_groups: dict[str, list[str]] = {name: [] for name in self.hosts}
        for group, names in members.items():
            for name in names:
                host_groups[name].append(group)
        by_groups: dict[frozenset[str], Layer] = {}
        hosts: dict[str, Host] = {}
        fleet = Fleet()
        for name, definition in self.hosts.items():
            groups = frozenset(host_groups[name])
            shared = by_groups.get(groups)
            if shared is None:
                order = sorted(groups, key=lambda g: (depth[g], self.groups[g].priority, g))
                layers = [(self.groups[g].vars, self.groups[g].origins) for g in order]
                shared = by_groups[groups] = Layer(
                    *merge_layers(layers + [group_files[g] for g in order]))
            fleet.hosts[name] = shared.host_vars(
                name, (definition.vars, definition.origins), host_files[name], fleet,
                sorted(groups - {"all"}), source=definition.source)
            hosts[name] = Host(name, fleet.hosts[name], groups)
        inventory = Inventory(path, hosts, members, list(self.sources))
        inventory._group_vars = {
            name: merge_layers([(group.vars, group.origins), group_files[name]])[0]
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
        for file in vars_files(directory, name, listed):
            variables = load_vars_file(file, self.bounds)
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
    files = inventory_files(target) if target.is_dir() else [target]
    if not files:
        raise Where(target).error("no inventory files found")
    for file in files:
        builder.read(file)
    return builder.build(target)
