"""Parsers on output as people paste it: every line indented (spaces or tabs), and lines a
newer tool version adds. The parse must not change."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpufleet.facts import parsers

FIXTURES = Path(__file__).parent.parent / "fixtures"
SAMPLES, H200 = FIXTURES / "samples", FIXTURES / "h200x2"
CASES = [
    ("mlnx_qos", SAMPLES / "mlnx_qos_dscp_trust_prio3.txt"),
    ("mlnx_qos", SAMPLES / "synthetic_mlnx_qos_buffers_ets.txt"),
    ("mlnx_qos", SAMPLES / "synthetic_mlnx_qos_pcp_trust.txt"),
    ("dcb_pfc", SAMPLES / "dcb_pfc_show_manpage.txt"),
    ("dcb_pfc", SAMPLES / "synthetic_dcb_pfc_show_stats.txt"),
    ("dcb_pfc_json", SAMPLES / "synthetic_dcb_pfc_json.txt"),
    ("nccl_tests", SAMPLES / "nccl_tests_all_reduce_current_format.txt"),
    ("nvidia_smi_query", H200 / "query_gpu_csv.txt"),
    ("nvidia_topo", H200 / "topo_m.txt"),
    ("nvidia_topo", SAMPLES / "synthetic_topo_m_8gpu_nics.txt"),
    ("nvlink_status", H200 / "nvlink_status.txt"),
    ("nvlink_status", SAMPLES / "synthetic_nvlink_status_inactive.txt"),
    ("proc_driver_version", H200 / "proc_nvidia_version.txt"),
    ("cuda_version_json", SAMPLES / "synthetic_cuda_version_json.txt"),
    ("nvcc_version", H200 / "nvcc_version.txt"),
    ("torch_info", H200 / "torch_versions.txt"),
    ("os_release", H200 / "os_release.txt"),
    ("meminfo", H200 / "meminfo.txt"),
    ("ip_addr_json", SAMPLES / "synthetic_ip_j_addr.txt"),
    ("sys_class_net", SAMPLES / "synthetic_sys_class_net.txt"),
    ("port_range", H200 / "port_range.txt"),
    ("dpkg_query", SAMPLES / "synthetic_dpkg_query_states.txt"),
    ("apt_showhold", SAMPLES / "synthetic_apt_showhold.txt"),
    ("apt_madison", SAMPLES / "synthetic_apt_madison.txt"),
    ("xid_events", H200 / "dmesg_xid.txt"),
    ("xid_events", SAMPLES / "synthetic_dmesg_xid.txt"),
    ("ethtool_stats", SAMPLES / "synthetic_ethtool_S_mlx5.txt"),
    ("sys_pci_gpus", H200 / "sys_pci_nvidia.txt"),
]


def parser(name: str) -> Callable[[str], Any]:
    found: Callable[[str], Any] = getattr(parsers, name)
    return found


def indented(text: str, prefix: str) -> str:
    return "".join(prefix + line + "\n" for line in text.splitlines())


@pytest.mark.parametrize("prefix", ["    ", "\t", "  \t"], ids=["spaces", "tab", "mixed"])
@pytest.mark.parametrize(("name", "path"), CASES, ids=[f"{n}:{p.name}" for n, p in CASES])
def test_every_line_indented_parses_the_same(name: str, path: Path, prefix: str) -> None:
    text = path.read_text()
    assert parser(name)(indented(text, prefix)) == parser(name)(text)


def test_the_reported_mlnx_qos_failure() -> None:
    # The output alone, copied with every line indented: it failed with "expected a
    # 'Priority trust state:' line, got 'DCBX mode: OS controlled'".
    text = (SAMPLES / "synthetic_mlnx_qos_buffers_ets.txt").read_text()
    assert parsers.mlnx_qos(indented(text, "        ")) == parsers.mlnx_qos(text)


def test_mlnx_qos_output_indented_inside_an_unindented_log() -> None:
    text = (SAMPLES / "mlnx_qos_dscp_trust_prio3.txt").read_text()
    mixed = "".join(line + "\n" if line.startswith(("+", "$", "#")) else "   " + line + "\n"
                    for line in text.splitlines())
    assert parsers.mlnx_qos(mixed) == parsers.mlnx_qos(text)


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
    assert parsers.mlnx_qos(with_extra) == parsers.mlnx_qos(text)


def test_dcb_pfc_ignores_keys_it_does_not_know() -> None:
    text = (SAMPLES / "dcb_pfc_show_manpage.txt").read_text()
    assert parsers.dcb_pfc(text + "pfc-new-field 3\n") == parsers.dcb_pfc(text)
