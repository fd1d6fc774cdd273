"""network: the nodes sit in one layer-2 domain (no routed hop between any two), every path
carries the fabric's MTU, and round trips and their jitter stay under their bounds; each
node's inventory interface has the fabric's MTU. Measured with ping from every source of
the reachability plan (--pairs) to its targets, all sources at once.

Variables: net_mtu (the fabric's MTU; default: the MTU most nodes' inventory interfaces
have), net_max_rtt_us (1000: the smallest of net_ping_count round trips), net_max_jitter_us
(1000: the spread of the 10th to the 90th percentile round trip), net_ping_count (10).
"""

from __future__ import annotations

import pytest

from gpufleet.conformance.checks.network import (
    Placement,
    hop_failure,
    mtu_failure,
    rtt_failure,
)
from gpufleet.conformance.measure.network import interface_mtu, measure
from gpufleet.conformance.session import ConformanceSession, Node, RecordProperty
from gpufleet.conformance.suites.network import NetworkSettings


@pytest.fixture(scope="session")
def placement(conformance: ConformanceSession) -> Placement:
    result = measure(conformance, conformance.options.pairs)
    conformance.add_report("network", "placement", result.to_dict())
    return result


def _judge(node: Node, placement: Placement, failures: list[str]) -> None:
    if node.name in placement.errors:
        pytest.fail(f"unknown: ping from {node.name} failed: {placement.errors[node.name]}")
    if not any(node.name in pair for pair in placement.results):
        pytest.skip("fewer than two reachable nodes selected")
    silent = placement.silent(node.name)
    assert not failures, "; ".join(failures)
    if silent:
        pytest.fail(f"unknown: no echo reply on {', '.join(silent)} (ICMP blocked, or the "
                    "node is down)")


def test_one_layer2_domain(node: Node, placement: Placement) -> None:
    _judge(node, placement, placement.failures(node.name, hop_failure))


def test_path_mtu(node: Node, placement: Placement, record_property: RecordProperty
                  ) -> None:
    record_property("mtu", placement.mtu)
    _judge(node, placement, placement.failures(node.name, mtu_failure))


def test_round_trip_time(node: Node, placement: Placement, record_property: RecordProperty
                         ) -> None:
    mine = [r for pair, r in placement.results.items() if pair[0] == node.name]
    rtts = [r.rtt_min_us for r in mine if r.rtt_min_us is not None]
    if rtts:
        record_property("rtt_min_us", round(min(rtts), 1))
        record_property("rtt_max_us", round(max(rtts), 1))
    settings = node.typed(NetworkSettings)
    failing = rtt_failure(settings.net_max_rtt_us, settings.net_max_jitter_us)
    _judge(node, placement, placement.failures(node.name, failing))


def test_interface_mtu(node: Node, placement: Placement, record_property: RecordProperty
                       ) -> None:
    found = interface_mtu(node)
    if found is None:
        pytest.fail(f"unknown: no interface holds {node.host.vars.get('ansible_host')}")
    name, mtu = found
    record_property("interface", name)
    record_property("mtu", mtu)
    if placement.mtu is None:
        pytest.skip("no fabric MTU: net_mtu undeclared and no interface MTU known")
    declared = node.typed(NetworkSettings).net_mtu
    origin = "net_mtu" if declared is not None else "the MTU most nodes have"
    assert mtu == placement.mtu, f"{name} has MTU {mtu}, the fabric's is {placement.mtu} " \
                                 f"({origin})"
