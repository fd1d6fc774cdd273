"""p2p: GPU-to-GPU copy bandwidth for every GPU pair, and host-to-device / device-to-host,
through PyTorch, against thresholds per GPU model; the slow pair is named.

Variables: p2p_min_gbps ({model: GB/s}), h2d_min_gbps ({model: GB/s}), p2p_size_mb (1024).
"""

from __future__ import annotations

import pytest

from conformance.probes.p2p import slow_pairs
from gpufleet.conformance.allreduce import gpu_model
from gpufleet.conformance.launch import run_script
from gpufleet.conformance.session import ConformanceSession, Node


def _threshold(node: Node, key: str) -> float | None:
    value = (node.var(key) or {}).get(gpu_model(node))
    return None if value is None else float(value)


def test_p2p_bandwidth(node: Node, conformance: ConformanceSession,
                       record_property: pytest.RecordProperty) -> None:
    if not node.facts.get("gpus"):  # type: ignore[union-attr]
        pytest.skip(f"no NVIDIA GPU: {node.facts.why_absent('gpus')}")  # type: ignore[union-attr]
    output = run_script(node, "p2p", ["--size-mb", str(node.var("p2p_size_mb", 1024))], 600)
    if output.rc != 0:
        pytest.fail(f"unknown: the p2p probe failed (exit {output.rc}): {output.stderr_tail}")
    pairs = [e for e in output.events if e.get("event") == "pair"]
    h2d = [e for e in output.events if e.get("event") in ("h2d", "d2h")]
    conformance.add_report("p2p", node.name, {"pairs": pairs, "host": h2d})
    record_property("pairs", {f"{p['src']}->{p['dst']}": round(p["gbps"], 1) for p in pairs})
    record_property("host", {f"{e['event']}{e['gpu']}": round(e["gbps"], 1) for e in h2d})
    problems = []
    minimum = _threshold(node, "p2p_min_gbps")
    if minimum is not None:
        problems += slow_pairs(pairs, minimum)
    host_minimum = _threshold(node, "h2d_min_gbps")
    if host_minimum is not None:
        problems += [f"GPU{e['gpu']} {e['event']} {e['gbps']:.1f} GB/s < {host_minimum:g} GB/s"
                     for e in h2d if e["gbps"] < host_minimum]
    assert not problems, "; ".join(problems)
