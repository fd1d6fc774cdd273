"""Parsers on output as people paste it: every line indented (spaces or tabs), and lines a
newer tool version adds. The parse must not change."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpufleet.facts.parsers import cuda, nccl_tests, network, nvidia_smi, packages, qos, system, xid

FIXTURES = Path(__file__).parent.parent / "fixtures"
SAMPLES, H200 = FIXTURES / "samples", FIXTURES / "h200x2"
CASES = [
    (qos.mlnx_qos, SAMPLES / "mlnx_qos_dscp_trust_prio3.txt"),
    (qos.mlnx_qos, SAMPLES / "synthetic_mlnx_qos_buffers_ets.txt"),
    (qos.mlnx_qos, SAMPLES / "synthetic_mlnx_qos_pcp_trust.txt"),
    (qos.dcb_pfc, SAMPLES / "dcb_pfc_show_manpage.txt"),
    (qos.dcb_pfc, SAMPLES / "synthetic_dcb_pfc_show_stats.txt"),
    (qos.dcb_pfc_json, SAMPLES / "synthetic_dcb_pfc_json.txt"),
    (nccl_tests.nccl_tests, SAMPLES / "nccl_tests_all_reduce_current_format.txt"),
    (nvidia_smi.nvidia_smi_query, H200 / "query_gpu_csv.txt"),
    (nvidia_smi.nvidia_topo, H200 / "topo_m.txt"),
    (nvidia_smi.nvidia_topo, SAMPLES / "synthetic_topo_m_8gpu_nics.txt"),
    (nvidia_smi.nvlink_status, H200 / "nvlink_status.txt"),
    (nvidia_smi.nvlink_status, SAMPLES / "synthetic_nvlink_status_inactive.txt"),
    (system.proc_driver_version, H200 / "proc_nvidia_version.txt"),
    (cuda.cuda_version_json, SAMPLES / "synthetic_cuda_version_json.txt"),
    (cuda.nvcc_version, H200 / "nvcc_version.txt"),
    (cuda.torch_info, H200 / "torch_versions.txt"),
    (system.os_release, H200 / "os_release.txt"),
    (system.meminfo, H200 / "meminfo.txt"),
    (network.ip_addr_json, SAMPLES / "synthetic_ip_j_addr.txt"),
    (network.sys_class_net, SAMPLES / "synthetic_sys_class_net.txt"),
    (network.port_range, H200 / "port_range.txt"),
    (packages.dpkg_query, SAMPLES / "synthetic_dpkg_query_states.txt"),
    (packages.apt_showhold, SAMPLES / "synthetic_apt_showhold.txt"),
    (packages.apt_madison, SAMPLES / "synthetic_apt_madison.txt"),
    (xid.xid_events, H200 / "dmesg_xid.txt"),
    (xid.xid_events, SAMPLES / "synthetic_dmesg_xid.txt"),
    (network.ethtool_stats, SAMPLES / "synthetic_ethtool_S_mlx5.txt"),
    (system.sys_pci_gpus, H200 / "sys_pci_nvidia.txt"),
]


def indented(text: str, prefix: str) -> str:
    return "".join(prefix + line + "\n" for line in text.splitlines())


@pytest.mark.parametrize("prefix", ["    ", "\t", "  \t"], ids=["spaces", "tab", "mixed"])
@pytest.mark.parametrize(("parse", "path"), CASES,
                         ids=[f"{f.__name__}:{p.name}" for f, p in CASES])
def test_every_line_indented_parses_the_same(parse: Callable[[str], Any], path: Path,
                                             prefix: str) -> None:
    text = path.read_text()
    assert parse(indented(text, prefix)) == parse(text)


def test_the_reported_mlnx_qos_failure() -> None:
    # The output alone, copied with every line indented: it failed with "expected a
    # 'Priority trust state:' line, got 'DCBX mode: OS controlled'".
    text = (SAMPLES / "synthetic_mlnx_qos_buffers_ets.txt").read_text()
    assert qos.mlnx_qos(indented(text, "        ")) == qos.mlnx_qos(text)


def test_mlnx_qos_output_indented_inside_an_unindented_log() -> None:
    text = (SAMPLES / "mlnx_qos_dscp_trust_prio3.txt").read_text()
    mixed = "".join(line + "\n" if line.startswith(("+", "$", "#")) else "   " + line + "\n"
                    for line in text.splitlines())
    assert qos.mlnx_qos(mixed) == qos.mlnx_qos(text)


@pytest.mark.parametrize("extra", [
    "Receive buffer size (bytes): 130944,130944,0,0,0,0,0,0,",
    "Cable len: 7",
    "DCBX CEE: disabled",
    "ECN: supported",
])
def test_mlnx_qos_ignores_lines_it_does_not_know(extra: str) -> None:
    text = (SAMPLES / "synthetic_mlnx_qos_buffers_ets.txt").read_text()
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("Priority trust state"))
    with_extra = "\n".join([*lines[: at + 1], extra, *lines[at + 1 :]]) + "\n"
    assert qos.mlnx_qos(with_extra) == qos.mlnx_qos(text)


def test_dcb_pfc_ignores_keys_it_does_not_know() -> None:
    text = (SAMPLES / "dcb_pfc_show_manpage.txt").read_text()
    assert qos.dcb_pfc(text + "pfc-new-field 3\n") == qos.dcb_pfc(text)
