"""Ports a rendered gpufleet ruleset opens vs the ephemeral port range: on the captured
rulesets of tests/fixtures/firewall (rendered by roles/firewall.py) and on fresh renders."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.conformance.checks.reachability import opened_ports
from gpufleet.errors import ParseError
from gpufleet.facts.gather import Facts
from gpufleet.inventory.load import load_inventory
from gpufleet.ports import closed_within, describe, merge
from gpufleet.provision.role import PlanContext, RoleVars
from gpufleet.roles import firewall
from tests.conftest import FIXTURES

RULESETS = FIXTURES / "firewall"


@pytest.mark.parametrize("name", ["gpufleet.nft", "gpufleet.rules"])
def test_the_captured_rulesets_open_22_29500_and_the_whole_range(name: str) -> None:
    opened = opened_ports((RULESETS / name).read_text())
    assert opened == [(22, 22), (29500, 29500), (49152, 65535)]
    assert closed_within(opened, 49152, 65535) == []


def _render(tmp_path: Path, backend: str, port_range: str) -> str:
    path = tmp_path / "hosts.yml"
    path.write_text(f"""all:
  vars:
    firewall_enabled: true
    firewall_backend: {backend}
    firewall_port_range: "{port_range}"
    gpufleet_controllers: [172.16.0.5]
  hosts:
    gpu01: {{ansible_host: 10.0.0.11}}
    gpu02: {{ansible_host: 10.0.0.12}}
""")
    inv = load_inventory(path)
    host = inv.hosts["gpu01"]
    return firewall.ROLE.render(Facts({}, {}), RoleVars(host, firewall.ROLE.defaults),
                                PlanContext(inv, host))


@pytest.mark.parametrize("backend", ["nftables", "iptables"])
def test_a_narrower_opened_range_leaves_the_rest_of_the_ephemeral_range_closed(
        tmp_path: Path, backend: str) -> None:
    firewall._resolve.cache_clear()
    opened = opened_ports(_render(tmp_path, backend, "50000-60000"))
    assert opened == [(22, 22), (29500, 29500), (50000, 60000)]
    assert closed_within(opened, 49152, 65535) == [(49152, 49999), (60001, 65535)]
    assert closed_within(opened, 50000, 60000) == []
    assert describe(closed_within(opened, 49152, 65535)) == "49152-49999, 60001-65535"


def test_sets_of_ports_and_adjacent_intervals_merge() -> None:
    text = "\t\ttcp dport { 29500, 40000-40999 } ip saddr @s accept\n" \
           "\t\ttcp dport 41000-42000 ip saddr @s accept\n" \
           "\t\ttcp dport 43000 ip saddr @s drop\n"
    assert opened_ports(text) == [(29500, 29500), (40000, 42000)]
    assert merge([(5, 9), (1, 3), (4, 4), (20, 30), (25, 26)]) == [(1, 9), (20, 30)]
    assert closed_within([], 10, 20) == [(10, 20)]
    assert closed_within([(1, 5), (30, 40)], 10, 20) == [(10, 20)]
    assert describe([]) == "none"


def test_a_port_that_is_not_one_is_a_parse_error() -> None:
    with pytest.raises(ParseError, match="not a port or port range '70000'"):
        opened_ports("tcp dport 70000 ip saddr @s accept\n")
