"""The state a conformance run shares between its checks: the selected nodes, their facts
(gathered once, in parallel, one round trip each), connections, and report data."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import testinfra.backend.base
import testinfra.host

from gpufleet import roles as role_registry
from gpufleet.connect.connection import Budget, CommandResult, Connection, ConnectOptions, Connector
from gpufleet.connect.fleet import DEFAULT_FORKS, FleetOptions, TaskResult, host_timeout, run_fleet
from gpufleet.connect.open import connect
from gpufleet.facts.gather import FactRequest, Facts, gather_facts
from gpufleet.inventory.model import Host, Inventory
from gpufleet.provision.engine import active_roles, fact_request
from gpufleet.provision.role import RoleVars
from gpufleet.roles import consistency_request

CHECK_TIMEOUT_S = 120.0
T = TypeVar("T")


class GpufleetBackend(testinfra.backend.base.BaseBackend):  # type: ignore[misc]
    """A testinfra backend over gpufleet's connection (host keys verified, become honoured)."""

    NAME = "gpufleet"

    def __init__(self, node: Node) -> None:
        super().__init__(node.name)
        self.node = node

    def run(self, command: str, *args: str, **kwargs: Any) -> testinfra.backend.base.CommandResult:
        cmd = self.get_command(command, *args)
        result = self.node.run(cmd)
        return self.result(result.rc, self.encode(cmd), result.stdout.encode(),
                           result.stderr.encode())


@dataclass
class Node:
    """One selected host: its facts (or why they are missing) and a lazy connection, under
    the node's budget for the whole run (once it is spent, checks get no further command)."""

    host: Host
    connect_options: ConnectOptions
    facts: Facts | None = None
    error: str | None = None
    budget: Budget = field(default_factory=Budget)
    connector: Connector = connect
    _conn: Connection | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def name(self) -> str:
        return self.host.name

    def var(self, key: str, default: Any = None) -> Any:
        """An inventory variable of this host (checks keep their own defaults)."""
        return self.host.vars.get(key, default)

    def flag(self, key: str, default: bool | None) -> bool | None:
        """A boolean variable ("yes", "false", 0 ... as roles read them); None stays None."""
        if self.host.vars.get(key, default) is None:
            return None
        return RoleVars(self.host, {key: default}).boolean(key)

    def numbers(self, key: str, default: tuple[int, ...]) -> tuple[int, ...]:
        """A list of integers, also written as "48, 79" in INI inventories."""
        return tuple(int(x) for x in RoleVars(self.host, {key: list(default)}).items(key))

    @property
    def conn(self) -> Connection:
        with self._lock:
            if self._conn is None:
                self._conn = self.connector(self.host, self.connect_options, self.budget)
            return self._conn

    def run(self, command: str, timeout: float = CHECK_TIMEOUT_S,
            stdin: bytes | None = None) -> CommandResult:
        return self.conn.run(command, timeout=timeout, stdin=stdin)

    @property
    def testinfra(self) -> testinfra.host.Host:
        """A testinfra ``host`` for this node."""
        return testinfra.host.Host(GpufleetBackend(self))

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


def facts_request(host: Host) -> FactRequest:
    """Everything the suites read from facts: the roles' needs and the consistency values."""
    return fact_request(active_roles(host, role_registry.ALL)) | consistency_request(host)


@dataclass
class ConformanceSession:
    """Nodes, options and the data suites add to the report."""

    inventory: Inventory
    nodes: dict[str, Node]
    options: dict[str, Any] = field(default_factory=dict)
    report: dict[str, Any] = field(default_factory=dict)
    _report_lock: threading.Lock = field(default_factory=threading.Lock)
    _once: dict[str, tuple[threading.Lock, list[Any]]] = field(default_factory=dict)

    @classmethod
    def start(cls, inventory: Inventory, hosts: list[Host], fleet: FleetOptions,
              options: dict[str, Any]) -> ConformanceSession:
        """Gather every node's facts in parallel, one round trip each."""
        outcomes = run_fleet(hosts, lambda h, c: TaskResult(gather_facts(c, facts_request(h))),
                             fleet)
        nodes = {}
        for host in hosts:
            outcome = outcomes[host.name]
            node = Node(host, fleet.connect, outcome.value, connector=fleet.connector)
            if outcome.value is None:
                node.error = f"{outcome.status}: {outcome.error}"
            else:
                node.budget.start(host_timeout(host, fleet))
            nodes[host.name] = node
        return cls(inventory, nodes, options)

    @property
    def forks(self) -> int:
        """How many nodes a check works on at once (``--forks``)."""
        fleet = self.options.get("fleet")
        return fleet.forks if isinstance(fleet, FleetOptions) else DEFAULT_FORKS

    def ready(self) -> list[Node]:
        """The selected nodes whose facts were gathered, in inventory order."""
        return [n for n in self.nodes.values() if n.facts is not None]

    def once(self, key: str, compute: Callable[[], T]) -> T:
        """``compute()`` run once per run for every check (and every node's thread) that
        asks for ``key``; the others wait for it and share its value. A raised exception
        is not kept: the next caller computes again."""
        with self._report_lock:
            lock, box = self._once.setdefault(key, (threading.Lock(), []))
        with lock:
            if not box:
                box.append(compute())
            value: T = box[0]
            return value

    def add_report(self, suite: str, key: str, value: Any) -> None:
        """Attach data (a matrix, a bandwidth table) to the JSON report."""
        with self._report_lock:
            self.report.setdefault(suite, {})[key] = value

    def close(self) -> None:
        for node in self.nodes.values():
            node.close()
