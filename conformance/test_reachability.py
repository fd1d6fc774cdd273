"""reachability: every node reaches every other node on the rendezvous port and across
NCCL's port range, its own ephemeral ports fall inside that range, and the firewall's
ruleset on the node opens every one of them.

Variables: firewall_rendezvous_port (29500), firewall_port_range (49152-65535),
reachability_range_samples (3 evenly spaced ports between the range's ends, on every
pair), reachability_random_ports (128 random ports of the range per target, shared out
between its sources), reachability_seed (default: a new sample every run),
nic_max_drops (100), nic_max_errors (0) and net_max_retransmit_ratio (0.01): what the NIC
counters may move by during the connects (sampled on every node before and after); TCP
retransmits are laid on the paths of the connects the targets answered, and a lossy path
names the node common to the lossy paths.
Pairs: --pairs auto | all | ring | sample:K (invoke conformance --pairs).
"""

from __future__ import annotations

import time

import pytest

from gpufleet import roles
from gpufleet.conformance.checks.reachability import opened_ports
from gpufleet.conformance.measure.reachability import (
    Matrix,
    PortSpec,
    probe_ports,
    run_matrix,
    source_band,
)
from gpufleet.conformance.nic_counters import (
    Bounds,
    NodeCounters,
    attribute,
    deltas,
    take_all,
)
from gpufleet.conformance.session import ConformanceSession, Node, RecordProperty
from gpufleet.conformance.suites.reachability import ReachabilitySettings
from gpufleet.errors import ParseError
from gpufleet.ports import closed_within, describe, parse_range


def _spec(conformance: ConformanceSession) -> PortSpec:
    first = next(iter(conformance.nodes.values()))
    settings = first.typed(ReachabilitySettings)
    low, high = parse_range(settings.firewall_port_range, first.name, "firewall_port_range")
    rendezvous = settings.firewall_rendezvous_port
    return PortSpec(probe_ports(rendezvous, low, high, settings.reachability_range_samples),
                    low, high, settings.reachability_random_ports,
                    settings.reachability_seed or time.time_ns() // 1000,
                    source_band(low, high, rendezvous))


@pytest.fixture(scope="session")
def measured(conformance: ConformanceSession) -> tuple[Matrix, dict[str, NodeCounters]]:
    spec = _spec(conformance)
    nodes = {n.name: n for n in conformance.ready()}
    before = take_all(nodes.values(), conformance.forks)
    result = run_matrix(conformance, spec, conformance.options.pairs, seed=spec.seed)
    counters = deltas(nodes, before, take_all(nodes.values(), conformance.forks),
                      paths=result.paths())
    for source, why in result.tcp_unknown.items():
        if source in counters:
            counters[source].notes.append(f"per-connection counts unknown: {why}")
    attribute([counters], {n: Bounds.of(node).max_retransmit_ratio
                           for n, node in nodes.items()})
    conformance.add_report("reachability", "matrix", result.to_dict())
    conformance.add_report("reachability", "seed", spec.seed)
    conformance.add_report("reachability", "counters",
                           {n: c.to_dict() for n, c in sorted(counters.items())})
    return result, counters


@pytest.fixture(scope="session")
def matrix(measured: tuple[Matrix, dict[str, NodeCounters]]) -> Matrix:
    return measured[0]


def test_reachable_from_the_cluster(node: Node, matrix: Matrix,
                                    record_property: RecordProperty) -> None:
    if len(matrix.results) == 0:
        pytest.skip("fewer than two reachable nodes selected")
    record_property("random_ports", len(matrix.sampled.get(node.name, [])))
    failures = matrix.failures_to(node.name)
    listener = matrix.listeners.get(node.name, "")
    assert not failures, f"{node.name}: " + "; ".join(
        f"port {port} not reachable from {', '.join(sources)}"
        for port, sources in failures.items()) + (f" (listener: {listener})"
                                                   if listener != "ok" else "")


def test_nic_counters_during_reachability(node: Node, measured: tuple[Matrix, dict[
        str, NodeCounters]], record_property: RecordProperty) -> None:
    result, counters = measured
    if len(result.results) == 0:
        pytest.skip("fewer than two reachable nodes selected")
    mine = counters.get(node.name)
    if mine is None:
        pytest.skip("not measured: the node was not reachable when the run started")
    record_property("counters", {"connects": mine.to_dict()})
    if mine.error:
        pytest.fail(f"unknown: the counters of {node.name} could not be read ({mine.error})")
    problems = mine.problems(Bounds.of(node))
    assert not problems, f"{node.name}: " + "; ".join(problems) + " during the connects"


def test_ephemeral_ports_inside_the_open_range(node: Node) -> None:
    local = node.known.get("port_range")
    if local is None:
        pytest.fail(f"unknown: {node.known.why_absent('port_range')}")
    low, high = parse_range(node.typed(ReachabilitySettings).firewall_port_range, node.name,
                            "firewall_port_range")
    assert low <= local[0] and local[1] <= high, (
        f"net.ipv4.ip_local_port_range is {local[0]}-{local[1]}, outside the open range "
        f"{low}-{high}: NCCL would listen on ports the firewall closes")


def test_firewall_opens_every_ephemeral_port(node: Node, conformance: ConformanceSession,
                                             record_property: RecordProperty) -> None:
    if not node.typed(ReachabilitySettings).firewall_enabled:
        pytest.skip("gpufleet manages no firewall on this node (firewall_enabled)")
    facts = node.known
    local = facts.get("port_range")
    if local is None:
        pytest.fail(f"unknown: {facts.why_absent('port_range')}")
    path = roles.firewall_intent(conformance.inventory, node.host).ruleset_path
    state = facts.get(f"file:{path}")
    if state is None or not state.exists:
        why = facts.why_absent(f"file:{path}") if state is None else "the file is missing"
        pytest.fail(f"unknown: the ruleset {path} cannot be read: {why}")
    try:
        opened = opened_ports(state.text)
    except ParseError as exc:
        pytest.fail(f"unknown: the ruleset {path} cannot be read: {exc}")
    closed = closed_within(opened, local[0], local[1])
    record_property("opened", describe(opened))
    assert not closed, (
        f"net.ipv4.ip_local_port_range is {local[0]}-{local[1]} but the firewall ({path}) "
        f"opens only {describe(opened)}: ephemeral ports {describe(closed)} are closed")
