"""Node-local checks on every selected node at once.

pytest runs a check parametrised over nodes one item after another. The plugin groups the
items of one check (the same function with the same other parameters); when the first item
of a group is called, the check's function runs for every node of the group at once, at
most ``--forks`` at a time. Each item then reports its own node's outcome (returned,
failed, skipped, or raised), the properties it recorded and its own duration, so the
per-host summary, the JSON report and the JUnit file read as if the items had run one by
one. A check needs nothing to take part: its remote work is inside its function.

Commands a check issues here are node-local (``node_local``): the Slurm launcher carries
the nodes' commands of one moment in one job step.

A check runs this way when every argument it takes is ``node``, ``record_property``, a
parameter of its own, or a fixture wider than one test (session or module scope, such as
``conformance``); any other check runs item by item, as pytest runs it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pytest

from gpufleet.connect.connection import node_local

PER_NODE_ARGS = frozenset({"node", "record_property"})


@dataclass
class NodeRun:
    """What a check's function did on one node."""

    error: BaseException | None = None
    properties: list[tuple[str, object]] = field(default_factory=list)
    duration: float = 0.0


@dataclass
class _Group:
    items: list[pytest.Function]
    runs: dict[str, NodeRun] | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)


def node_param(item: pytest.Item) -> str | None:
    """The node an item runs on, or None for an item that is not per node."""
    callspec = getattr(item, "callspec", None)
    value = callspec.params.get("node") if callspec is not None else None
    return None if value is None else str(value)


def _group_key(item: pytest.Function) -> tuple[str, str, str]:
    params = {k: v for k, v in item.callspec.params.items() if k != "node"}
    return (str(item.path), item.originalname, repr(sorted(params.items(), key=str)))


def runs_together(item: pytest.Function) -> bool:
    """Whether every argument of the item's function can be shared across its nodes."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    params = set(item.callspec.params)
    for name in info.argnames:
        if name in PER_NODE_ARGS or name in params:
            continue
        defs = info.name2fixturedefs.get(name)
        if not defs or defs[-1].scope == "function":
            return False
    return True


class FleetParallel:
    """Groups the per-node items of a run and runs each group's function concurrently."""

    def __init__(self, node_of: Callable[[str], Any], forks: int) -> None:
        self.node_of = node_of
        self.forks = max(1, forks)
        self._groups: dict[str, _Group] = {}

    def collect(self, items: Iterable[pytest.Item]) -> None:
        """Remember which items run together (call once the run's items are final)."""
        grouped: dict[tuple[str, str, str], list[pytest.Function]] = {}
        for item in items:
            if isinstance(item, pytest.Function) and node_param(item) is not None \
                    and runs_together(item):
                grouped.setdefault(_group_key(item), []).append(item)
        for members in grouped.values():
            if len(members) < 2:
                continue
            group = _Group(members)
            for item in members:
                self._groups[item.nodeid] = group

    def run(self, item: pytest.Function) -> NodeRun | None:
        """This item's node run (running the whole group the first time), or None when the
        item runs on its own."""
        group = self._groups.get(item.nodeid)
        if group is None:
            return None
        with group.lock:
            if group.runs is None:
                group.runs = self._run_group(group, item)
        return group.runs.get(str(node_param(item)))

    def _run_group(self, group: _Group, first: pytest.Function) -> dict[str, NodeRun]:
        argnames = first._fixtureinfo.argnames
        shared = {name: first.funcargs[name] for name in argnames
                  if name not in PER_NODE_ARGS}
        function = first.obj
        names = [str(node_param(i)) for i in group.items]
        nodes = {n: self.node_of(n) for n in names}
        ready = [n for n in names if getattr(nodes[n], "facts", None) is not None]

        def one(name: str) -> tuple[str, NodeRun]:
            run = NodeRun()
            kwargs = dict(shared)
            if "node" in argnames:
                kwargs["node"] = nodes[name]
            if "record_property" in argnames:
                kwargs["record_property"] = lambda key, value: run.properties.append(
                    (key, value))
            start = time.perf_counter()
            try:
                with node_local():
                    function(**kwargs)
            except (Exception, pytest.skip.Exception, pytest.fail.Exception,
                    pytest.xfail.Exception) as exc:
                run.error = exc
            run.duration = time.perf_counter() - start
            return name, run

        with ThreadPoolExecutor(max_workers=min(self.forks, max(1, len(ready))),
                                thread_name_prefix="gpufleet-check") as pool:
            return dict(pool.map(one, ready))


def replay(item: pytest.Function, run: NodeRun) -> None:
    """Report ``run`` as this item's own call: its properties, then its outcome."""
    item.user_properties.extend(run.properties)
    if run.error is not None:
        raise run.error
