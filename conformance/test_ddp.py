"""ddp: a small DDP training job (MLP, synthetic data, DistributedSampler) on 1 process and
on all of the node's GPUs (or ``allreduce_cpu_procs`` gloo processes), then across every
selected node: it initialises, every rank ends with the same parameters, the loss goes
down; scaling efficiency = throughput_N / (N x throughput_1) and the share of step time
spent in communication (DDP with and without gradient sync) are reported and checked.

Variables: ddp_steps (30), ddp_batch_size (64), ddp_width (probe default 1024),
ddp_depth, ddp_timeout_s (600), ddp_min_efficiency (0.85, within a node),
ddp_min_efficiency_across_nodes (0.7); perf_trials and the other verdict variables: the
timed steps run ``perf_trials`` times after the warm-up, the efficiency of each trial is
gated on its median, and a median just under the gate is re-measured with more trials.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from gpufleet.conformance.baseline import judge_node
from gpufleet.conformance.launch import ProbeRun, processes_per_node, rendezvous_port, run_probe
from gpufleet.conformance.session import ConformanceSession, Node, RecordProperty
from gpufleet.conformance.verdict import Figure, failures, judge, properties, settings
from gpufleet.suites.probes.ddp import scaling_efficiency


def _args(node: Node) -> list[str]:
    args = ["--steps", str(node.var("ddp_steps")),
            "--batch-size", str(node.var("ddp_batch_size"))]
    for key, flag in (("ddp_width", "--width"), ("ddp_depth", "--depth")):
        if node.var(key) is not None:
            args += [flag, str(node.var(key))]
    return args


def _timeout(node: Node) -> float:
    return float(node.var("ddp_timeout_s"))




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


def _efficiency(many: dict[str, Any], procs: int, one: dict[str, Any]) -> list[float]:
    """Each trial of the job on ``procs`` units against ``procs`` x the median on one."""
    return [scaling_efficiency(t, procs, one["samples_per_s"])
            for t in many.get("trials") or [many["samples_per_s"]]]


def _within(node: Node, procs: int, trials: int) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The job on one process and (when ``procs`` > 1) on ``procs``, ``trials`` trials each."""
    args = [*_args(node), "--trials", str(trials)]
    one = _result(run_probe("ddp", [node], args, _timeout(node), port=rendezvous_port(node),
                            nproc=1))
    if procs == 1:
        return one, None
    return one, _result(run_probe("ddp", [node], args, _timeout(node), port=rendezvous_port(node),
                                  nproc=procs))


def _figures(one: dict[str, Any], many: dict[str, Any] | None, procs: int
             ) -> dict[str, list[float]]:
    found = {"ddp.throughput_1": list(one.get("trials") or [one["samples_per_s"]])}
    if many is not None:
        found["ddp.efficiency"] = _efficiency(many, procs, one)
    return found


def test_ddp_within_the_node(node: Node, conformance: ConformanceSession,
                             record_property: RecordProperty) -> None:
    procs = processes_per_node(node)
    start = time.monotonic()
    one, many = _within(node, procs, settings(node.host).trials)
    cost = time.monotonic() - start
    record_property("throughput_1", round(one["samples_per_s"], 1))
    figures = [Figure("ddp.throughput_1", "samples/s"),
               Figure("ddp.efficiency", "", float(node.var("ddp_min_efficiency")))]
    verdicts = judge_node(node, conformance.options.baseline, figures,
                          lambda trials: _figures(*_within(node, procs, trials), procs),
                          first=_figures(one, many, procs), cost_s=cost)
    record_property("verdicts", properties(verdicts))
    problems = failures(verdicts)
    if many is None:
        conformance.add_report("ddp", f"node {node.name}", {"1": one})
        assert not problems, "; ".join(problems)
        pytest.skip("one process on this node: nothing to scale (set allreduce_cpu_procs)")
    efficiency = verdicts["ddp.efficiency"].median
    conformance.add_report("ddp", f"node {node.name}", {"1": one, str(procs): many,
                                                        "efficiency": efficiency})
    record_property(f"throughput_{procs}", round(many["samples_per_s"], 1))
    record_property("efficiency", round(efficiency, 3))
    record_property("comm_share", many["comm_share"])
    scaling = verdicts["ddp.efficiency"]
    if not scaling.passed:
        problems.insert(0, f"scaling efficiency {efficiency:.2f} on {procs} processes "
                        f"({many['samples_per_s']:.0f} vs {procs} x {one['samples_per_s']:.0f} "
                        f"samples/s) is under {scaling.gate.value:g}; communication takes "
                        f"{many['comm_share']:.0%} of a step")
    assert not problems, "; ".join(problems)


def _across(nodes: list[Node], trials: int) -> tuple[dict[str, Any], dict[str, Any]]:
    first = nodes[0]
    args = [*_args(first), "--trials", str(trials)]
    alone = _result(run_probe("ddp", [first], args, _timeout(first), port=rendezvous_port(first)))
    together = _result(run_probe("ddp", nodes, args, _timeout(first), port=rendezvous_port(first)))
    return alone, together


def test_ddp_across_nodes(conformance: ConformanceSession,
                          record_property: RecordProperty) -> None:
    nodes = [n for n in conformance.nodes.values() if n.facts is not None]
    if len(nodes) < 2:
        pytest.skip("fewer than two reachable nodes selected")
    first = nodes[0]
    setting = settings(first.host)
    alone, together = _across(nodes, setting.trials)
    assert together["nodes"] == len(nodes), f"the job ran on {together['nodes']} nodes"

    def measure(trials: int) -> dict[str, list[float]]:
        again_alone, again = _across(nodes, trials)
        return {"ddp.efficiency_across_nodes": _efficiency(again, len(nodes), again_alone)}

    minimum = float(first.var("ddp_min_efficiency_across_nodes"))
    verdicts = judge([Figure("ddp.efficiency_across_nodes", "", minimum)], measure, setting,
                     first={"ddp.efficiency_across_nodes":
                            _efficiency(together, len(nodes), alone)})
    efficiency = verdicts["ddp.efficiency_across_nodes"].median
    conformance.add_report("ddp", "all nodes", {"node": alone, "all": together,
                                                "efficiency": efficiency})
    record_property("efficiency", round(efficiency, 3))
    record_property("comm_share", together["comm_share"])
    record_property("verdicts", properties(verdicts))
    problems = failures(verdicts)
    assert not problems, (
        f"scaling efficiency across {len(nodes)} nodes {efficiency:.2f} is under {minimum:g}: "
        + "; ".join(problems) + f"; communication takes {together['comm_share']:.0%} of a step")
