"""The state a conformance run shares between its checks: the selected nodes, their facts
(gathered once, in parallel, one round trip each), connections, and report data."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import testinfra.backend.base
import testinfra.host

from gpufleet import roles as role_registry
from gpufleet.conformance import registry
from gpufleet.conformance.options import ConformanceOptions
from gpufleet.conformance.registry import Settings, Suite
from gpufleet.connect.connection import (
    Budget,
    CommandResult,
    Connection,
    ConnectOptions,
    Connector,
    node_local,
)
from gpufleet.connect.fleet import TaskResult, host_timeout, run_fleet
from gpufleet.connect.open import connect
from gpufleet.errors import GpufleetError
from gpufleet.facts.gather import FactRequest, Facts, gather_facts
from gpufleet.inventory.model import Host, Inventory
from gpufleet.provision.role import RoleVars

CHECK_TIMEOUT_S = 120.0
RecordProperty = Callable[[str, object], None]
"""pytest's ``record_property`` fixture, as the suites' checks take it."""
T = TypeVar("T")
S = TypeVar("S", bound=Settings)


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

    def typed(self, settings: type[S]) -> S:
        """The node's values of a suite's settings (``GpuSettings`` ...), each of its
        declared kind: how suites and their measurements read every suite variable."""
        return settings.read(self.host)

    @property
    def known(self) -> Facts:
        """The node's facts: the ``node`` fixture fails a node without them (with the reason)
        before a check's body runs, and ``ConformanceSession.ready`` leaves such nodes out."""
        if self.facts is None:
            raise GpufleetError(f"host {self.name}: no facts: {self.error}")
        return self.facts

    def var(self, key: str) -> Any:
        """A role's variable of this node as the inventory sets it, None when unset: what
        a suite consults of the roles (``nccl_env``, ``gloo_socket_ifname``,
        ``container_engine``, the NCCL and torch pins), which no suite declares."""
        return RoleVars(self.host, {}).get(key)

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


def facts_request(host: Host, suites: Sequence[Suite] = ()) -> FactRequest:
    """Everything the suites read from facts: the roles' needs, the consistency values and
    what the selected suites declare."""
    return role_registry.host_request(host) | registry.facts_request(host, suites)


@dataclass
class ConformanceSession:
    """Nodes, options and the data suites add to the report."""

    inventory: Inventory
    nodes: dict[str, Node]
    options: ConformanceOptions = field(default_factory=ConformanceOptions)
    report: dict[str, Any] = field(default_factory=dict)
    _report_lock: threading.Lock = field(default_factory=threading.Lock)
    _once: dict[str, tuple[threading.Lock, list[Any]]] = field(default_factory=dict)

    @classmethod
    def start(cls, inventory: Inventory, hosts: list[Host],
              options: ConformanceOptions | None = None,
              suites: Sequence[Suite] = ()) -> ConformanceSession:
        """Gather every node's facts in parallel, one round trip each, with what the
        selected ``suites`` declare."""
        options = options or ConformanceOptions()
        fleet = options.fleet
        def gather(host: Host, conn: Connection) -> TaskResult[Facts]:
            with node_local():
                return TaskResult(gather_facts(conn, facts_request(host, suites)))

        outcomes = run_fleet(hosts, gather, fleet)
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
        return self.options.fleet.forks

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
