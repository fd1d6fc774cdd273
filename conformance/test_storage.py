"""storage: aggregate sequential read throughput of the dataset path (large files, dropped
from the page cache, parallel readers) against what training needs per node — dataset size
/ target epoch time / nodes — plus a small-file random-read figure.

Variables: storage_dataset_path (required, else SKIP), storage_dataset_gb,
storage_epoch_minutes, storage_nodes (default: the nodes selected), storage_file_gb (1),
storage_readers (4), storage_small_files (2000), storage_min_small_files_per_s (none),
storage_timeout_s (900).
"""

from __future__ import annotations

import pytest

from conformance.probes.storage import need_mbps
from gpufleet.conformance.launch import run_script
from gpufleet.conformance.session import ConformanceSession, Node


def test_storage_throughput(node: Node, conformance: ConformanceSession,
                            record_property: pytest.RecordProperty) -> None:
    path = node.var("storage_dataset_path")
    if not path:
        pytest.skip("no dataset path in the inventory (storage_dataset_path)")
    args = ["--path", str(path), "--file-gb", str(node.var("storage_file_gb", 1)),
            "--readers", str(node.var("storage_readers", 4)),
            "--small-files", str(node.var("storage_small_files", 2000))]
    output = run_script(node, "storage", args, float(node.var("storage_timeout_s", 900)))
    result = next((e for e in output.events if e.get("event") == "result"), None)
    if result is None or output.rc != 0:
        error = next((e.get("message") for e in output.events if e.get("event") == "error"),
                     output.stderr_tail)
        pytest.fail(f"unknown: the storage probe failed (exit {output.rc}): {error}")
    conformance.add_report("storage", node.name, result)
    for key in ("seq_read_mbps", "small_files_per_s", "small_read_mbps", "cache_dropped"):
        record_property(key, result[key])
    problems = []
    if not result["cache_dropped"]:
        problems.append("the page cache could not be dropped: the figures may be cached "
                        f"reads ({result.get('note', '')})")
    dataset, epoch = node.var("storage_dataset_gb"), node.var("storage_epoch_minutes")
    if dataset is not None and epoch is not None:
        nodes = int(node.var("storage_nodes", len(conformance.nodes)))
        need = need_mbps(float(dataset), float(epoch), nodes)
        record_property("need_mbps", round(need, 1))
        if result["seq_read_mbps"] < need:
            problems.append(f"sequential reads at {result['seq_read_mbps']:.0f} MB/s, training "
                            f"needs {need:.0f} MB/s per node ({dataset} GB in {epoch} min over "
                            f"{nodes} nodes)")
    small = node.var("storage_min_small_files_per_s")
    if small is not None and result["small_files_per_s"] < float(small):
        problems.append(f"{result['small_files_per_s']:.0f} small files/s, under {small}")
    assert not problems, "; ".join(problems)
