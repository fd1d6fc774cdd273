"""An inventory built from Slurm: ``slurm:PARTITION`` or ``slurm:PARTITION:VARS``.

The hosts are the nodes of the partition as slurmctld reports them (``scontrol show
node``): each host is named after its NodeName, is reached at its NodeAddr and belongs to
the groups ``all``, every partition it is in and every feature it has. ``VARS`` names a
normal inventory (a name under inventory/ or a path) whose variables apply, lowest first:
its ``all`` variables, the variables of each of the node's Slurm groups that it defines
(``group_vars/gpu.yml`` is read once the inventory has a group ``gpu``, which may be empty:
``children: {gpu: {}}``), then, for a node it lists itself, that host's own merged
variables (which also adds the host's groups there). ``ansible_host`` comes from NodeAddr
unless the vars inventory sets it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpufleet.errors import InventoryError
from gpufleet.inventory.load import load_inventory
from gpufleet.inventory.model import Host, Inventory
from gpufleet.slurm.client import Slurm, SlurmNode

PREFIX = "slurm:"
_GROUP = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*\Z")


def is_slurm_source(name: str) -> bool:
    """Whether an --inventory value asks for the Slurm inventory."""
    return name.startswith(PREFIX)


def parse_source(name: str) -> tuple[str, str | None]:
    """(partition, vars inventory or None) from ``slurm:PARTITION[:VARS]``."""
    partition, _, vars_from = name.removeprefix(PREFIX).partition(":")
    if not partition:
        raise InventoryError(f"inventory {name!r}: give a Slurm partition, as in slurm:gpu "
                             "or slurm:gpu:prod (variables from inventory prod)")
    return partition, vars_from or None


def load(name: str, slurm: Slurm | None = None,
         find: Callable[[str], Path] | None = None) -> Inventory:
    """The inventory for ``slurm:PARTITION[:VARS]`` from slurmctld's answer."""
    partition, vars_from = parse_source(name)
    slurm = slurm or Slurm()
    known = [p.name for p in slurm.partitions()]
    if partition not in known:
        raise InventoryError(f"inventory {name!r}: Slurm has no partition {partition!r} "
                             f"(partitions: {', '.join(known) or 'none'})")
    nodes = [n for n in slurm.nodes() if partition in n.partitions]
    vars_inventory = load_inventory(find(vars_from) if find else vars_from) if vars_from \
        else None
    return build(nodes, vars_inventory, Path(name) if vars_inventory is None
                 else vars_inventory.path)


def node_groups(node: SlurmNode) -> list[str]:
    """The node's Slurm groups: its partitions, then its features (usable names only)."""
    names = [*node.partitions, *node.features]
    return [g for g in dict.fromkeys(names) if _GROUP.match(g) and g != "all"]


def build(nodes: list[SlurmNode], vars_inventory: Inventory | None, path: Path) -> Inventory:
    """Hosts and groups from Slurm's nodes, variables from ``vars_inventory``."""
    hosts: dict[str, Host] = {}
    groups: dict[str, set[str]] = {"all": set()}
    for node in nodes:
        slurm_groups = node_groups(node)
        listed = vars_inventory.hosts.get(node.name) if vars_inventory else None
        merged: dict[str, Any] = {}
        if vars_inventory is not None:
            merged.update(vars_inventory.group_vars("all"))
            for group in slurm_groups:
                if group in vars_inventory.groups:
                    merged.update(vars_inventory.group_vars(group))
        if listed is not None:
            merged.update(listed.vars)
        merged.setdefault("ansible_host", node.address)
        member_of = {"all", *slurm_groups, *(listed.groups if listed else ())}
        hosts[node.name] = Host(node.name, merged, frozenset(member_of))
        for group in member_of:
            groups.setdefault(group, set()).add(node.name)
    sources = list(vars_inventory.sources) if vars_inventory else []
    return Inventory(path, hosts, groups, sources)
