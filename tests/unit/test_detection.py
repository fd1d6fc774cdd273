"""Detection power, on real captures: the NCCL environment linted against the node, GPU
counts from every source, and the live ruleset read from a node (NCCL's transports:
tests/unit/test_nccl_transport.py)."""

from __future__ import annotations

from pathlib import Path

from gpufleet.conformance.checks import gpu
from gpufleet.conformance.checks import stack as stack_checks
from gpufleet.firewall_analysis.live import analyse_live, parse_live
from tests.conftest import ROOT

REAL = ROOT / "tests" / "fixtures" / "real-node"
LIVE = ROOT / "tests" / "fixtures" / "firewall" / "live"


INTERFACES = [{"name": "lo", "state": "UNKNOWN"}, {"name": "eth0", "state": "UP"},
              {"name": "ib0", "state": "DOWN"}]
RDMA = [{"device": "mlx5_0", "port": 1, "link_layer": "Ethernet", "state": "ACTIVE",
         "netdevs": ["eth0"]},
        {"device": "mlx5_1", "port": 1, "link_layer": "Ethernet", "state": "DOWN",
         "netdevs": []}]


def test_the_nccl_environment_is_linted_against_the_node() -> None:
    found = stack_checks.settings(
        "# Managed by gpufleet\nNCCL_SOCKET_IFNAME=eth\nNCCL_IB_HCA=mlx5\n",
        "NCCL_SOCKET_IFNAME='bond0'\nGLOO_SOCKET_IFNAME=ib0\nexport NCCL_IB_GID_INDEX=3\n")
    assert found == {"NCCL_SOCKET_IFNAME": "bond0", "NCCL_IB_HCA": "mlx5",
                     "GLOO_SOCKET_IFNAME": "ib0", "NCCL_IB_GID_INDEX": "3"}
    assert stack_checks.lint(found, INTERFACES, RDMA) == [
        "NCCL_SOCKET_IFNAME=bond0: no interface 'bond0' on this node (it has eth0, ib0, lo)",
        "GLOO_SOCKET_IFNAME=ib0: interface ib0 is DOWN"]
    assert stack_checks.lint({"NCCL_SOCKET_IFNAME": "^docker,lo", "NCCL_IB_HCA": "=mlx5_1:1"},
                         INTERFACES, RDMA) == ["NCCL_IB_HCA==mlx5_1:1: mlx5_1:1 is DOWN"]
    assert stack_checks.lint({"NCCL_SOCKET_IFNAME": "=eth", "NCCL_IB_HCA": "mlx5_9"},
                         INTERFACES, RDMA) == [
        "NCCL_SOCKET_IFNAME==eth: no interface 'eth' on this node (it has eth0, ib0, lo)",
        "NCCL_IB_HCA=mlx5_9: no RDMA device 'mlx5_9' on this node (it has mlx5_0, mlx5_1)"]
    assert stack_checks.gid_paths(found, RDMA) == [
        "/sys/class/infiniband/mlx5_0/ports/1/gids/3",
        "/sys/class/infiniband/mlx5_1/ports/1/gids/3"]


def test_gpu_counts_must_agree_across_every_source() -> None:
    counts = {gpu.PCI_BUS: 2, "nvidia-smi -L": 2, "the nvidia-smi query": 1,
              "the topology": 2}
    assert gpu.inventory_problems(counts, None) == [
        "GPU counts disagree: 2 on the PCI bus, 2 on nvidia-smi -L, 1 on the nvidia-smi "
        "query, 2 on the topology"]
    assert gpu.inventory_problems(dict(counts, **{"the nvidia-smi query": 2}), None) == []
    assert gpu.inventory_problems(dict(counts, **{"the nvidia-smi query": 2}), 8) == [
        "GPU counts disagree: 2 on the PCI bus, 2 on nvidia-smi -L, 2 on the nvidia-smi "
        "query, 2 on the topology, 8 on gpu_count"]
    # a VM or container without the PCI tree: the bus is left out, nothing else
    assert gpu.inventory_problems({gpu.PCI_BUS: 0, "nvidia-smi -L": 1}, None) == []


def test_the_live_ruleset_of_a_real_node(tmp_path: Path) -> None:
    live = parse_live((LIVE / "foreign-and-iptables-nft.txt").read_text())
    assert live["nft"] is not None and live["iptables"] is not None
    analysis = analyse_live(live, ["10.1.0.11", "10.1.0.12", "fd00::13"],
                            [(29500, 29500), (49152, 65535)])
    assert [f.ports for f in analysis.blocked] == [(29500, 29500), (52000, 52099)]
    assert analyse_live(parse_live((LIVE / "empty.txt").read_text()), ["10.1.0.11"],
                        [(29500, 29500)]).clean
