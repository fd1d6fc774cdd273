"""What a role is: desired state from variables, compared with facts, as a list of changes.

A role that can provision can also say how far a host is from its desired state:
``plan`` is the only place that decides, and drift reports what it returns. A role is one
module in roles/ exporting ``ROLE``; it declares everything the engine needs about it (its
variables, facts, plan, the values hosts of a group must share, what it offers others, its
lab stand-ins), and the engine, drift, bootstrap and conformance know it only through
:class:`Role`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from gpufleet.errors import VarError
from gpufleet.facts.gather import FactRequest, Facts
from gpufleet.inventory.model import Host, Inventory
from gpufleet.provision.plan import Change
from gpufleet.provision.standins import Standin

KINDS = ("any", "string", "integer", "number", "boolean", "list", "mapping")


@dataclass(frozen=True)
class Var:
    """One role variable: its default, the kind of value it takes, and what it means."""

    default: Any = None
    kind: str = "any"
    help: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown variable kind {self.kind!r}")


SAFE_PATH = re.compile(r"^/[A-Za-z0-9._/-]+\Z")


class RoleVars:
    """A host's variables over a role's defaults, with typed accessors and clear errors."""

    def __init__(self, host: Host, defaults: Mapping[str, Any]) -> None:
        self.host = host
        self._defaults = defaults

    def get(self, key: str, default: Any = None) -> Any:
        if key in self.host.vars:
            return self.host.vars[key]
        return self._defaults.get(key, default)

    def __contains__(self, key: str) -> bool:
        return self.get(key) is not None

    def fail(self, key: str, expected: str, value: Any) -> VarError:
        """The error for ``key`` holding ``value`` where ``expected`` was needed, with the
        place the inventory sets it."""
        where = self.host.origin(key) if key in self.host.vars else None
        return VarError(f"host {self.host.name}: variable {key} must be {expected}, "
                        f"got {value!r}" + (f" ({where})" if where else ""))

    def string(self, key: str) -> str:
        value = self.get(key)
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise self.fail(key, "a string", value)
        return str(value)

    def opt_string(self, key: str) -> str | None:
        return None if self.get(key) in (None, "") else self.string(key)

    def path(self, key: str, why: str = "") -> str:
        """An absolute path of letters, digits and . _ - / (safe in a shell line and in the
        files that name it); ``why`` says where it goes."""
        value = self.string(key)
        if not SAFE_PATH.match(value):
            raise self.fail(key, "an absolute path of letters, digits and . _ - /"
                            + (f" ({why})" if why else ""), self.get(key))
        return value

    def integer(self, key: str) -> int:
        value = self.get(key)
        try:
            if isinstance(value, bool):
                raise ValueError
            return int(value)
        except (TypeError, ValueError):
            raise self.fail(key, "an integer", value) from None

    def number(self, key: str) -> float:
        value = self.get(key)
        try:
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        except (TypeError, ValueError):
            raise self.fail(key, "a number", value) from None

    def boolean(self, key: str) -> bool:
        value = self.get(key)
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("yes", "true", "1", "on"):
            return True
        if isinstance(value, str) and value.lower() in ("no", "false", "0", "off", ""):
            return False
        if isinstance(value, int):
            return bool(value)
        raise self.fail(key, "a boolean", value)

    def items(self, key: str) -> list[Any]:
        value = self.get(key)
        if value is None:
            return []
        if isinstance(value, str):
            return [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, list):
            raise self.fail(key, "a list", value)
        return value

    def mapping(self, key: str) -> dict[str, Any]:
        value = self.get(key)
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.fail(key, "a mapping", value)
        return value

    def checked(self, key: str, kind: str) -> Any:
        """The value read as ``kind`` (a :data:`KINDS` name); raises VarError when it is not."""
        readers = {"string": self.string, "integer": self.integer, "number": self.number,
                   "boolean": self.boolean, "list": self.items, "mapping": self.mapping}
        reader = readers.get(kind)
        return self.get(key) if reader is None else reader(key)


@dataclass(frozen=True)
class PlanContext:
    """What a role may consult besides the host's own facts and variables."""

    inventory: Inventory
    host: Host


class Role(Protocol):
    """A unit of desired state: one module in roles/ exporting ``ROLE``."""

    @property
    def name(self) -> str: ...

    @property
    def order(self) -> int:
        """Where the role applies among the others (lower first)."""
        ...

    @property
    def variables(self) -> Mapping[str, Var]: ...

    @property
    def defaults(self) -> Mapping[str, Any]: ...

    def active(self, v: RoleVars) -> bool:
        """Whether the inventory asks this role to manage anything on the host."""
        ...

    def check(self, v: RoleVars) -> None:
        """Raise VarError for a variable the role cannot use (before any host is touched)."""
        ...

    def request(self, v: RoleVars) -> FactRequest:
        """The facts the role needs beyond the base set."""
        ...

    def plan(self, facts: Facts, v: RoleVars, ctx: PlanContext) -> list[Change]:
        """The changes that take the host to the desired state (empty when converged)."""
        ...

    @property
    def shared_keys(self) -> tuple[str, ...]:
        """The keys of the values ``shared`` returns."""
        ...

    def shared_request(self, v: RoleVars) -> FactRequest:
        """The facts ``shared`` reads, gathered whether or not the role is active."""
        ...

    def shared(self, facts: Facts, v: RoleVars) -> dict[str, str | None]:
        """Values every host of a group must share, by key of ``shared_keys``: compared
        across the group whether or not the role is active, and left to the role's own plan
        on hosts where it is."""
        ...

    def provides(self, v: RoleVars) -> dict[str, str]:
        """Named values other parts of gpufleet look up (the training interpreter ...)."""
        ...

    def managed_files(self, v: RoleVars) -> dict[str, str]:
        """Every file the role writes on the host: what it is (the variable that sets its
        path, or what it holds) -> its path. Two roles, or one role twice, never manage
        one path (``engine.validate`` refuses it before any host is contacted)."""
        ...

    def admits_members(self, v: RoleVars) -> str | None:
        """The group whose other hosts must re-apply this role when a host joins it."""
        ...

    def in_use(self, facts: Facts, v: RoleVars) -> bool:
        """Whether gpufleet has applied this role on the host before."""
        ...

    def standins(self) -> list[Standin]:
        """The lab's stand-in packages for what this role installs."""
        ...


class RoleBase:
    """Defaults for the optional parts of :class:`Role`; roles override what they use."""

    name: ClassVar[str]
    order: ClassVar[int]
    variables: ClassVar[Mapping[str, Var]] = {}
    shared_keys: ClassVar[tuple[str, ...]] = ()

    @property
    def defaults(self) -> Mapping[str, Any]:
        return {key: var.default for key, var in self.variables.items()}

    def vars(self, host: Host) -> RoleVars:
        """The host's variables over this role's defaults."""
        return RoleVars(host, self.defaults)

    def check(self, v: RoleVars) -> None:
        for key, var in self.variables.items():
            if key in v.host.vars and v.host.vars[key] is not None:
                v.checked(key, var.kind)

    def request(self, v: RoleVars) -> FactRequest:
        return FactRequest()

    def shared_request(self, v: RoleVars) -> FactRequest:
        return FactRequest()

    def shared(self, facts: Facts, v: RoleVars) -> dict[str, str | None]:
        return {}

    def provides(self, v: RoleVars) -> dict[str, str]:
        return {}

    def managed_files(self, v: RoleVars) -> dict[str, str]:
        return {}

    def admits_members(self, v: RoleVars) -> str | None:
        return None

    def in_use(self, facts: Facts, v: RoleVars) -> bool:
        return False

    def standins(self) -> list[Standin]:
        return []
