"""allreduce: torch.distributed all_reduce on every node alone (all nodes at once, all its
GPUs, or ``allreduce_cpu_procs`` gloo processes), then on disjoint pairs of nodes (all pairs
at once), then across every node that passed alone; exact sums, and busbw at the largest
size against the inventory's threshold. A failing or slow pair or multi-node run is
searched to the bad nodes and pairs (adaptive group testing, confirmed against known-good
nodes; a pair's direction from connects both ways). With --with-nccl-tests, nccl-tests'
all_reduce_perf runs too where installed.

Variables: allreduce_sizes (probe defaults: gloo 1M..256M, nccl 1M..8G), allreduce_iters,
allreduce_timeout_s (600), allreduce_bisect_timeout_s (3x the slowest single-node run, at
least 20 s), allreduce_cpu_procs (1), allreduce_port (29500),
allreduce_busbw_thresholds ({model: {nodes: GB/s}}, e.g. {"NVIDIA H200": {1: 330}}),
allreduce_transport_intra (p2p; p2p|nvls|shm|any) and allreduce_transport_inter (ib;
ib|socket|any): the least transport NCCL's channels must use inside a node and across
nodes (read from its INFO log; not checked on gloo or with one rank),
topology_domain or groups named rack*/leaf* (topology_group_prefixes),
allreduce_min_line_rate_fraction (0.7 of the slowest node's line rate, nic_line_rate_gbps
or its link speed, across nodes), nic_max_drops (100), nic_max_errors (0) and
net_max_retransmit_ratio (0.01): what the NIC counters may move by during the pairs and
the run of all nodes.

Alone, every size is timed ``perf_trials`` times and gated on the median (the largest size
against the threshold; every size against the node's baseline with --compare-baseline), and
a median just under its gate is re-measured with more trials.
With a training image (``--image``, ``container_image``) every probe runs in a container
of it on each node.
"""

from __future__ import annotations

import shlex
from concurrent.futures import ThreadPoolExecutor

import pytest

from gpufleet.conformance.baseline import judge_node
from gpufleet.conformance.checks.gpudirect import NO_GDRDMA
from gpufleet.conformance.launch import ProbeRun
from gpufleet.conformance.measure.allreduce import (
    Hierarchy,
    figure,
    gpu_model,
    hierarchical,
    line_rate_share,
    port_of,
    probe_args,
    problem,
    run_allreduce,
    threshold,
    timeout_of,
    trained_down,
    transport_summary,
)
from gpufleet.conformance.nic_counters import Bounds, slow_run_note
from gpufleet.conformance.session import ConformanceSession, Node, RecordProperty
from gpufleet.conformance.suites.allreduce import AllreduceSettings
from gpufleet.conformance.verdict import Figure, failures, properties, settings
from gpufleet.connect.connection import node_local
from gpufleet.errors import ParseError
from gpufleet.facts.parsers import nccl_tests


def _record(run: ProbeRun, record_property: RecordProperty) -> None:
    largest = run.largest
    if largest:
        record_property("largest_size", largest["size"])
        record_property("busbw_gbps", float(figure(float(largest["busbw"]))))
        record_property("world_size", largest["world_size"])
    record_property("duration_s", round(run.duration, 2))
    record_property("nccl_transports", transport_summary(run))


def _alone(conformance: ConformanceSession) -> dict[str, ProbeRun]:
    """Every node's single-node run, all nodes at once (once per run; node-local)."""
    def alone(node: Node) -> ProbeRun:
        with node_local():
            return _run_alone(node, settings(node.host).trials)

    def measure() -> dict[str, ProbeRun]:
        nodes = conformance.ready()
        with ThreadPoolExecutor(max_workers=max(1, min(conformance.forks, len(nodes)))) as pool:
            runs = pool.map(alone, nodes)
            return {n.name: r for n, r in zip(nodes, runs, strict=True)}

    return conformance.once("allreduce-alone", measure)


def _run_alone(node: Node, trials: int) -> ProbeRun:
    return run_allreduce([node], [*probe_args(node), "--trials", str(trials)], timeout_of(node),
                         port_of(node))


def _busbw_trials(run: ProbeRun) -> dict[str, list[float]]:
    """busbw of every trial by figure name (``allreduce.busbw.<bytes>``), for runs of more
    than one process (one process moves no bytes between ranks)."""
    return {f"allreduce.busbw.{r['size']}": [float(x) for x in r.get("busbw_trials")
                                              or [r["busbw"]]]
            for r in run.results if int(r["world_size"]) > 1}


def test_each_node_alone(node: Node, conformance: ConformanceSession,
                         record_property: RecordProperty) -> None:
    run = _alone(conformance)[node.name]
    conformance.add_report("allreduce", f"single {node.name}", run.to_dict())
    _record(run, record_property)
    assert not run.leftovers, f"processes left behind: {run.leftovers}"
    error = run.error()
    assert error is None, error
    largest = run.largest
    assert largest is not None
    first = _busbw_trials(run)
    floor = threshold(node, 1)
    figures = [Figure(name, "GB/s", floor if name.endswith(f".{largest['size']}") else None)
               for name in first]

    def measure(trials: int) -> dict[str, list[float]]:
        again = _run_alone(node, trials)
        assert again.error() is None, f"the re-measurement failed: {again.error()}"
        return _busbw_trials(again)

    verdicts = judge_node(node, conformance.options.baseline, figures, measure,
                          first=first, cost_s=run.duration)
    record_property("verdicts", properties(verdicts))
    problems = failures(verdicts)
    assert not problems, (f"{gpu_model(node)} x1 node: " + "; ".join(problems))


def _together(conformance: ConformanceSession) -> tuple[list[Node], list[str], Hierarchy]:
    """The nodes that passed alone, those that did not, and the pairs, the run of all and
    the search over them (once per run; needs at least two nodes that passed alone)."""
    def measure() -> tuple[list[Node], list[str], Hierarchy]:
        nodes = conformance.ready()
        alone = _alone(conformance)
        good = [n for n in nodes if problem(alone[n.name], n, 1) is None
                and not alone[n.name].leftovers]
        left_out = [n.name for n in nodes if n not in good]
        if len(good) < 2:
            return good, left_out, Hierarchy()
        result = hierarchical(good, conformance.forks, [alone[n.name] for n in good])
        conformance.add_report("allreduce", "all nodes", result.together.to_dict()
                               if result.together else None)
        conformance.add_report("allreduce", "hierarchy", result.to_dict())
        return good, left_out, result

    if len(conformance.ready()) < 2:
        pytest.skip("fewer than two reachable nodes selected")
    return conformance.once("allreduce-together", measure)


def test_all_nodes_together(conformance: ConformanceSession,
                            record_property: RecordProperty) -> None:
    good, left_out, result = _together(conformance)
    record_property("left_out", left_out)
    if len(good) < 2:
        pytest.fail(f"fewer than two nodes passed alone (failed alone: {', '.join(left_out)})")
    assert result.together is not None
    _record(result.together, record_property)
    gate = threshold(good[0], len(good))
    if gate is not None:
        record_property("gate_gbps", gate)
    share = line_rate_share(result.together, result.line_rates)
    if share is not None:
        record_property("line_rate_fraction", float(figure(share[0])))
        record_property("line_rate_gbps", share[1].gbps)
        record_property("line_rate_nics", f"{share[1].node}: {share[1].nics}")
    else:
        record_property("line_rate_fraction", "not checked: " + "; ".join(
            r.nics for r in result.line_rates.values() if r.gbps is None))
    record_property("pairs_s", round(max((r.duration for r in result.pairs), default=0.0), 2))
    leftovers = {n: p for r in [*result.pairs, result.together] for n, p in r.leftovers.items()}
    assert not leftovers, f"processes left behind: {leftovers}"
    if result.search is None:
        return
    record_property("bisection_rounds", result.search.rounds)
    record_property("bisection_s", round(result.search_s, 1))
    rates = result.line_rates
    peers = {n.name: n for n in good}
    failing = problem(result.together, good[0], len(good), rates, peers) or next(
        (found for r in result.pairs if (found := problem(r, good[0], 2, rates, peers))),
        "a pair failed")
    if NO_GDRDMA in failing:
        record_property("finding_class", "configuration")
    verdicts = "; ".join(v.message() for v in result.verdicts) or (
        "no culprit named (the failure did not reproduce in smaller groups)")
    spent = (f"{result.search.rounds} rounds, {result.search_s:.0f}s of a "
             f"{result.budget_s:.0f}s budget" + (", budget spent" if result.search.exhausted
                                                  else ""))
    skipped = f"; failed alone and left out: {', '.join(left_out)}" if left_out else ""
    if trained_down(result.together, rates) is not None:
        record_property("finding_class", "hardware")
    pytest.fail(f"{len(good)}-node AllReduce failed: {failing} -- bisection ({spent}): "
                f"{verdicts}{skipped}{slow_run_note(result.counters.get('all', {}))}")


def test_nic_counters_during_allreduce(node: Node, conformance: ConformanceSession,
                                       record_property: RecordProperty) -> None:
    good, _, result = _together(conformance)
    if node not in good or len(good) < 2:
        pytest.skip("not in a multi-node run (it failed alone, or too few nodes passed)")
    phases = {phase: by_node[node.name] for phase, by_node in result.counters.items()}
    record_property("counters", {p: c.to_dict() for p, c in phases.items()})
    unknown = [f"{p}: {c.error}" for p, c in phases.items() if c.error]
    if unknown:
        pytest.fail(f"unknown: the counters of {node.name} could not be read "
                    f"({'; '.join(unknown)})")
    bounds = Bounds.of(node)
    problems = [f"{text} during the {'pairs' if p == 'pairs' else 'run of all nodes'}"
                for p, c in phases.items() for text in c.problems(bounds)]
    assert not problems, f"{node.name}: " + "; ".join(problems)


def test_nccl_tests_all_reduce_perf(node: Node, conformance: ConformanceSession,
                                    record_property: RecordProperty) -> None:
    if not conformance.options.with_nccl_tests:
        pytest.skip("nccl-tests not requested (--with-nccl-tests)")
    found = node.run("command -v all_reduce_perf").stdout.strip()
    if not found:
        pytest.skip("all_reduce_perf (nccl-tests) is not installed on this node")
    gpus = len(node.known.get("gpus") or []) or 1
    result = node.run(f"NCCL_NVLS_ENABLE=0 {shlex.quote(found)} -b 8 -e "
                      f"{shlex.quote(node.typed(AllreduceSettings).nccl_tests_max_size)} -f 2 "
                      f"-g {gpus}", timeout=timeout_of(node))
    try:
        rows = nccl_tests.nccl_tests(result.stdout)
    except ParseError as exc:
        pytest.fail(f"unknown: all_reduce_perf output could not be read: {exc}")
    conformance.add_report("allreduce", f"nccl-tests {node.name}", rows)
    record_property("nccl_tests_busbw_gbps", rows[-1]["out_of_place"]["busbw"])
    assert result.ok, f"all_reduce_perf exited with {result.rc}"
    wrong = [r["size"] for r in rows if r["out_of_place"]["wrong"] or r["in_place"]["wrong"]]
    assert not wrong, f"all_reduce_perf found wrong results at sizes {wrong}"
