"""The storage suite: dataset reads from every node at one moment."""

from __future__ import annotations

from gpufleet.conformance.registry import Suite
from gpufleet.conformance.suites.common import PERFORMANCE, check_performance, probe_variables
from gpufleet.provision.role import Var

SUITE = Suite(
    "storage", ("acceptance",),
    "dataset reads from every node at one moment: per node and aggregate",
    order=90,
    variables={**PERFORMANCE, **probe_variables(),
               "storage_dataset_path": Var(None, "string", "the dataset directory"),
               "storage_dataset_gb": Var(None, "number", "size of the dataset"),
               "storage_epoch_minutes": Var(None, "number", "time an epoch's reads may take"),
               "storage_nodes": Var(None, "integer",
                                    "nodes reading at once (default: the selected)"),
               "storage_file_gb": Var(1, "number", "size of each read file"),
               "storage_readers": Var(4, "integer", "parallel readers per node"),
               "storage_small_files": Var(2000, "integer", "small files read"),
               "storage_min_small_files_per_s": Var(None, "number", "small-file read floor"),
               "storage_timeout_s": Var(900, "number", "limit of each read")},
    cross_node=frozenset({"storage_aggregate"}), records_baseline=True,
    check=check_performance)
