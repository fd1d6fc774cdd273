"""Storage reads from every node at once: the probe writes its files on every node first,
then every node starts reading at the same wall-clock moment, so a shared filesystem is
measured under the contention of the whole fleet. Each node's own figure comes with the
aggregate of all of them."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from gpufleet.conformance.launch import NodeOutput, run_script
from gpufleet.conformance.session import Node
from gpufleet.conformance.suites.storage import StorageSettings
from gpufleet.connect.connection import node_local
from gpufleet.errors import GpufleetError

START_LEAD_S = 3.0
START_LEAD_PER_NODE_S = 0.05


@dataclass
class StorageRun:
    """Results of one concurrent storage run."""

    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)

    @property
    def on_time(self) -> list[dict[str, Any]]:
        """Results of the nodes that started reading at the common moment (within 1 s)."""
        return [r for r in self.results.values() if float(r.get("late_s", 0)) <= 1.0]

    def aggregate(self) -> dict[str, Any] | None:
        """Bytes read by every on-time node over the window from the first start to the last
        end: the throughput the storage gave all of them together."""
        together = self.on_time
        if not together:
            return None
        start = min(float(r["seq_start"]) for r in together)
        end = max(float(r["seq_end"]) for r in together)
        total = sum(int(r["bytes_read"]) for r in together)
        window = max(end - start, 1e-6)
        return {"nodes": len(together), "bytes_read": total, "window_s": round(window, 3),
                "seq_read_mbps": total / window / 1e6,
                "late": sorted(n for n, r in self.results.items() if r not in together)}

    def to_dict(self) -> dict[str, Any]:
        return {"nodes": self.results, "errors": self.errors, "aggregate": self.aggregate()}


def probe_args(node: Node, trials: int = 1) -> list[str]:
    """The probe's sizes from the node's variables, and its trials."""
    settings = node.typed(StorageSettings)
    return ["--path", str(settings.storage_dataset_path),
            "--file-gb", str(settings.storage_file_gb),
            "--readers", str(settings.storage_readers),
            "--small-files", str(settings.storage_small_files),
            "--trials", str(trials)]


def _failure(output: NodeOutput) -> str:
    error = next((e.get("message") for e in output.events if e.get("event") == "error"),
                 output.stderr_tail)
    return f"the storage probe failed (exit {output.rc}): {error}"


def _event(output: NodeOutput, name: str) -> dict[str, Any] | None:
    return next((e for e in output.events if e.get("event") == name), None)


def run_storage(nodes: list[Node], forks: int, trials: int = 1) -> StorageRun:
    """Prepare the files on every node, then read from all of them at once (``trials``
    timed reads of each kind, back to back)."""
    run = StorageRun()
    if not nodes:
        return run
    workers = max(1, min(forks, len(nodes)))

    def prepare(node: Node) -> tuple[Node, str | None]:
        timeout = node.typed(StorageSettings).storage_timeout_s
        try:
            with node_local():
                output = run_script(node, "storage", [*probe_args(node), "--prepare"],
                                    timeout)
        except GpufleetError as exc:
            return node, str(exc)
        return node, None if output.rc == 0 and _event(output, "prepared") else _failure(output)

    with ThreadPoolExecutor(max_workers=workers) as pool:
        prepared = list(pool.map(prepare, nodes))
    ready = []
    for node, error in prepared:
        if error:
            run.errors[node.name] = error
        else:
            ready.append(node)
    start_at = time.time() + START_LEAD_S + START_LEAD_PER_NODE_S * min(workers, len(ready))

    def read(node: Node) -> tuple[str, dict[str, Any] | None, str | None]:
        lead = max(0.0, start_at - time.time())
        timeout = node.typed(StorageSettings).storage_timeout_s + lead
        try:
            with node_local():  # each node reads its own files; the start time is shared
                output = run_script(node, "storage", [*probe_args(node, trials),
                                                      "--start-at", f"{start_at:.3f}"], timeout)
        except GpufleetError as exc:
            return node.name, None, str(exc)
        result = _event(output, "result")
        if result is None or output.rc != 0:
            return node.name, None, _failure(output)
        return node.name, result, None

    with ThreadPoolExecutor(max_workers=workers) as pool:
        for name, result, error in pool.map(read, ready):
            if result is not None:
                run.results[name] = result
            else:
                run.errors[name] = str(error)
    return run
