"""Readers held to more real captures of their tools: the DCGM diagnostic's third document,
the sysfs, sysctl and /sys/class/net readers on a Debian 12 machine, published RDMA port
rates and sysfs listings, and ``mokutil --sb-state`` as published (sources, machines and
versions in tests/fixtures/published/README.md and tests/fixtures/nvidia/README.md)."""

from __future__ import annotations

import pytest

from gpufleet.errors import ParseError
from gpufleet.facts import script
from gpufleet.facts.parsers import dcgm, network, system
from tests.conftest import ROOT

FIXTURES = ROOT / "tests" / "fixtures"
PUBLISHED = FIXTURES / "published"


def published(name: str) -> str:
    return (PUBLISHED / name).read_text()


# --------------------------------------------------------------------------- dcgmi diag -j

def test_dcgm4_diag_of_a_gb10_spark() -> None:
    diag = dcgm.dcgm_diag((FIXTURES / "nvidia" / "dcgm4_diag_gb10_spark.txt").read_text())
    assert diag["version"] == "4.2.3"
    assert diag["error"] is None
    assert diag["tests"] == [{
        "name": "software", "category": "Deployment", "gpu": "0", "status": "FAIL",
        "info": "Persistence Mode: Persistence mode for GPU 0 is disabled. Enable persistence "
                "mode by running \"nvidia-smi -i <gpuId> -pm 1 \" as root."}]


# --------------------------------------------------------------------------- port range, sysctl

def test_port_range_read_from_proc_on_debian12() -> None:
    assert network.port_range(published("port-range-proc-debian12.txt")) == (32768, 60999)


def test_port_range_of_a_provisioned_lab_node() -> None:
    capture = (ROOT / "bench" / "captures" / "lab-node-facts.txt").read_text()
    sections = script.split(capture, "0123456789abcdef")
    fact, sysctl = sections["port_range"], sections["sysctl:net.ipv4.ip_local_port_range"]
    assert (fact.rc, fact.text) == (0, "49152\t65535\n")
    assert network.port_range(fact.text) == (49152, 65535)
    assert network.sysctl_value(sysctl.text) == "49152 65535"


@pytest.mark.parametrize(("name", "value"), [
    ("port-range-proc-debian12.txt", "32768 60999"),
    ("sysctl-tcp-rmem-debian12.txt", "4096 131072 33554432"),
    ("sysctl-rmem-max-debian12.txt", "4194304"),
])
def test_sysctl_values_read_from_proc_on_debian12(name: str, value: str) -> None:
    assert network.sysctl_value(published(name)) == value


def test_a_missing_sysctl_is_refused() -> None:
    with pytest.raises(ParseError, match="sysctl value: expected a value, got 'cat: /proc/sys"):
        network.sysctl_value(published("sysctl-missing-key-debian12.txt"))


# --------------------------------------------------------------------------- sysfs PCI GPUs

def test_sysfs_pci_listing_of_a_machine_without_nvidia_devices() -> None:
    assert published("pci-gpus-sysfs-no-nvidia-debian12.txt") == ""
    assert system.sys_pci_gpus(published("pci-gpus-sysfs-no-nvidia-debian12.txt")) == []


# --------------------------------------------------------------------------- /sys/class/net

def test_sys_class_net_fallback_on_debian12() -> None:
    interfaces = network.sys_class_net(published("sys-class-net-debian12.txt"))
    assert [(i["name"], i["mtu"], i["state"], i["mac"]) for i in interfaces] == [
        ("eth0", 1400, "UP", "02:fc:00:00:00:01"),
        ("gflab-br", 1500, "UP", "5a:04:3f:a9:0d:bd"),
        ("gflab-v1", 1500, "UP", "62:9d:60:fe:00:07"),
        ("gflab-v2", 1500, "UP", "d6:39:76:8e:da:31"),
        ("gflab-v3", 1500, "UP", "5a:04:3f:a9:0d:bd"),
        ("ifb0", 1500, "DOWN", "32:94:00:0d:21:63"),
        ("ifb1", 1500, "DOWN", "02:6d:34:52:80:f3"),
        ("lo", 65536, "UNKNOWN", "00:00:00:00:00:00"),
    ]
    assert all(i["addresses"] == [] for i in interfaces)


def test_sys_class_net_fallback_with_a_link_without_an_address() -> None:
    interfaces = network.sys_class_net(
        published("sys-class-net-netns-tun-veth-debian12.txt"))
    assert [(i["name"], i["mtu"], i["state"], i["mac"]) for i in interfaces] == [
        ("lo", 65536, "UNKNOWN", "00:00:00:00:00:00"),
        ("tun0", 1500, "DOWN", None),
        ("veth0", 9000, "LOWERLAYERDOWN", "ce:89:35:f0:ef:1a"),
        ("veth1", 1500, "DOWN", "22:24:b5:92:47:23"),
    ]


# --------------------------------------------------------------------------- sysfs listings

def test_sysfs_listing_of_the_counter_sample_on_debian12() -> None:
    values = network.sysfs_values(published("sysfs-net-grep-debian12.txt"))
    assert len(values) == 205
    assert values["eth0/speed"] == "-1"
    assert values["gflab-br/speed"] == "10000"
    assert values["lo/operstate"] == "unknown"
    assert values["ifb0/operstate"] == "down"
    assert values["eth0/statistics/rx_bytes"] == "490248811"
    assert values["eth0/statistics/tx_packets"] == "10612"
    assert values["eth0/statistics/rx_dropped"] == "0"


def test_sysfs_listing_of_a_namespace_with_tun_and_veth() -> None:
    values = network.sysfs_values(
        published("sysfs-net-grep-netns-tun-veth-debian12.txt"))
    assert len(values) == 101
    assert values["veth0/speed"] == "10000"
    assert "tun0/speed" not in values
    assert values["veth0/operstate"] == "lowerlayerdown"
    assert values["tun0/statistics/rx_packets"] == "0"
    assert {path.split("/")[0] for path in values} == {"lo", "tun0", "veth0", "veth1"}


def test_sysfs_listing_with_absolute_paths_as_published() -> None:
    values = network.sysfs_values(
        published("sysfs-net-statistics-grep-ubuntu-ethernetresearch.txt"))
    assert len(values) == 23
    assert values["/sys/class/net/eth0/statistics/rx_bytes"] == "9380575"
    assert values["/sys/class/net/eth0/statistics/rx_packets"] == "7954"
    assert values["/sys/class/net/eth0/statistics/tx_bytes"] == "278911"
    assert values["/sys/class/net/eth0/statistics/tx_packets"] == "3166"
    assert values["/sys/class/net/eth0/statistics/rx_dropped"] == "0"


# --------------------------------------------------------------------------- RDMA port rate

@pytest.mark.parametrize(("name", "gbps"), [
    ("rdma-rate-hfi1-omnipath-procfs.txt", 100.0),
    ("rdma-rate-mlx4-qdr-procfs.txt", 40.0),
    ("rdma-rate-mlx5-1x-edr-procfs.txt", 25.0),
    ("rdma-rate-mlx5-ndr-gpud-h100.txt", 400.0),
])
def test_rdma_port_rates_as_sysfs_holds_them(name: str, gbps: float) -> None:
    assert network.rdma_port_rate(published(name)) == gbps


# --------------------------------------------------------------------------- mokutil --sb-state

@pytest.mark.parametrize(("name", "enforced"), [
    ("mokutil-sb-state-enabled-sos-1574.txt", True),
    ("mokutil-sb-state-disabled-hwameistor.txt", False),
    ("mokutil-sb-state-shim-validation-disabled-holoscan.txt", False),
])
def test_secure_boot_as_mokutil_prints_it(name: str, enforced: bool) -> None:
    assert system.secure_boot(published(name)) is enforced
