"""What a role is: desired state from variables, compared with facts, as a list of changes.

A role that can provision can also say how far a host is from its desired state:
``plan`` is the only place that decides, and drift reports what it returns.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from gpufleet.errors import GpufleetError
from gpufleet.facts import FactRequest, Facts
from gpufleet.inventory import Host, Inventory
from gpufleet.plan import Change


class VarError(GpufleetError):
    """A role variable has the wrong type or an impossible value."""


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

    def _fail(self, key: str, expected: str, value: Any) -> VarError:
        return VarError(f"host {self.host.name}: variable {key} must be {expected}, "
                        f"got {value!r}")

    def string(self, key: str) -> str:
        value = self.get(key)
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise self._fail(key, "a string", value)
        return str(value)

    def opt_string(self, key: str) -> str | None:
        return None if self.get(key) in (None, "") else self.string(key)

    def integer(self, key: str) -> int:
        value = self.get(key)
        try:
            if isinstance(value, bool):
                raise ValueError
            return int(value)
        except (TypeError, ValueError):
            raise self._fail(key, "an integer", value) from None

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
        raise self._fail(key, "a boolean", value)

    def items(self, key: str) -> list[Any]:
        value = self.get(key)
        if value is None:
            return []
        if isinstance(value, str):
            return [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, list):
            raise self._fail(key, "a list", value)
        return value

    def mapping(self, key: str) -> dict[str, Any]:
        value = self.get(key)
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self._fail(key, "a mapping", value)
        return value


@dataclass(frozen=True)
class PlanContext:
    """What a role may consult besides the host's own facts and variables."""

    inventory: Inventory
    host: Host


class Role(Protocol):
    """A unit of desired state: one module in roles/."""

    @property
    def name(self) -> str: ...

    @property
    def defaults(self) -> Mapping[str, Any]: ...

    def active(self, v: RoleVars) -> bool:
        """Whether the inventory asks this role to manage anything on the host."""
        ...

    def request(self, v: RoleVars) -> FactRequest:
        """The facts the role needs beyond the base set."""
        ...

    def plan(self, facts: Facts, v: RoleVars, ctx: PlanContext) -> list[Change]:
        """The changes that take the host to the desired state (empty when converged)."""
        ...
