"""Readers held to real output of their tools beyond the layouts test_parsers.py reads: made
on a Debian 12 machine and a 1x H200 machine for these tests, or published (sources, tool
versions and machines in tests/fixtures/published/README.md)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from gpufleet.errors import ParseError
from gpufleet.facts import containers, formats
from gpufleet.facts.parsers import cuda, network, packages, qos
from tests.conftest import ROOT

FIXTURES = ROOT / "tests" / "fixtures"
PUBLISHED = FIXTURES / "published"


def published(name: str) -> str:
    return (PUBLISHED / name).read_text()


# --------------------------------------------------------------------------- ip -j addr

NETNS = [
    ("lo", 65536, "UNKNOWN", None, ["127.0.0.1/8", "::1/128"]),
    ("veth1", 1500, "UP", "66:ec:4a:be:11:38", ["fe80::64ec:4aff:febe:1138/64"]),
    ("veth0", 1500, "UP", "c6:f2:9c:38:79:21",
     ["10.99.1.1/30", "fd99:1::1/64", "fe80::c4f2:9cff:fe38:7921/64"]),
    ("br0", 1500, "UP", "66:ec:4a:be:11:38", ["172.30.0.1/16", "fe80::64ec:4aff:febe:1138/64"]),
    ("mv0", 1500, "UP", None,
     ["192.168.77.5/24", "192.168.77.6/24", "fe80::4ef:d4ff:fe68:6039/64"]),
    ("vxlan42", 1450, "UNKNOWN", None, ["10.42.0.1/24", "fe80::983c:a7ff:fe17:d411/64"]),
    ("ifb0", 1500, "DOWN", None, []),
]


@pytest.mark.parametrize("name", [
    "ip-j-addr-veth-bridge-macvlan-vxlan-iproute2-6.1.txt",
    "ip-j-d-p-addr-veth-bridge-macvlan-vxlan-iproute2-6.1.txt",
])
def test_ip_j_addr_of_a_namespace_compact_and_pretty_with_details(name: str) -> None:
    """iproute2 6.1 on one namespace, once as one line and once ``-d -p`` (indented, with
    each link's ``linkinfo``): the same links, states and addresses in printed order, a
    bridge port's link-local address, two addresses on the macvlan, a link without any."""
    links = network.ip_addr_json(published(name))
    assert [(link["name"], link["mtu"], link["state"], link["addresses"]) for link in links] == [
        (name, mtu, state, addresses) for name, mtu, state, _, addresses in NETNS]
    macs = {link["name"]: link["mac"] for link in links}
    assert all(macs[name] == mac for name, _, _, mac, _ in NETNS if mac)


# --------------------------------------------------------------------------- df -Pk


def test_df_of_the_fact_command_on_one_filesystem() -> None:
    """``df -Pk / /var /opt /tmp`` (GNU coreutils 9.1) where the four are one filesystem:
    four identical rows, one mount point."""
    assert formats.disk_free(published("df-Pk-coreutils-9.1-debian12.txt")) == {
        "/": 80222784 * 1024}


# --------------------------------------------------------------------------- apt-cache madison


def test_apt_madison_of_debian_12_with_three_suites() -> None:
    """apt 2.6.1: the security, main and updates suites each list their own version, in
    printed order; a name wider than madison's column pushes its bars right."""
    text = published("apt-cache-madison-apt-2.6.1-debian12-three-suites.txt")
    assert packages.apt_madison(text) == {
        "openssl": ["3.0.22-1~deb12u2", "3.0.20-1~deb12u2", "3.0.17-1~deb12u2"],
        "chrony": ["4.3-2+deb12u3"],
        "linux-image-amd64": ["6.1.192-3", "6.1.176-1"],
    }


def test_apt_madison_leaves_out_source_packages() -> None:
    """With deb-src lines madison also prints the source package (``openssh`` for
    ``openssh-server``): no version of it can be installed, so it is not available."""
    assert packages.apt_madison(published("apt-cache-madison-apt-2.6.1-debian12-sources.txt")) == {
        "openssh-server": ["1:9.2p1-2+deb12u10", "1:9.2p1-2+deb12u9"],
        "rdma-core": ["44.0-2"],
    }


# --------------------------------------------------------------------------- dcb pfc


def test_dcb_pfc_of_a_hns3_port_before_and_after_a_set() -> None:
    """A HiSilicon hns3 port (4 PFC-capable traffic classes) shown, set, shown again: the
    second report is the one read."""
    text = published("dcb-pfc-show-hns3-linux-8c1671e0d13d.txt")
    before, _ = text.split("$ dcb pfc set")
    assert qos.dcb_pfc(before) == {
        "pfc_cap": 4, "macsec_bypass": False, "delay": 0, "prio_pfc": []}
    assert qos.dcb_pfc(text)["prio_pfc"] == list(range(8))


@pytest.mark.parametrize(("name", "parse"), [
    ("dcb-pfc-show-veth-iproute2-6.1.txt", qos.dcb_pfc),
    ("dcb-j-pfc-show-veth-iproute2-6.1.txt", qos.dcb_pfc_json),
])
def test_dcb_pfc_of_a_netdev_without_dcb_is_a_parse_error(
        name: str, parse: Callable[[str], object]) -> None:
    """What dcb prints for a netdev whose driver has no DCB: unknown, never "no PFC"."""
    with pytest.raises(ParseError, match="'Attribute read: Operation not supported'"):
        parse(published(name))


# --------------------------------------------------------------------------- CUDA, torch


def test_cuda_version_json_of_cuda_13_3() -> None:
    """The whole file as ``cat`` printed it behind its prompt, 35 components (B300 host)."""
    text = published("cuda-version-json-13.3.1-b300-xe9780.txt")
    assert cuda.cuda_version_json(text) == "13.3.1"


@pytest.mark.parametrize(("name", "version"), [
    ("cuda-version-json-12.8.2-windows-streamco.txt", "12.8.2"),
    ("cuda-version-json-12.9.0-windows-katago-build.txt", "12.9.0"),
])
def test_cuda_version_json_of_windows_toolkits(name: str, version: str) -> None:
    """The file as the Windows installer leaves it (``NVIDIA Windows Driver``, Nsight VSE;
    12.9.0 with CRLF line ends): the SDK's version, not a component's (cuBLAS 12.9.0.13)."""
    assert cuda.cuda_version_json(published(name)) == version


# --------------------------------------------------------------------------- apt-mark, ofed_info


def test_apt_showhold_of_apt_2_6_on_debian_12() -> None:
    """apt 2.6.1 lists its holds sorted, names with ``+`` and ``.`` among them."""
    assert packages.apt_showhold(published("apt-mark-showhold-apt-2.6.1-debian12.txt")) == {
        "libssl3", "libstdc++6", "openssl", "python3.11"}


def test_ofed_version_of_a_host_without_mlnx_ofed_is_a_parse_error() -> None:
    """A host on the distribution's rdma-core has no ofed_info: the shell's complaint is
    no version, and not "no OFED" either."""
    with pytest.raises(ParseError, match="ofed_info -s: expected 'MLNX_OFED_LINUX"):
        packages.ofed_version(published("ofed-info-s-not-installed-ompi-9957.txt"))


# --------------------------------------------------------------------------- containerd


def test_containerd_runtime_of_containerd_1_6_default_config() -> None:
    """``containerd config default`` of Debian's containerd 1.6.20 (version 2, runc the only
    runtime and the default): no NVIDIA runtime, and not the default."""
    text = (FIXTURES / "containers" / "containerd-config-default-1.6.20-debian12.toml").read_text()
    assert containers.containerd_runtime(text) == containers.EngineRuntime(False, None, False)


def test_torch_info_of_the_current_probe_and_a_python_without_torch() -> None:
    """The probe's JSON with the arch list and backends (torch 2.11, H200), and what the
    same probe prints under a python that has no torch: the traceback's last line."""
    info = cuda.torch_info((FIXTURES / "h200x1" / "torch_probe.json").read_text())
    assert (info["torch"], info["cuda"], info["nccl"], info["device_count"]) == (
        "2.11.0+cu130", "13.0", "2.28.9", 1)
    assert info["arch_list"][-1] == "sm_120" and info["nccl_available"] is True
    with pytest.raises(ParseError, match="No module named 'torch'"):
        cuda.torch_info(published("torch-probe-without-torch-h200-vm.txt"))
