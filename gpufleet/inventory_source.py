"""Where an inventory comes from: a name, file or directory, or a Slurm partition
(``slurm:PARTITION[:VARS]``); every command and the conformance plugin load through here."""

from __future__ import annotations

from gpufleet import slurm_inventory
from gpufleet.inventory import Inventory, load_inventory, resolve_inventory


def load_source(inventory: str) -> Inventory:
    """An inventory by name or path, or from Slurm for ``slurm:PARTITION[:VARS]``."""
    if slurm_inventory.is_slurm_source(inventory):
        return slurm_inventory.load(inventory)
    return load_inventory(resolve_inventory(inventory))
