"""The storage suite: dataset reads from every node at one moment."""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.conformance.registry import Suite, setting
from gpufleet.conformance.suites.common import Performance, Probe, check_performance


@dataclass(frozen=True, kw_only=True)
class StorageSettings(Probe, Performance):
    """What the storage suite reads."""

    storage_dataset_path: str | None = setting(None, "string", "the dataset directory")
    storage_dataset_gb: float | None = setting(None, "number", "size of the dataset")
    storage_epoch_minutes: float | None = setting(None, "number",
                                                  "time an epoch's reads may take")
    storage_nodes: int | None = setting(None, "integer",
                                        "nodes reading at once (default: the selected)")
    storage_file_gb: float = setting(1, "number", "size of each read file")
    storage_readers: int = setting(4, "integer", "parallel readers per node")
    storage_small_files: int = setting(2000, "integer", "small files read")
    storage_min_small_files_per_s: float | None = setting(None, "number",
                                                          "small-file read floor")
    storage_timeout_s: float = setting(900, "number", "limit of each read")

SUITE = Suite(
    "storage", ("acceptance",),
    "dataset reads from every node at one moment: per node and aggregate",
    order=90,
    settings=StorageSettings,
    cross_node=frozenset({"storage_aggregate"}), records_baseline=True,
    check=check_performance)
