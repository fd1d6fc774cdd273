"""Where an inventory comes from: a name, file or directory, or a Slurm partition
(``slurm:PARTITION[:VARS]``); every command and the conformance plugin load through here."""

from __future__ import annotations

from gpufleet.inventory.model import Inventory, load_inventory, resolve_inventory
from gpufleet.slurm import inventory as slurm_inventory


def load_source(inventory: str) -> Inventory:
    """An inventory by name or path, or from Slurm for ``slurm:PARTITION[:VARS]``."""
    if slurm_inventory.is_slurm_source(inventory):
        return slurm_inventory.load(inventory)
    return load_inventory(resolve_inventory(inventory))
