"""storage: sequential read throughput of the dataset path (large files, dropped from the
page cache, parallel readers) from every node at the same moment, per node against what
training needs per node (dataset size / target epoch time / nodes) and in aggregate
against what the nodes need together; plus a small-file random-read figure.

Variables: storage_dataset_path (required, else SKIP), storage_dataset_gb,
storage_epoch_minutes, storage_nodes (default: the nodes selected), storage_file_gb (1),
storage_readers (4), storage_small_files (2000), storage_min_small_files_per_s (none),
storage_timeout_s (900); perf_trials and the other verdict variables (docs/conformance.md,
"Stable verdicts and baselines"): every figure is the median of its trials, and a node's
median just under its gate is re-measured alone, with more trials.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpufleet.conformance.baseline import judge_node
from gpufleet.conformance.measure.storage import StorageRun, run_storage
from gpufleet.conformance.session import ConformanceSession, Node, RecordProperty
from gpufleet.conformance.suites.storage import StorageSettings
from gpufleet.conformance.verdict import Figure, failures, properties, settings
from gpufleet.suites.probes.storage import need_mbps


def _readers(conformance: ConformanceSession) -> list[Node]:
    return [n for n in conformance.ready() if n.typed(StorageSettings).storage_dataset_path]


def _run(conformance: ConformanceSession) -> StorageRun:
    def measure() -> StorageRun:
        readers = _readers(conformance)
        trials = max((settings(n.host).trials for n in readers), default=1)
        run = run_storage(readers, conformance.forks, trials)
        conformance.add_report("storage", "aggregate", run.aggregate())
        return run

    return conformance.once("storage", measure)


def _need(node: Node, conformance: ConformanceSession) -> tuple[float, str] | None:
    """MB/s one node must read, and how that follows from the variables."""
    settings = node.typed(StorageSettings)
    dataset, epoch = settings.storage_dataset_gb, settings.storage_epoch_minutes
    if dataset is None or epoch is None:
        return None
    nodes = settings.storage_nodes or len(conformance.nodes)
    return (need_mbps(dataset, epoch, nodes),
            f"{dataset} GB in {epoch} min over {nodes} nodes")


def test_storage_throughput(node: Node, conformance: ConformanceSession,
                            record_property: RecordProperty) -> None:
    if not node.typed(StorageSettings).storage_dataset_path:
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
    small = node.typed(StorageSettings).storage_min_small_files_per_s
    figures = [Figure("storage.seq_read_mbps", "MB/s", need[0] if need else None),
               Figure("storage.small_files_per_s", "files/s", small)]

    def measure(trials: int) -> dict[str, list[float]]:
        again = run_storage([node], conformance.forks, trials)
        if node.name in again.errors:
            pytest.fail(f"unknown: the re-measurement failed: {again.errors[node.name]}")
        return _trials(again.results[node.name])

    verdicts = judge_node(node, conformance.options.baseline, figures, measure,
                          first=_trials(result), cost_s=_seconds(result))
    record_property("verdicts", properties(verdicts))
    together = f" (with {len(run.results)} nodes reading at once)" if len(run.results) > 1 else ""
    problems += [f"{message}{together}" for message in failures(verdicts)]
    seq = verdicts.get("storage.seq_read_mbps")
    if need is not None and seq is not None and seq.median < need[0]:
        problems.append(f"training needs {need[0]:.0f} MB/s per node ({need[1]})")
    assert not problems, "; ".join(problems)


def _trials(result: dict[str, Any]) -> dict[str, list[float]]:
    """A storage result's trials by figure name."""
    return {"storage.seq_read_mbps": list(result.get("seq_trials") or [result["seq_read_mbps"]]),
            "storage.small_files_per_s": list(result.get("small_trials")
                                              or [result["small_files_per_s"]])}


def _seconds(result: dict[str, Any]) -> float:
    """How long the node's sequential reads took (the bulk of a storage measurement)."""
    return max(0.0, float(result.get("seq_end", 0)) - float(result.get("seq_start", 0)))


def test_storage_aggregate(conformance: ConformanceSession,
                           record_property: RecordProperty) -> None:
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
