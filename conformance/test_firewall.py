"""firewall: the node's complete live ruleset (every nft table, iptables-nft and
iptables-legacy rules) admits new TCP connections from every cluster member to the
rendezvous port and to every port of the opened range, whoever wrote the rules. A
drop or reject is named with its table, chain and rule; a rule that may drop (a rate
limit, an expression not understood) is reported, not failed.

Variables (the firewall role's): firewall_cluster_group (all), firewall_rendezvous_port
(29500), firewall_port_range (49152-65535), firewall_open_tcp_ports, firewall_extra_cidrs;
and firewall_read_timeout_s (60): the longest the node may take to list its ruleset, within
what is left of the host's budget (5 s of which stay for the checks after this one).
"""

from __future__ import annotations

import pytest

from gpufleet import roles
from gpufleet.conformance.launch import socket_ifname
from gpufleet.conformance.session import ConformanceSession, Node, RecordProperty
from gpufleet.conformance.suites.firewall import FirewallSettings
from gpufleet.connect.connection import CommandTimeout
from gpufleet.errors import GpufleetError, ParseError
from gpufleet.firewall_analysis.live import LIVE_RULESET, analyse_live

RESERVE_S = 5.0


def read_limit(node: Node) -> float:
    """How long listing the ruleset may take: the suite's limit, within the host's budget
    less what the later checks need."""
    limit = node.typed(FirewallSettings).firewall_read_timeout_s
    left = node.budget.remaining()
    return limit if left is None else max(1.0, min(limit, left - RESERVE_S))


def test_live_rules_admit_the_cluster(node: Node, conformance: ConformanceSession,
                                      record_property: RecordProperty) -> None:
    try:
        intent = roles.firewall_intent(conformance.inventory, node.host)
    except GpufleetError as exc:
        pytest.fail(f"unknown: {exc}")
    sources, ports = intent.sources, intent.ports
    limit = read_limit(node)
    try:
        result = node.run(LIVE_RULESET.shell, timeout=limit)
    except CommandTimeout:
        pytest.fail(f"unknown: ruleset too large to read in {limit:.0f} s (nft -j list "
                    "ruleset and the iptables saves did not finish; firewall_read_timeout_s "
                    "and the host's budget bound it)")
    try:
        live = LIVE_RULESET.parse(result.stdout)
        analysis = analyse_live(live, sources, ports, socket_ifname(node))
    except (ParseError, GpufleetError) as exc:
        pytest.fail(f"unknown: the live ruleset could not be analysed: {exc}")
    record_property("uncertain", [f.message() for f in analysis.uncertain])
    record_property("notes", list(analysis.notes))
    blocked = [f.message() for f in analysis.blocked]
    assert not blocked, "; ".join(blocked)
