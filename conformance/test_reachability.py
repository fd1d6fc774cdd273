"""reachability: every node reaches every other node on the rendezvous port and across
NCCL's port range, and its own ephemeral ports fall inside that range.

Variables: firewall_rendezvous_port (29500), firewall_port_range (49152-65535),
reachability_range_samples (3 ports between the range's ends). Pairs: --pairs
all | ring | sample:K (invoke conformance --pairs).
"""

from __future__ import annotations

import pytest

from gpufleet.conformance.reachability import Matrix, probe_ports, run_matrix
from gpufleet.conformance.session import ConformanceSession, Node
from roles.nccl_env import parse_range

DEFAULT_RANGE = "49152-65535"


def _ports(conformance: ConformanceSession) -> list[int]:
    first = next(iter(conformance.nodes.values()))
    low, high = parse_range(first.var("firewall_port_range", DEFAULT_RANGE), first.name,
                            "firewall_port_range")
    return probe_ports(int(first.var("firewall_rendezvous_port", 29500)), low, high,
                       int(first.var("reachability_range_samples", 3)))


@pytest.fixture(scope="session")
def matrix(conformance: ConformanceSession) -> Matrix:
    result = run_matrix(conformance, _ports(conformance), conformance.options["pairs"])
    conformance.add_report("reachability", "matrix", result.to_dict())
    return result


def test_reachable_from_the_cluster(node: Node, matrix: Matrix) -> None:
    if len(matrix.results) == 0:
        pytest.skip("fewer than two reachable nodes selected")
    failures = matrix.failures_to(node.name)
    listener = matrix.listeners.get(node.name, "")
    assert not failures, f"{node.name}: " + "; ".join(
        f"port {port} not reachable from {', '.join(sources)}"
        for port, sources in failures.items()) + (f" (listener: {listener})"
                                                   if listener != "ok" else "")


def test_ephemeral_ports_inside_the_open_range(node: Node) -> None:
    local = node.facts.get("port_range")  # type: ignore[union-attr]
    if local is None:
        pytest.fail(f"unknown: {node.facts.why_absent('port_range')}")  # type: ignore[union-attr]
    low, high = parse_range(node.var("firewall_port_range", DEFAULT_RANGE), node.name,
                            "firewall_port_range")
    assert low <= local[0] and local[1] <= high, (
        f"net.ipv4.ip_local_port_range is {local[0]}-{local[1]}, outside the open range "
        f"{low}-{high}: NCCL would listen on ports the firewall closes")
