"""allreduce: torch.distributed all_reduce on each node alone (all its GPUs, or
``allreduce_cpu_procs`` gloo processes), then across every selected node; exact sums, and
busbw at the largest size against the inventory's threshold. A failing or slow multi-node
run is bisected with node pairs to name the culprit. With --with-nccl-tests, nccl-tests'
all_reduce_perf runs too where installed.

Variables: allreduce_sizes (probe defaults: gloo 1M..256M, nccl 1M..8G), allreduce_iters,
allreduce_timeout_s (600), allreduce_cpu_procs (1), allreduce_port (29500),
allreduce_busbw_thresholds ({model: {nodes: GB/s}}, e.g. {"NVIDIA H200": {1: 330}}).
"""

from __future__ import annotations

import shlex

import pytest

from gpufleet import parsers
from gpufleet.conformance.allreduce import (
    bisect,
    gpu_model,
    probe_args,
    run_allreduce,
    threshold,
)
from gpufleet.conformance.launch import ProbeRun
from gpufleet.conformance.session import ConformanceSession, Node
from gpufleet.errors import ParseError


def _timeout(node: Node) -> float:
    return float(node.var("allreduce_timeout_s", 600))


def _port(node: Node) -> int:
    return int(node.var("allreduce_port", node.var("firewall_rendezvous_port", 29500)))


def _problem(run: ProbeRun, node: Node, count: int) -> str | None:
    problem = run.error()
    if problem:
        return problem
    largest = run.largest
    assert largest is not None
    minimum = threshold(node, count)
    if minimum is not None and largest["world_size"] > 1 and largest["busbw"] < minimum:
        return (f"busbw {largest['busbw']:.2f} GB/s at {largest['size']} bytes is under the "
                f"{minimum:g} GB/s threshold for {gpu_model(node)} x{count} node(s)")
    return None


def _record(run: ProbeRun, record_property: pytest.RecordProperty) -> None:
    largest = run.largest
    if largest:
        record_property("largest_size", largest["size"])
        record_property("busbw_gbps", round(float(largest["busbw"]), 3))
        record_property("world_size", largest["world_size"])
    record_property("duration_s", round(run.duration, 2))


def test_each_node_alone(node: Node, conformance: ConformanceSession,
                         record_property: pytest.RecordProperty) -> None:
    run = run_allreduce([node], probe_args(node), _timeout(node), _port(node))
    conformance.add_report("allreduce", f"single {node.name}", run.to_dict())
    _record(run, record_property)
    assert not run.leftovers, f"processes left behind: {run.leftovers}"
    problem = _problem(run, node, 1)
    assert problem is None, problem


def test_all_nodes_together(conformance: ConformanceSession,
                            record_property: pytest.RecordProperty) -> None:
    nodes = [n for n in conformance.nodes.values() if n.facts is not None]
    if len(nodes) < 2:
        pytest.skip("fewer than two reachable nodes selected")
    first = nodes[0]
    run = run_allreduce(nodes, probe_args(first), _timeout(first), _port(first))
    conformance.add_report("allreduce", "all nodes", run.to_dict())
    _record(run, record_property)
    assert not run.leftovers, f"processes left behind: {run.leftovers}"
    problem = _problem(run, first, len(nodes))
    if problem is None:
        return
    culprits = bisect(nodes, probe_args(first), _timeout(first), _port(first)) \
        if len(nodes) > 2 else {}
    conformance.add_report("allreduce", "bisect", culprits)
    named = "; ".join(f"{name}: {why}" for name, why in culprits.items())
    pytest.fail(f"{len(nodes)}-node AllReduce failed: {problem}"
                + (f" -- bisection names {named}" if named else ""))


def test_nccl_tests_all_reduce_perf(node: Node, conformance: ConformanceSession,
                                    record_property: pytest.RecordProperty) -> None:
    if not conformance.options.get("with_nccl_tests"):
        pytest.skip("nccl-tests not requested (--with-nccl-tests)")
    found = node.run("command -v all_reduce_perf").stdout.strip()
    if not found:
        pytest.skip("all_reduce_perf (nccl-tests) is not installed on this node")
    gpus = len(node.facts.get("gpus") or []) or 1  # type: ignore[union-attr]
    result = node.run(f"NCCL_NVLS_ENABLE=0 {shlex.quote(found)} -b 8 -e "
                      f"{shlex.quote(str(node.var('nccl_tests_max_size', '1G')))} -f 2 "
                      f"-g {gpus}", timeout=_timeout(node))
    try:
        rows = parsers.nccl_tests(result.stdout)
    except ParseError as exc:
        pytest.fail(f"unknown: all_reduce_perf output could not be read: {exc}")
    conformance.add_report("allreduce", f"nccl-tests {node.name}", rows)
    record_property("nccl_tests_busbw_gbps", rows[-1]["out_of_place"]["busbw"])
    assert result.ok, f"all_reduce_perf exited with {result.rc}"
    wrong = [r["size"] for r in rows if r["out_of_place"]["wrong"] or r["in_place"]["wrong"]]
    assert not wrong, f"all_reduce_perf found wrong results at sizes {wrong}"
