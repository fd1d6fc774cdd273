"""Where an inventory comes from: a path, a name looked up in ``./inventory/`` and then in
the configured inventory directory (``GPUFLEET_INVENTORY_DIR``, or ``inventory_dir`` in
gpufleet's configuration file), or a Slurm partition (``slurm:PARTITION[:VARS]``). Every
command and the conformance plugin load inventories through here."""

from __future__ import annotations

import os
from pathlib import Path

from gpufleet.errors import GpufleetError
from gpufleet.inventory.load import load_inventory, resolve_inventory
from gpufleet.inventory.model import Inventory
from gpufleet.inventory.target import Target
from gpufleet.slurm import inventory as slurm_inventory

INVENTORY_DIR_ENV = "GPUFLEET_INVENTORY_DIR"
LOCAL_DIR = Path("inventory")
_configured: list[str] = []


class NoInventory(GpufleetError):
    """A fleet command was given no inventory."""


def configure(inventory_dir: str | None) -> None:
    """The configuration file's ``inventory_dir`` (the command line sets it once per run)."""
    _configured[:] = [inventory_dir] if inventory_dir else []


def search_dirs(configured: str | None = None) -> list[Path]:
    """Where inventory names are looked up, in order: ./inventory, then the configured
    directory (the environment variable wins over the configuration file)."""
    dirs = [LOCAL_DIR]
    extra = os.environ.get(INVENTORY_DIR_ENV) or configured or next(iter(_configured), None)
    if extra:
        dirs.append(Path(os.path.expanduser(extra)))
    return dirs


def find(name: str, configured: str | None = None) -> Path:
    """The inventory file or directory ``name`` stands for (InventoryError when none)."""
    return resolve_inventory(name, search_dirs(configured))


def load_source(name: str | None, configured: str | None = None) -> Inventory:
    """An inventory by name or path, or from Slurm for ``slurm:PARTITION[:VARS]``."""
    if not name:
        raise NoInventory("no inventory given: use -i/--inventory NAME or PATH (names are "
                          f"looked up in ./inventory/ and ${INVENTORY_DIR_ENV})")
    if slurm_inventory.is_slurm_source(name):
        return slurm_inventory.load(name, find=lambda v: find(v, configured))
    return load_inventory(find(name, configured))


def load_target(name: str | None, limit: str | None, configured: str | None = None) -> Target:
    """Load the inventory and select hosts; an empty selection is an error."""
    return Target.select(load_source(name, configured), limit)
