"""ddp: a small DDP training job (MLP, synthetic data, DistributedSampler) on 1 process and
on all of the node's GPUs (or ``allreduce_cpu_procs`` gloo processes), then across every
selected node: it initialises, every rank ends with the same parameters, the loss goes
down; scaling efficiency = throughput_N / (N x throughput_1) and the share of step time
spent in communication (DDP with and without gradient sync) are reported and checked.

Variables: ddp_steps (30), ddp_batch_size (64), ddp_width (probe default 1024),
ddp_depth, ddp_timeout_s (600), ddp_min_efficiency (0.85, within a node),
ddp_min_efficiency_across_nodes (0.7).
"""

from __future__ import annotations

from typing import Any

import pytest

from conformance.probes.ddp import scaling_efficiency
from gpufleet.conformance.launch import ProbeRun, processes_per_node, run_probe
from gpufleet.conformance.session import ConformanceSession, Node


def _args(node: Node) -> list[str]:
    args = ["--steps", str(node.var("ddp_steps", 30)),
            "--batch-size", str(node.var("ddp_batch_size", 64))]
    for key, flag in (("ddp_width", "--width"), ("ddp_depth", "--depth")):
        if node.var(key) is not None:
            args += [flag, str(node.var(key))]
    return args


def _timeout(node: Node) -> float:
    return float(node.var("ddp_timeout_s", 600))


def _port(node: Node) -> int:
    return int(node.var("allreduce_port", node.var("firewall_rendezvous_port", 29500)))


def _result(run: ProbeRun) -> dict[str, Any]:
    """The job's result line, or a failure naming why there is none."""
    found = next((e for o in run.outputs.values() for e in o.events
                  if e.get("event") == "result"), None)
    if found is None:
        pytest.fail(f"the DDP job reported no result: {run.error()}")
    problems = []
    if not found["params_identical"]:
        problems.append(f"ranks hold different parameters after the steps (checksum spread "
                        f"{found['param_checksum_spread']:g})")
    if not (found["loss_last"] is not None and found["loss_first"] is not None
            and found["loss_last"] < found["loss_first"]):
        problems.append(f"the loss did not go down ({found['loss_first']} -> "
                        f"{found['loss_last']})")
    if run.leftovers:
        problems.append(f"processes left behind: {run.leftovers}")
    assert not problems, "; ".join(problems)
    return found


def test_ddp_within_the_node(node: Node, conformance: ConformanceSession,
                             record_property: pytest.RecordProperty) -> None:
    one = _result(run_probe("ddp", [node], _args(node), _timeout(node), port=_port(node),
                            nproc=1))
    procs = processes_per_node(node)
    record_property("throughput_1", round(one["samples_per_s"], 1))
    if procs == 1:
        conformance.add_report("ddp", f"node {node.name}", {"1": one})
        pytest.skip("one process on this node: nothing to scale (set allreduce_cpu_procs)")
    many = _result(run_probe("ddp", [node], _args(node), _timeout(node), port=_port(node),
                             nproc=procs))
    efficiency = scaling_efficiency(many["samples_per_s"], procs, one["samples_per_s"])
    conformance.add_report("ddp", f"node {node.name}", {"1": one, str(procs): many,
                                                        "efficiency": efficiency})
    record_property(f"throughput_{procs}", round(many["samples_per_s"], 1))
    record_property("efficiency", round(efficiency, 3))
    record_property("comm_share", many["comm_share"])
    minimum = float(node.var("ddp_min_efficiency", 0.85))
    assert efficiency >= minimum, (
        f"scaling efficiency {efficiency:.2f} on {procs} processes ({many['samples_per_s']:.0f} "
        f"vs {procs} x {one['samples_per_s']:.0f} samples/s) is under {minimum:g}; "
        f"communication takes {many['comm_share']:.0%} of a step")


def test_ddp_across_nodes(conformance: ConformanceSession,
                          record_property: pytest.RecordProperty) -> None:
    nodes = [n for n in conformance.nodes.values() if n.facts is not None]
    if len(nodes) < 2:
        pytest.skip("fewer than two reachable nodes selected")
    first = nodes[0]
    alone = _result(run_probe("ddp", [first], _args(first), _timeout(first), port=_port(first)))
    together = _result(run_probe("ddp", nodes, _args(first), _timeout(first),
                                 port=_port(first)))
    efficiency = scaling_efficiency(together["samples_per_s"], len(nodes),
                                    alone["samples_per_s"])
    conformance.add_report("ddp", "all nodes", {"node": alone, "all": together,
                                                "efficiency": efficiency})
    record_property("efficiency", round(efficiency, 3))
    record_property("comm_share", together["comm_share"])
    assert together["nodes"] == len(nodes), f"the job ran on {together['nodes']} nodes"
    minimum = float(first.var("ddp_min_efficiency_across_nodes", 0.7))
    assert efficiency >= minimum, (
        f"scaling efficiency across {len(nodes)} nodes {efficiency:.2f} is under {minimum:g}; "
        f"communication takes {together['comm_share']:.0%} of a step")
