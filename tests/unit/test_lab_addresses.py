"""Lab addresses: node01-node239 keep their place in the lab's first /24, further nodes fill
the next /24s of the lab's /16."""

from __future__ import annotations

import ipaddress

import pytest

from gpufleet.errors import LabError
from gpufleet.lab.cluster import MAX_NODES
from gpufleet.lab.model import LabConfig


def test_the_first_239_nodes_keep_their_addresses() -> None:
    lab = LabConfig(subnet="10.77.0")
    assert [lab.address(i) for i in (1, 2, 200, 239)] == [
        "10.77.0.11", "10.77.0.12", "10.77.0.210", "10.77.0.249"]
    assert lab.outsider_address == "10.77.0.250"
    assert lab.second_controller_address == "10.77.0.251"


def test_further_nodes_fill_the_next_24s_of_the_16() -> None:
    lab = LabConfig(subnet="10.77.0")
    assert [lab.address(i) for i in (240, 241, 479, 480, 1000)] == [
        "10.77.1.10", "10.77.1.11", "10.77.1.249", "10.77.2.10", "10.77.4.50"]
    addresses = [lab.address(i) for i in range(1, MAX_NODES + 1)]
    assert len(set(addresses)) == MAX_NODES
    reserved = {lab.controller_address, lab.outsider_address, lab.second_controller_address}
    assert not reserved & set(addresses)
    assert all(ipaddress.ip_address(a) in lab.network for a in addresses)
    assert str(lab.network) == "10.77.0.0/16"


def test_a_node_beyond_the_16_is_refused() -> None:
    lab = LabConfig(subnet="10.77.254")
    assert lab.address(479) == "10.77.255.249"
    with pytest.raises(LabError, match=r"node480 does not fit in 10\.77\.0\.0/16"):
        lab.address(480)
