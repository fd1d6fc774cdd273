"""Properties of every parser in gpufleet/facts/parsers/ and formats.py, checked on
generated text and on mutated real captures:

- any text gives a result or one ParseError, never an exception of another kind;
- a line the parser reads (taking it out changes the result) is never silently dropped
  once garbled: the parser reads the garbled line or raises ParseError, and its result is
  never the one it gives without that line.
"""

from __future__ import annotations

import base64
import importlib
import pkgutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufleet.errors import ParseError
from gpufleet.facts import formats, parsers
from gpufleet.facts.parsers import (
    cuda,
    dcgm,
    firmware,
    gpudirect,
    host,
    kernel,
    nccl_tests,
    network,
    nvidia_smi,
    packages,
    pcie,
    qos,
    system,
    timesync,
    watch,
    xid,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SAMPLES, H200, NVIDIA = FIXTURES / "samples", FIXTURES / "h200x2", FIXTURES / "nvidia"
PUBLISHED = FIXTURES / "published"
HOST = FIXTURES / "host"
# The roce_qos fact of a node with one ConnectX-7 port (its real mlnx_qos output) and its ECN.
ROCE_QOS_FACT = ("tool mlnx_qos\nport ens4np0 0 " + base64.b64encode(
    (PUBLISHED / "mlnx-qos-i-connectx7-mlnx-ofed-23.10-ets-strict-pfc5.txt").read_bytes())
    .decode() + "\necn ens4np0 roce_np 5 1\necn ens4np0 roce_rp 5 1\n")
EXAMPLES = settings(max_examples=40, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])


def _files(*paths: Path) -> list[str]:
    return [path.read_text() for path in paths]


FIRMWARE = FIXTURES / "firmware"
# The gpud tree's RDMA devices and the H100's information file as their facts print them.
HCA_LINES = "".join(f"/{path.relative_to(FIXTURES / 'watch' / 'gpud').as_posix()}:"
                    f"{path.read_text().strip()}\n"
                    for path in sorted((FIXTURES / "watch" / "gpud").glob(
                        "sys/class/infiniband/*/*"))
                    if path.name in firmware.HCA_FILES)
GPU_INFORMATION = "".join(f"/proc/driver/nvidia/gpus/0000:62:00.0/information:{line}\n"
                          for line in (FIRMWARE / "gpu-information-h100-535.txt")
                          .read_text().splitlines())


# Each parser with captures it reads (real ones where the repository has them).
PARSERS: dict[str, tuple[Callable[[str], Any], list[str]]] = {
    "apt_madison": (packages.apt_madison, _files(
        SAMPLES / "synthetic_apt_madison.txt",
        PUBLISHED / "apt-cache-madison-apt-2.6.1-debian12-three-suites.txt",
        PUBLISHED / "apt-cache-madison-apt-2.6.1-debian12-sources.txt")),
    "apt_showhold": (packages.apt_showhold, _files(SAMPLES / "synthetic_apt_showhold.txt")),
    "cuda_version_json": (cuda.cuda_version_json, _files(
        SAMPLES / "synthetic_cuda_version_json.txt",
        PUBLISHED / "cuda-version-json-13.3.1-b300-xe9780.txt")),
    "dcb_pfc": (qos.dcb_pfc, _files(SAMPLES / "dcb_pfc_show_manpage.txt",
                                        SAMPLES / "synthetic_dcb_pfc_show_stats.txt",
                                        PUBLISHED / "dcb-pfc-show-hns3-linux-8c1671e0d13d.txt")),
    "dcb_pfc_json": (qos.dcb_pfc_json, _files(SAMPLES / "synthetic_dcb_pfc_json.txt")),
    "hca_firmware": (firmware.hca_firmware, [HCA_LINES]),
    "dmi_bios": (firmware.dmi_bios, _files(FIRMWARE / "dmi-bugzilla-209011-asus-tp412ua.txt",
                                           FIRMWARE / "dmi-bugzilla-199715-hp-envy.txt")),
    "gsp_firmware": (firmware.gsp_firmware, [GPU_INFORMATION]),
    "grep_lines": (host.grep_lines, _files(HOST / "thp-grep-lkml-rientjes-2023.txt",
                                           HOST / "host-state-debian12.txt")),
    "host_state": (host.host_state, _files(HOST / "host-state-debian12.txt",
                                           HOST / "host-state-netns-debian12.txt")),
    "proc_swaps": (host.proc_swaps, _files(HOST / "proc-swaps-debian12.txt",
                                           HOST / "proc-swaps-swap-img-kubelet-4204d4.txt",
                                           HOST / "proc-swaps-ubuntu-forums-system-info.txt")),
    "roce_qos_fact": (qos.roce_qos_fact, [ROCE_QOS_FACT]),
    "pcie_state": (pcie.pcie_state, _files(FIXTURES / "pcie" / "pcie-fact-h100-vm.txt",
                                           FIXTURES / "pcie" / "pcie-fact-lab-standin-acs-on.txt")),
    "link_speed": (pcie.link_speed, ["32.0 GT/s PCIe\n", "16.0 GT/s PCIe\n", "Unknown\n"]),
    "selected": (lambda text: host.selected(text, "enabled"), ["always [madvise] never\n"]),
    "dcgm_diag": (dcgm.dcgm_diag, _files(NVIDIA / "dcgm3_diag_8gpu_dcgm_jsonresulttests.txt",
                                            NVIDIA / "dcgm4_diag_8gpu_dcgm215.txt")),
    "dpkg_query": (packages.dpkg_query, _files(SAMPLES / "synthetic_dpkg_query_states.txt")),
    "ethtool_stats": (network.ethtool_stats, _files(FIXTURES / "nic" / "mlx5-ethtool-S.txt")),
    "gpu_operator": (system.gpu_operator, ["operator\n", "none\n"]),
    "ip_addr_json": (network.ip_addr_json, _files(
        SAMPLES / "synthetic_ip_j_addr.txt",
        PUBLISHED / "ip-j-addr-veth-bridge-macvlan-vxlan-iproute2-6.1.txt",
        PUBLISHED / "ip-j-d-p-addr-veth-bridge-macvlan-vxlan-iproute2-6.1.txt")),
    "meminfo": (system.meminfo, _files(H200 / "meminfo.txt")),
    "mlnx_qos": (qos.mlnx_qos, _files(SAMPLES / "mlnx_qos_dscp_trust_prio3.txt",
                                          SAMPLES / "mlnx_qos_blank_lines.txt")),
    "nccl_tests": (nccl_tests.nccl_tests,
                   _files(SAMPLES / "nccl_tests_all_reduce_current_format.txt")),
    "nccl_tests_avg_busbw": (nccl_tests.nccl_tests_avg_busbw,
                             _files(SAMPLES / "nccl_tests_all_reduce_current_format.txt")),
    "nvcc_version": (cuda.nvcc_version, _files(H200 / "nvcc_version.txt")),
    "nvidia_smi_list": (nvidia_smi.nvidia_smi_list, _files(NVIDIA / "a100_L_mig_telegraf5812.txt",
                                                        NVIDIA / "h200x1_L.txt")),
    "nvidia_smi_q": (nvidia_smi.nvidia_smi_q, _files(H200 / "nvidia_smi_q.txt",
                                                  NVIDIA / "a10_q_gpud.txt")),
    "nvidia_smi_query": (nvidia_smi.nvidia_smi_query, _files(
        H200 / "query_gpu_csv.txt", NVIDIA / "h200x1_query_gpu_csv_units.txt")),
    "nvidia_topo": (nvidia_smi.nvidia_topo, _files(
        H200 / "topo_m.txt", NVIDIA / "h100x4_topo_m_spaces_nccl1617.txt",
        NVIDIA / "rtx4090x8_topo_m_tabs_gpuallocator17.txt")),
    "nvidia_version_from_package": (packages.nvidia_version_from_package,
                                    ["1:550.54.15-1\n", "580.159.04-0ubuntu1\n"]),
    "nvlink_status": (nvidia_smi.nvlink_status, _files(
        H200 / "nvlink_status.txt", SAMPLES / "synthetic_nvlink_status_inactive.txt")),
    "ofed_version": (packages.ofed_version, ["MLNX_OFED_LINUX-24.10-1.1.4.0:\n"]),
    "os_release": (system.os_release, _files(H200 / "os_release.txt")),
    "port_range": (network.port_range, _files(H200 / "port_range.txt")),
    "proc_driver_flavor": (system.proc_driver_flavor, _files(
        NVIDIA / "proc_version_384_neofetch876.txt", NVIDIA / "h200x1_proc_version.txt")),
    "proc_driver_version": (system.proc_driver_version, _files(
        NVIDIA / "proc_version_565_open_nixgl186.txt", H200 / "proc_nvidia_version.txt")),
    "proc_net_snmp": (network.proc_net_snmp, [
        "Tcp: RtoAlgorithm RtoMin RtoMax MaxConn ActiveOpens\nTcp: 1 200 120000 -1 5\n"]),
    "rdma_port_rate": (network.rdma_port_rate, ["400 Gb/sec (4X NDR)\n"]),
    "secure_boot": (system.secure_boot, ["SecureBoot enabled\n"]),
    "sys_class_net": (network.sys_class_net, _files(SAMPLES / "synthetic_sys_class_net.txt")),
    "sys_pci_gpus": (system.sys_pci_gpus, _files(H200 / "sys_pci_nvidia.txt")),
    "sysctl_value": (network.sysctl_value, ["4096\t87380\t6291456\n"]),
    "sysfs_values": (network.sysfs_values, ["eth0/statistics/rx_dropped:0\n"
                                            "eth0/statistics/tx_dropped:3\n"]),
    "torch_info": (cuda.torch_info, _files(H200 / "torch_versions.txt",
                                              FIXTURES / "h200x1" / "torch_probe.json")),
    "watch_report": (watch.watch_report, _files(
        FIXTURES / "watch" / "report_open_pending_silenced.json",
        FIXTURES / "watch" / "report_compact_two_open.json",
        FIXTURES / "watch" / "report_program_rising.json")),
    "xid_events": (xid.xid_events, _files(NVIDIA / "a800_dmesg_xid13_vllm5901.txt",
                                              NVIDIA / "dmesg_T_xid_akash244.txt")),
    "disk_free": (formats.disk_free, _files(H200 / "df.txt",
                                            PUBLISHED / "df-Pk-coreutils-9.1-debian12.txt")),
    "file_digest": (lambda text: formats.file_digest("/etc/x", text),
                    ["present 0644 root:root 12 " + "ab" * 32 + "\n", "missing\n"]),
    "file_state": (lambda text: formats.file_state("/etc/x", text),
                   ["present 0644 root:root\naGVsbG8K\n", "missing\n"]),
    "firewall": (formats.firewall, ["nft inet:gpufleet\nnft_gpufleet " + "0" * 64
                                    + "\niptables absent\n"]),
    "link_target": (formats.link_target, ["-> /usr/lib/x\n", "missing\n", "notlink\n"]),
    "rdma_devices": (formats.rdma_devices, [
        "mlx5_0\t1\tInfiniBand\t4: ACTIVE\t5: LinkUp\t400 Gb/sec (4X NDR)\t0x800b,0x7fff\t"
        "ibp1s0\n",
        "mlx5_1\t1\tEthernet\t1: DOWN\t3: Disabled\t-\t-\t-\n"]),
    "rdma_rate": (formats.rdma_rate, ["400 Gb/sec (4X NDR)\n", "10 Gb/sec (4X)\n",
                                      "2.5 Gb/sec (1X)\n"]),
    "time_sync": (formats.time_sync, [
        "@chronyc\n" + (PUBLISHED / "chronyc-n-tracking-4.3-debian12-unsynchronised.txt")
        .read_text(),
        "@timedatectl\nNTPSynchronized=yes\nNTP=yes\n",
        "@timedatectl\nNTPSynchronized=no\nNTP=no\n"]),
    "chronyc_tracking": (timesync.chronyc_tracking, _files(
        PUBLISHED / "chronyc-n-tracking-4.3-debian12-loopback-server.txt",
        PUBLISHED / "chronyc-n-tracking-4.3-debian12-unsynchronised.txt")),
    "timedatectl_show": (timesync.timedatectl_show, [
        "NTPSynchronized=yes\nNTP=yes\nTimeUSec=Mon 2026-12-07 05:16:13 UTC\n"]),
    "timesync_status": (timesync.timesync_status, _files(
        PUBLISHED / "timedatectl-timesync-status-245.6-debian-systemd-16492.txt")),
    "timespan_s": (timesync.timespan_s, ["+1.024ms\n", "-1min 3.5s\n"]),
    "modinfo": (kernel.modinfo, _files(
        PUBLISHED / "modinfo-nvidia-590.44.01-dkms-ubuntu-aikitoria-15.txt",
        PUBLISHED / "modinfo-gdrdrv-dkms-ubuntu-gdrcopy-82.txt")),
    "vermagic_release": (kernel.vermagic_release, ["6.8.0-90-generic SMP preempt mod_unload\n"]),
    "dkms_status": (kernel.dkms_status, _files(
        PUBLISHED / "dkms-status-2.x-nvidia-fedora-negativo17-56.txt",
        PUBLISHED / "dkms-status-3.0.10-nvidia-535-rtl8852bu-7.txt",
        PUBLISHED / "dkms-status-2.x-error-and-original-module-negativo17-56.txt")),
    "kernel_state": (formats.kernel_state, [
        "@running 6.8.0-90-generic\n@boot 6.8.0-90-generic\n@boot 6.8.0-94-generic\n"
        "@headers 6.8.0-90-generic\n@module 6.8.0-90-generic nvidia\n"
        + "".join(line + "\n" for line in (
            PUBLISHED / "modinfo-nvidia-590.44.01-dkms-ubuntu-aikitoria-15.txt")
            .read_text().splitlines() if line.split(":")[0] in
            ("filename", "version", "vermagic", "name"))
        + "@module 6.8.0-94-generic nvidia\nmodinfo: ERROR: Module nvidia not found.\n"
        "@dkms\n" + (PUBLISHED / "dkms-status-3.0.10-nvidia-535-rtl8852bu-7.txt").read_text()]),
    # The gpudirect snippet's output: on the development controller (no GPU, no RDMA), and
    # on an open-module node as the real H200 reports its module (real-node/).
    "gpudirect_state": (gpudirect.gpudirect_state, [
        "kernel 6.18.44-fc-v1272\npeermem_loaded no\nnvidia_loaded no\npeermem_file \n"
        "module \ntaint \nrdma \ndma_buf \n",
        "kernel 6.8.0-90-generic\npeermem_loaded no\nnvidia_loaded yes\npeermem_file "
        "updates/dkms/nvidia-peermem.ko.zst\nmodule " + next(
            line for line in (FIXTURES / "real-node" / "real-driver-h200x2.txt").read_text()
            .splitlines() if line.startswith("NVRM")) + "\ntaint OE\nrdma mlx5_0,mlx5_1\n"
        "dma_buf CONFIG_DMA_SHARED_BUFFER=y\nnccl_conf NCCL_NET_GDR_LEVEL=PHB\n"]),
    "log_lines": (gpudirect.log_lines, _files(*sorted((FIXTURES / "nccl-gdr").glob("*.txt")))),
    "torch_files": (formats.torch_files, [
        "@venv /opt/torch/.venv\n/opt/torch/.venv/lib/python3.12/site-packages/"
        "nvidia_nccl_cu13-2.28.9.dist-info\n__version__ = '2.11.0+cu130'\ncuda = '13.0'\n"]),
}


def _outcome(parse: Callable[[str], Any], text: str) -> Any:
    """The parser's result, or the ParseError class: any other exception propagates."""
    try:
        return parse(text)
    except ParseError:
        return ParseError


@st.composite
def _mutated(draw: st.DrawFn, captures: list[str]) -> str:
    """A capture with a few lines deleted, repeated, cut or replaced by generated text."""
    lines = draw(st.sampled_from(captures)).splitlines(keepends=True) or [""]
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(lines) - 1))
        action = draw(st.sampled_from(["delete", "repeat", "cut", "replace", "insert"]))
        if action == "delete" and len(lines) > 1:
            del lines[at]
        elif action == "repeat":
            lines.insert(at, lines[at])
        elif action == "cut":
            lines[at] = lines[at][: draw(st.integers(0, len(lines[at])))]
        else:
            line = draw(st.text(max_size=40)) + "\n"
            lines[at : at + (action == "replace")] = [line]
    return "".join(lines)


@pytest.mark.parametrize("name", PARSERS)
@EXAMPLES
@given(data=st.data())
def test_any_text_gives_a_result_or_a_parse_error(name: str, data: st.DataObject) -> None:
    parse, captures = PARSERS[name]
    text = data.draw(st.one_of(st.text(), _mutated(captures)), label="text")
    _outcome(parse, text)


def _read_lines(parse: Callable[[str], Any], text: str) -> list[int]:
    """Indexes of the lines the parser reads: without one of them, its outcome changes."""
    lines = text.splitlines(keepends=True)
    whole = _outcome(parse, text)
    return [i for i, line in enumerate(lines) if line.strip()
            and _outcome(parse, "".join(lines[:i] + lines[i + 1 :])) != whole]


def _values(words: list[str]) -> list[int]:
    """The words of a line that hold its data: those with a digit, else the last one after a
    label. A lone word without a digit (a section header, ``none``) is not garbled, so the
    line keeps the look of data."""
    digits = [i for i, word in enumerate(words) if any(c.isdigit() for c in word)]
    return digits or ([len(words) - 1] if len(words) > 1 else [])


READ_LINES = {name: [(capture, [i for i in _read_lines(parse, capture)
                                 if _values(capture.splitlines()[i].split())])
                      for capture in captures]
              for name, (parse, captures) in PARSERS.items()}


@st.composite
def _garbled(draw: st.DrawFn, name: str) -> tuple[str, str]:
    """(the capture with one line it reads garbled, the capture without that line)."""
    capture, read = draw(st.sampled_from([(c, r) for c, r in READ_LINES[name] if r]))
    lines = capture.splitlines(keepends=True)
    at = draw(st.sampled_from(read))
    words = lines[at].split()
    word = draw(st.sampled_from(_values(words)))
    junk = draw(st.text(st.characters(codec="ascii", exclude_categories=["Cc", "Zs"],
                                      exclude_characters="#$"),
                        min_size=1, max_size=6).filter(lambda w: w != words[word]))
    indent = lines[at][: len(lines[at]) - len(lines[at].lstrip())]
    garbled = indent + " ".join([*words[:word], junk, *words[word + 1 :]]) + "\n"
    return ("".join([*lines[:at], garbled, *lines[at + 1 :]]),
            "".join(lines[:at] + lines[at + 1 :]))


GARBLE = [name for name, found in READ_LINES.items() if any(read for _, read in found)]


@pytest.mark.parametrize("name", GARBLE)
@EXAMPLES
@given(data=st.data())
def test_a_garbled_line_is_read_or_refused_never_dropped(name: str,
                                                         data: st.DataObject) -> None:
    parse = PARSERS[name][0]
    text, without = data.draw(_garbled(name), label="garbled")
    outcome = _outcome(parse, text)
    assert outcome is ParseError or outcome != _outcome(parse, without)


def test_the_properties_cover_every_parser() -> None:
    tools = [importlib.import_module(f"{parsers.__name__}.{found.name}")
             for found in pkgutil.iter_modules(parsers.__path__) if not found.name.startswith("_")]
    public = {name for module in (*tools, formats) for name in dir(module)
              if callable(getattr(module, name)) and not name.startswith("_")
              and getattr(getattr(module, name), "__module__", "") == module.__name__}
    not_text = {"pause_and_discard_counters", "FileState", "FileDigest", "ParseError",
                "fstab_swaps"}
    assert public - not_text == set(PARSERS)
    assert set(GARBLE) >= {"nvidia_smi_query", "nvidia_topo", "nvlink_status", "nvidia_smi_q",
                           "nvidia_smi_list", "dcgm_diag", "xid_events", "proc_driver_version"}


@EXAMPLES
@given(stats=st.dictionaries(st.text(max_size=30), st.integers()))
def test_pause_and_discard_counters_keeps_only_those_names(stats: dict[str, int]) -> None:
    picked = network.pause_and_discard_counters(stats)
    assert picked == {k: v for k, v in stats.items()
                      if "pause" in k.lower() or "discard" in k.lower()}


def test_file_state_with_characters_outside_base64_is_a_parse_error() -> None:
    with pytest.raises(ParseError, match="bad base64 content for /etc/x"):
        formats.file_state("/etc/x", "present 0644 root:root\n\x80\n")


def test_rdma_port_that_is_not_a_number_is_a_parse_error() -> None:
    with pytest.raises(ParseError, match="the port a number"):
        formats.rdma_devices("mlx5_0 : InfiniBand ACTIVE ibp1s0\n")
