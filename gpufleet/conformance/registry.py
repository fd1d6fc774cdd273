"""The suite registry: the machinery that finds and selects the conformance suites.

A suite is ``conformance/test_<name>.py`` and its declaration, a module
``gpufleet/conformance/suites/<name>.py`` exporting ``SUITE``: which sets it belongs to,
which of its checks need other nodes, what bootstrap does with it, its settings (a frozen
dataclass of the inventory variables it reads, each with its kind, default and meaning,
validated for every selected host before any host is contacted, read typed by its checks)
and which facts it needs beyond the roles' (added to the one facts round trip). The
registry discovers the declarations as the role registry discovers roles and names no
suite itself; the commands, bootstrap and the pytest plugin read suites only from here.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import importlib
import pkgutil
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

from gpufleet.errors import GpufleetError
from gpufleet.facts.gather import FactRequest, Facts
from gpufleet.inventory.model import Host
from gpufleet.provision.role import RoleVars, Var

SETS = ("conformance", "acceptance")  # the first is the default
ALL = "all"
DECLARATIONS = "gpufleet.conformance.suites"

Predicate = Callable[[Host, "Facts | None"], bool]
S = TypeVar("S", bound="Settings")
_VAR = "gpufleet.var"
_TYPES = {"string": "str", "integer": "int", "number": "float", "boolean": "bool",
          "list": "list", "mapping": "dict"}


def setting(default: Any, kind: str, help: str) -> Any:
    """A field of a suite's settings: the inventory variable of its name, its default, its
    kind (a :data:`gpufleet.provision.role.KINDS` name) and what it means."""
    return declared(Var(default, kind, help))


def declared(var: Var) -> Any:
    """A field of a suite's settings declared by a :class:`Var` (one shared with a role or
    another suite)."""
    if isinstance(var.default, list | dict):
        return dataclasses.field(default_factory=functools.partial(copy.copy, var.default),
                                 metadata={_VAR: var})
    return dataclasses.field(default=var.default, metadata={_VAR: var})


@dataclass(frozen=True, kw_only=True)
class Settings:
    """A suite's typed settings: a frozen dataclass whose fields are made by
    :func:`setting` or :func:`declared`; a suite body reads them with ``node.typed(...)``."""

    @classmethod
    def variables(cls) -> dict[str, Var]:
        """Each field's variable, by name."""
        return {f.name: f.metadata[_VAR] for f in dataclasses.fields(cls)}

    @classmethod
    def read(cls: type[S], host: Host) -> S:
        """The host's values over the declared defaults, each read as its kind (None where
        unset without a default)."""
        variables = cls.variables()
        v = RoleVars(host, {k: var.default for k, var in variables.items()})
        return cls(**{key: _typed(v, key, var.kind) for key, var in variables.items()})

    @classmethod
    def mistyped(cls) -> list[str]:
        """Fields whose annotation does not say their kind, or says None where they have a
        default (or not where they have none)."""
        wrong = []
        for f in dataclasses.fields(cls):
            var = f.metadata.get(_VAR)
            if var is None:
                wrong.append(f"{f.name} (not a setting)")
                continue
            text = str(f.type)
            base = text.removesuffix(" | None").split("[")[0]
            if ((var.kind != "any" and base != _TYPES[var.kind])
                    or text.endswith(" | None") != (var.default is None)):
                wrong.append(f"{f.name}: {text} ({var.kind}, default {var.default!r})")
        return wrong


def _typed(v: RoleVars, key: str, kind: str) -> Any:
    """``key`` read as ``kind``; None when unset. A number the inventory wrote as an integer
    stays one (an int is a float to the type checker), so messages show it as written:
    ``host_min_memory_gb 1000000``, not ``1e+06`` or ``1000000.0``."""
    value = v.get(key)
    if value is None:
        return None
    if kind == "number" and isinstance(value, int) and not isinstance(value, bool):
        return value
    return v.checked(key, kind)


def always(host: Host, facts: Facts | None) -> bool:
    """``required_when`` of a suite bootstrap requires on every node."""
    return True


@dataclass(frozen=True)
class Suite:
    """One suite's declaration.

    ``order``: its place in listings and selections (``all``, a set);
    ``cross_node``: checks that need other nodes (the rest runs on one node alone);
    ``with_peer``: the cross-node checks bootstrap runs with the new node and its peer;
    ``required_when``: bootstrap runs the suite's node-local checks and, when the predicate
    holds for the node, requires at least one of them to pass; ``records_baseline``: its
    performance figures go into the node's baseline (bootstrap runs it too);
    ``settings``: the typed variables it reads; ``check``: validation beyond each
    variable's kind (ranges, choices).
    """

    name: str
    sets: tuple[str, ...]
    summary: str
    order: int
    settings: type[Settings] = Settings
    cross_node: frozenset[str] = frozenset()
    with_peer: frozenset[str] = frozenset()
    required_when: Predicate | None = None
    records_baseline: bool = False
    facts: Callable[[Host], FactRequest] | None = None
    check: Callable[[RoleVars], None] | None = None

    @property
    def variables(self) -> dict[str, Var]:
        return self.settings.variables()

    @property
    def module(self) -> str:
        return f"test_{self.name}"

    def path(self) -> Path:
        return suites_dir() / f"{self.module}.py"

    def node_local(self, check: str) -> bool:
        """Whether ``check`` (``test_x`` or ``x``) runs on one node without the others."""
        return check.removeprefix("test_") not in self.cross_node

    def vars(self, host: Host) -> RoleVars:
        """The host's values of this suite's variables over their declared defaults."""
        return RoleVars(host, {k: v.default for k, v in self.variables.items()})


def discover() -> dict[str, Suite]:
    """Every module of the declarations package that exports ``SUITE``, by name, in the
    order the suites declare; a declaration not named after its suite, or whose settings'
    annotations do not say their kinds, is an internal error."""
    package = importlib.import_module(DECLARATIONS)
    found: dict[str, Suite] = {}
    for module in pkgutil.iter_modules(package.__path__):
        entry = getattr(importlib.import_module(f"{DECLARATIONS}.{module.name}"), "SUITE", None)
        if entry is None:
            continue
        if not isinstance(entry, Suite) or entry.name != module.name:
            raise AssertionError(f"{DECLARATIONS}.{module.name}.SUITE is not the Suite "
                                 f"named {module.name}")
        if wrong := entry.settings.mistyped():
            raise AssertionError(f"{DECLARATIONS}.{module.name}: settings "
                                 f"{', '.join(wrong)}")
        found[entry.name] = entry
    return {s.name: s for s in sorted(found.values(), key=lambda s: (s.order, s.name))}


@functools.cache
def all_suites() -> dict[str, Suite]:
    """Every suite, discovered once (on first use, so a declaration may import this
    module), in their declared order."""
    return discover()


def suites_dir() -> Path:
    """Where the suites are installed (they are files pytest collects)."""
    path = Path(str(resources.files("gpufleet.suites")))
    if not path.is_dir():
        raise GpufleetError(f"gpufleet's conformance suites are not on a filesystem ({path}); "
                            "install gpufleet unzipped")
    return path


def suite(name: str) -> Suite:
    return all_suites()[name]


def select(names: str | Sequence[str] | None) -> list[Suite]:
    """Suites named in a comma-separated list or sequence of suites and sets
    (``conformance`` when None; ``all``), each once, in the order asked."""
    suites = all_suites()
    given = names.split(",") if isinstance(names, str) else list(names or [SETS[0]])
    wanted: list[str] = []
    for name in (n.strip() for n in given if n.strip()):
        if name == ALL:
            members = list(suites)
        elif name in SETS:
            members = members_of(name)
        else:
            members = [name]
        wanted += [m for m in members if m not in wanted]
    unknown = [s for s in wanted if s not in suites]
    if unknown or not wanted:
        raise GpufleetError(f"unknown suite(s) {', '.join(unknown) or 'none given'}; suites are "
                            f"{', '.join(suites)}; sets are {', '.join([*SETS, ALL])}")
    return [suites[s] for s in wanted]


def members_of(name: str) -> list[str]:
    """The suites of the set ``name``, in their order."""
    return [s.name for s in all_suites().values() if name in s.sets]


def sets_help() -> str:
    """The sets and their suites as ``--suite``'s help says them, the default set first."""
    listed = [f"{name} ({'default: ' if name == SETS[0] else ''}{', '.join(members_of(name))})"
              for name in SETS]
    return ", ".join([*listed, ALL])


def defaults() -> dict[str, object]:
    """Every suite variable's default (a variable several suites read has one default)."""
    merged: dict[str, Var] = {}
    for entry in all_suites().values():
        for key, var in entry.variables.items():
            if merged.setdefault(key, var) != var:
                raise AssertionError(f"suite variable {key} is declared twice differently")
    return {k: v.default for k, v in merged.items()}


def validate(hosts: Iterable[Host], suites: Sequence[Suite], most: int = 20) -> None:
    """Every selected suite's variables on every host, by kind and by the suite's own
    check; a BadVariables error lists the problems (host, variable, file:line)."""
    from gpufleet.provision.engine import BadVariables  # noqa: PLC0415 - engine imports heavy

    problems: list[str] = []
    for host in hosts:
        for entry in suites:
            v = entry.vars(host)
            try:
                for key, var in entry.variables.items():
                    if v.get(key) is not None:
                        v.checked(key, var.kind)
                if entry.check is not None:
                    entry.check(v)
            except GpufleetError as exc:
                if str(exc) not in problems:
                    problems.append(str(exc))
    if problems:
        more = f" (and {len(problems) - most} more)" if len(problems) > most else ""
        raise BadVariables("; ".join(problems[:most]) + more)


def facts_request(host: Host, suites: Sequence[Suite]) -> FactRequest:
    """The facts the selected suites need beyond the roles'."""
    request = FactRequest()
    for entry in suites:
        if entry.facts is not None:
            request = request | entry.facts(host)
    return request


def bootstrap_suites() -> list[Suite]:
    """The suites bootstrap runs on the new node alone: the required ones and those that
    record its baseline."""
    return [s for s in all_suites().values() if s.required_when is not None or s.records_baseline]


def peer_suites() -> list[Suite]:
    """The suites whose cross-node checks bootstrap runs with the new node and its peer."""
    return [s for s in all_suites().values() if s.with_peer]


def required(host: Host, facts: Facts | None) -> list[str]:
    """The suites that must each pass a check for ``host`` to be certified: the inventory's
    ``bootstrap_required_suites``, else those whose condition holds on the node."""
    choosable = [s.name for s in all_suites().values() if s.required_when is not None]
    configured = RoleVars(host, {"bootstrap_required_suites": None}).items(
        "bootstrap_required_suites")
    if configured:
        unknown = [str(s) for s in configured if s not in choosable]
        if unknown:
            raise GpufleetError(f"host {host.name}: bootstrap_required_suites names "
                                f"{', '.join(unknown)}; the suites bootstrap can require are "
                                f"{', '.join(choosable)}")
        return [str(s) for s in configured]
    return [s.name for s in all_suites().values()
            if s.required_when is not None and s.required_when(host, facts)]
