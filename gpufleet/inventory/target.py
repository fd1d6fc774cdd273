"""What a command acts on: an inventory and the hosts a ``--limit`` pattern selects."""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.errors import GpufleetError
from gpufleet.inventory.model import Host, Inventory


@dataclass(frozen=True)
class Target:
    """An inventory and the hosts of it a command acts on (never none)."""

    inventory: Inventory
    hosts: list[Host]

    @classmethod
    def select(cls, inventory: Inventory, limit: str | None = None) -> Target:
        """The hosts ``limit`` selects (every host when None); no host is an error."""
        if not inventory.hosts:
            raise GpufleetError(f"inventory {inventory.path} has no hosts")
        hosts = inventory.select(limit)
        if not hosts:
            raise GpufleetError(f"--limit {limit!r} selects no host of {inventory.path}")
        return cls(inventory, hosts)
