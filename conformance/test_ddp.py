"""ddp: a small DDP training job (MLP, synthetic data, DistributedSampler) in stages: on 1,
2, 4 ... processes up to all of the node's GPUs (or ``allreduce_cpu_procs`` gloo
processes), then on 1, 2, 4 ... nodes up to every selected node: it initialises, every rank
ends with the same parameters, the loss goes down; scaling efficiency = throughput_N / (N x
throughput_1) and the share of step time spent in communication (DDP with and without
gradient sync) are reported for every stage, each step's efficiency is checked, and the
first step that falls short is named (wider stages are not run).

Variables: ddp_steps (30), ddp_batch_size (64), ddp_width (probe default 1024),
ddp_depth, ddp_timeout_s (600), ddp_min_efficiency (0.85, within a node),
ddp_min_efficiency_across_nodes (0.7); perf_trials and the other verdict variables: the
timed steps run ``perf_trials`` times after the warm-up, the efficiency of each trial is
gated on its median, and a median just under the gate is re-measured with more trials.
With a training image (``--image``, ``container_image``) every probe runs in a container
of it on each node.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from gpufleet.conformance.baseline import judge_node
from gpufleet.conformance.checks import ddp as ddp_checks
from gpufleet.conformance.launch import ProbeRun, processes_per_node
from gpufleet.conformance.measure.ddp import result_line, run_job
from gpufleet.conformance.session import ConformanceSession, Node, RecordProperty
from gpufleet.conformance.suites.ddp import DdpSettings
from gpufleet.conformance.verdict import Figure, failures, judge, properties, settings
from gpufleet.suites.probes.ddp import scaling_efficiency


def _result(run: ProbeRun) -> dict[str, Any]:
    """The job's result line, or a failure naming why there is none."""
    found = result_line(run)
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


def _job(nodes: list[Node], trials: int, nproc: int | None = None) -> dict[str, Any]:
    """The job on ``nodes`` (``nproc`` processes each; default: one per GPU), its result."""
    return _result(run_job(nodes, trials, nproc))


def _within(node: Node, procs: int, trials: int) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The job on one process and (when ``procs`` > 1) on ``procs``, ``trials`` trials each."""
    one = _job([node], trials, 1)
    return one, None if procs == 1 else _job([node], trials, procs)


def _stages(nodes: list[Node], widths: list[int], one: dict[str, Any], trials: int,
            minimum: float, *, per_node: bool) -> tuple[list[ddp_checks.Step], dict[str, Any]]:
    """The curve's first step and its intermediate stages (all but the widest), stopping
    at the first that falls under ``minimum``; the results by width."""
    curve, runs = [ddp_checks.first(one)], {"1": one}
    for width in widths[1:-1]:
        result = (_job(nodes, trials, width) if per_node else _job(nodes[:width], trials))
        runs[str(width)] = result
        curve.append(ddp_checks.step(width, result, curve[0].samples_per_s, curve[-1]))
        if curve[-1].efficiency < minimum:
            break
    return curve, runs


def _figures(one: dict[str, Any], many: dict[str, Any] | None, procs: int
             ) -> dict[str, list[float]]:
    found = {"ddp.throughput_1": list(one.get("trials") or [one["samples_per_s"]])}
    if many is not None:
        found["ddp.efficiency"] = _efficiency(many, procs, one)
    return found


def test_ddp_within_the_node(node: Node, conformance: ConformanceSession,
                             record_property: RecordProperty) -> None:
    procs = processes_per_node(node)
    minimum = node.typed(DdpSettings).ddp_min_efficiency
    trials = settings(node.host).trials
    start = time.monotonic()
    curve, runs = _stages([node], ddp_checks.stages(procs), _job([node], trials, 1), trials,
                          minimum, per_node=True)
    one = runs["1"]
    record_property("throughput_1", round(one["samples_per_s"], 1))
    early = ddp_checks.short(curve, minimum, "processes")
    if early is not None:
        conformance.add_report("ddp", f"node {node.name}",
                               {**runs, "curve": [c.to_dict() for c in curve]})
        record_property("curve", [c.to_dict() for c in curve])
        pytest.fail(f"{early}; not measured beyond {curve[-1].width} processes")
    many = _job([node], trials, procs) if procs > 1 else None
    cost = time.monotonic() - start
    if many is not None:
        curve.append(ddp_checks.step(procs, many, curve[0].samples_per_s, curve[-1]))
    record_property("curve", [c.to_dict() for c in curve])
    figures = [Figure("ddp.throughput_1", "samples/s"), Figure("ddp.efficiency", "", minimum)]
    verdicts = judge_node(node, conformance.options.baseline, figures,
                          lambda trials: _figures(*_within(node, procs, trials), procs),
                          first=_figures(one, many, procs), cost_s=cost)
    record_property("verdicts", properties(verdicts))
    problems = failures(verdicts)
    if many is None:
        conformance.add_report("ddp", f"node {node.name}", {"1": one})
        assert not problems, "; ".join(problems)
        pytest.skip("one GPU on this node: nothing to scale" if node.facts and
                    node.facts.get("gpus") else
                    "one process on this node: nothing to scale (set allreduce_cpu_procs)")
    efficiency = verdicts["ddp.efficiency"].median
    conformance.add_report("ddp", f"node {node.name}", {
        **runs, str(procs): many, "efficiency": efficiency,
        "curve": [c.to_dict() for c in curve]})
    record_property(f"throughput_{procs}", round(many["samples_per_s"], 1))
    record_property("efficiency", round(efficiency, 3))
    record_property("comm_share", many["comm_share"])
    scaling_verdict = verdicts["ddp.efficiency"]
    if not scaling_verdict.passed:
        before = curve[-2].width
        problems.insert(0, f"the step {before} -> {procs} processes falls short: scaling "
                        f"efficiency {efficiency:.2f} on {procs} processes "
                        f"({many['samples_per_s']:.0f} vs {procs} x {one['samples_per_s']:.0f} "
                        f"samples/s) is under {scaling_verdict.gate.value:g}"
                        + ddp_checks.comm_note(many["comm_share"]))
    assert not problems, "; ".join(problems)


def _across(nodes: list[Node], trials: int) -> tuple[dict[str, Any], dict[str, Any]]:
    return _job(nodes[:1], trials), _job(nodes, trials)


def test_ddp_across_nodes(conformance: ConformanceSession,
                          record_property: RecordProperty) -> None:
    nodes = [n for n in conformance.nodes.values() if n.facts is not None]
    if len(nodes) < 2:
        pytest.skip("fewer than two reachable nodes selected")
    first = nodes[0]
    setting = settings(first.host)
    minimum = first.typed(DdpSettings).ddp_min_efficiency_across_nodes
    curve, runs = _stages(nodes, ddp_checks.stages(len(nodes)), _job([first], setting.trials),
                          setting.trials, minimum, per_node=False)
    early = ddp_checks.short(curve, minimum, "nodes")
    if early is not None:
        conformance.add_report("ddp", "all nodes", {**runs,
                                                    "curve": [c.to_dict() for c in curve]})
        record_property("curve", [c.to_dict() for c in curve])
        pytest.fail(f"{early}; not measured beyond {curve[-1].width} nodes")
    alone, together = runs["1"], _job(nodes, setting.trials)
    assert together["nodes"] == len(nodes), f"the job ran on {together['nodes']} nodes"
    curve.append(ddp_checks.step(len(nodes), together, curve[0].samples_per_s, curve[-1]))
    record_property("curve", [c.to_dict() for c in curve])

    def measure(trials: int) -> dict[str, list[float]]:
        again_alone, again = _across(nodes, trials)
        return {"ddp.efficiency_across_nodes": _efficiency(again, len(nodes), again_alone)}

    verdicts = judge([Figure("ddp.efficiency_across_nodes", "", minimum)], measure, setting,
                     first={"ddp.efficiency_across_nodes":
                            _efficiency(together, len(nodes), alone)})
    efficiency = verdicts["ddp.efficiency_across_nodes"].median
    conformance.add_report("ddp", "all nodes", {**runs, "node": alone, "all": together,
                                                "efficiency": efficiency,
                                                "curve": [c.to_dict() for c in curve]})
    record_property("efficiency", round(efficiency, 3))
    record_property("comm_share", together["comm_share"])
    record_property("verdicts", properties(verdicts))
    problems = failures(verdicts)
    assert not problems, (
        f"the step {curve[-2].width} -> {len(nodes)} nodes falls short: scaling efficiency "
        f"across {len(nodes)} nodes {efficiency:.2f} is under {minimum:g}: "
        + "; ".join(problems) + ddp_checks.comm_note(together["comm_share"]))
