"""The measurement and launch code reads the suites' variables typed, through the settings
that declare them: the declared defaults apply, a value the inventory quotes is read as its
kind, and the probes' arguments keep the inventory's text (``1``, not ``1.0``)."""

from __future__ import annotations

from typing import Any

from gpufleet.conformance.launch import processes_per_node, rendezvous_port
from gpufleet.conformance.measure import allreduce, ddp, storage
from gpufleet.conformance.nic_counters import Bounds
from gpufleet.conformance.session import Node
from gpufleet.conformance.suites.host_sizing import HostSizingSettings
from gpufleet.connect.connection import ConnectOptions
from gpufleet.facts.gather import Facts
from gpufleet.inventory.model import Host


def node(groups: frozenset[str] = frozenset({"all"}), **variables: Any) -> Node:
    return Node(Host("gpu01", {"ansible_host": "10.0.0.11", **variables}, groups),
                ConnectOptions(), Facts("gpu01", {}))


def test_the_storage_probe_gets_the_inventorys_numbers_as_it_writes_them() -> None:
    assert storage.probe_args(node()) == ["--path", "None", "--file-gb", "1", "--readers", "4",
                                          "--small-files", "2000", "--trials", "1"]
    args = storage.probe_args(node(storage_dataset_path="/data", storage_file_gb=0.03,
                                   storage_readers="2"), trials=3)
    assert args == ["--path", "/data", "--file-gb", "0.03", "--readers", "2",
                    "--small-files", "2000", "--trials", "3"]


def test_the_ddp_probe_gets_width_and_depth_only_where_the_inventory_sets_them() -> None:
    assert ddp.probe_args(node()) == ["--steps", "30", "--batch-size", "64"]
    assert ddp.probe_args(node(ddp_width="512", ddp_steps=5)) == [
        "--steps", "5", "--batch-size", "64", "--width", "512"]


def test_the_rendezvous_port_and_the_cpu_processes_come_from_the_probe_settings() -> None:
    assert rendezvous_port(node()) == 29500
    assert rendezvous_port(node(firewall_rendezvous_port="29600")) == 29600
    assert rendezvous_port(node(firewall_rendezvous_port=29600, allreduce_port=29501)) == 29501
    assert processes_per_node(node()) == 1
    assert processes_per_node(node(allreduce_cpu_procs="3")) == 3


def test_the_allreduce_settings_and_the_counters_bounds_are_read_typed() -> None:
    assert allreduce.timeout_of(node()) == 600.0
    assert allreduce.probe_args(node(allreduce_sizes=["8", "1M"], allreduce_iters=20))[:4] == [
        "--sizes", "8,1M", "--iters", "20"]
    assert allreduce.domain(node(frozenset({"all", "rack3"}))) == "rack3"
    assert allreduce.domain(node(frozenset({"all", "row2"}), topology_group_prefixes=["row"])) \
        == "row2"
    assert allreduce.domain(node(topology_domain="leaf7")) == "leaf7"
    assert Bounds.of(node()) == Bounds(100, 0, 0.01)
    assert Bounds.of(node(nic_max_drops="5")).max_drops == 5


def test_a_number_the_inventory_writes_as_an_integer_reads_as_one() -> None:
    """Messages show a setting as written: ``host_min_memory_gb 1000000``, not ``1e+06``."""
    big = node(host_min_memory_gb=10**6, host_memory_multiple=2).typed(HostSizingSettings)
    assert (str(big.host_min_memory_gb), str(big.host_memory_multiple)) == ("1000000", "2")
    assert str(node(host_min_memory_gb=0.5).typed(HostSizingSettings).host_min_memory_gb) \
        == "0.5"
    assert node(host_min_memory_gb="12").typed(HostSizingSettings).host_min_memory_gb == 12.0
