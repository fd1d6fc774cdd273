"""storage: sequential read throughput of the dataset path (large files, dropped from the
page cache, parallel readers) from every node at the same moment, per node against what
training needs per node (dataset size / target epoch time / nodes) and in aggregate
against what the nodes need together; plus a small-file random-read figure.

Variables: storage_dataset_path (required, else SKIP), storage_dataset_gb,
storage_epoch_minutes, storage_nodes (default: the nodes selected), storage_file_gb (1),
storage_readers (4), storage_small_files (2000), storage_min_small_files_per_s (none),
storage_timeout_s (900).
"""

from __future__ import annotations

import pytest

from conformance.probes.storage import need_mbps
from gpufleet.conformance.session import ConformanceSession, Node
from gpufleet.conformance.storage import StorageRun, run_storage


def _readers(conformance: ConformanceSession) -> list[Node]:
    return [n for n in conformance.ready() if n.var("storage_dataset_path")]


def _run(conformance: ConformanceSession) -> StorageRun:
    def measure() -> StorageRun:
        run = run_storage(_readers(conformance), conformance.forks)
        conformance.add_report("storage", "aggregate", run.aggregate())
        return run

    return conformance.once("storage", measure)


def _need(node: Node, conformance: ConformanceSession) -> tuple[float, str] | None:
    """MB/s one node must read, and how that follows from the variables."""
    dataset, epoch = node.var("storage_dataset_gb"), node.var("storage_epoch_minutes")
    if dataset is None or epoch is None:
        return None
    nodes = int(node.var("storage_nodes", len(conformance.nodes)))
    return (need_mbps(float(dataset), float(epoch), nodes),
            f"{dataset} GB in {epoch} min over {nodes} nodes")


def test_storage_throughput(node: Node, conformance: ConformanceSession,
                            record_property: pytest.RecordProperty) -> None:
    if not node.var("storage_dataset_path"):
        pytest.skip("no dataset path in the inventory (storage_dataset_path)")
    run = _run(conformance)
    if node.name in run.errors:
        pytest.fail(f"unknown: {run.errors[node.name]}")
    result = run.results[node.name]
    conformance.add_report("storage", node.name, result)
    for key in ("seq_read_mbps", "small_files_per_s", "small_read_mbps", "cache_dropped"):
        record_property(key, result[key])
    record_property("read_together_with", len(run.results) - 1)
    problems = []
    if not result["cache_dropped"]:
        problems.append("the page cache could not be dropped: the figures may be cached "
                        f"reads ({result.get('note', '')})")
    need = _need(node, conformance)
    if need is not None:
        record_property("need_mbps", round(need[0], 1))
        if result["seq_read_mbps"] < need[0]:
            problems.append(f"sequential reads at {result['seq_read_mbps']:.0f} MB/s (with "
                            f"{len(run.results)} nodes reading at once), training needs "
                            f"{need[0]:.0f} MB/s per node ({need[1]})")
    small = node.var("storage_min_small_files_per_s")
    if small is not None and result["small_files_per_s"] < float(small):
        problems.append(f"{result['small_files_per_s']:.0f} small files/s, under {small}")
    assert not problems, "; ".join(problems)


def test_storage_aggregate(conformance: ConformanceSession,
                           record_property: pytest.RecordProperty) -> None:
    readers = _readers(conformance)
    if not readers:
        pytest.skip("no node has a dataset path (storage_dataset_path)")
    run = _run(conformance)
    total = run.aggregate()
    if total is None:
        pytest.fail("unknown: no node read at the common start: "
                    + "; ".join(f"{n}: {e}" for n, e in run.errors.items()))
    record_property("aggregate_mbps", round(total["seq_read_mbps"], 1))
    record_property("nodes", total["nodes"])
    record_property("window_s", total["window_s"])
    need = _need(readers[0], conformance)
    if need is None:
        pytest.skip("storage_dataset_gb and storage_epoch_minutes unset: nothing to compare "
                    f"the aggregate {total['seq_read_mbps']:.0f} MB/s with")
    wanted = need[0] * total["nodes"]
    record_property("need_mbps", round(wanted, 1))
    late = f"; started late: {', '.join(total['late'])}" if total["late"] else ""
    assert total["seq_read_mbps"] >= wanted, (
        f"{total['nodes']} nodes reading at once got {total['seq_read_mbps']:.0f} MB/s in "
        f"aggregate, training needs {wanted:.0f} MB/s ({need[1]}){late}")
