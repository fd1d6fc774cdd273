"""The pure verdicts behind the rdma and gpu suites, on real captured output."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.conformance.checks import gpu, host_sizing
from gpufleet.conformance.checks import rdma as rdma_checks
from gpufleet.conformance.measure import rdma
from gpufleet.conformance.measure.reachability import pairs, probe_ports
from gpufleet.errors import GpufleetError
from gpufleet.facts import script
from gpufleet.facts.parsers import nvidia_smi, xid
from tests.conftest import FIXTURES

H200 = FIXTURES / "h200x2"
SAMPLES = FIXTURES / "samples"


def sections(**texts: tuple[int, str]) -> dict[str, script.Section]:
    return {name: script.Section(name, rc, text) for name, (rc, text) in texts.items()}


def ecn_lines(enabled: dict[int, tuple[int, int]]) -> str:
    return "".join(f"{p} {enabled.get(p, (0, 0))[0]} {enabled.get(p, (0, 0))[1]}\n"
                   for p in range(8))


def test_rdma_state_from_real_mlnx_qos_output_meets_dscp_pfc3_ecn() -> None:
    qos = (SAMPLES / "mlnx_qos_dscp_trust_prio3.txt").read_text()
    state = rdma.parse_state("eth4", sections(mlnx_qos=(0, qos), dcb_pfc=(127, ""),
                                              ecn=(0, ecn_lines({3: (1, 1)})),
                                              ethtool=(127, "")))
    assert (state.tool, state.trust, state.pfc_enabled) == ("mlnx_qos", "dscp", [3])
    assert state.dscp2prio[26] == 3
    expected = {"pfc_priority": 3, "trust": "dscp", "ecn": True}
    assert rdma_checks.problems(state, expected, nccl_ib_tc=106) == []


def test_rdma_problems_name_each_difference() -> None:
    qos = (SAMPLES / "mlnx_qos_dscp_trust_prio3.txt").read_text()
    state = rdma.parse_state("eth4", sections(mlnx_qos=(0, qos),
                                              ecn=(0, ecn_lines({3: (1, 0)}))))
    expected = {"pfc_priority": 4, "trust": "pcp", "ecn": True}
    assert rdma_checks.problems(state, expected, nccl_ib_tc=106) == [
        "eth4: PFC enabled on [3], expected only priority 4",
        "eth4: trust dscp, expected pcp",
        "eth4: ECN on priority 4 is roce_np=0 roce_rp=0, expected both enabled",
        "eth4: NCCL_IB_TC 106 is DSCP 26 -> priority 3, but PFC protects priority 4",
    ]


def test_rdma_unreadable_values_are_unknown_never_off() -> None:
    state = rdma.parse_state("eth4", sections(mlnx_qos=(0, "Priority trust state: ???\n"),
                                              ecn=(0, ecn_lines({}).replace("0 0", "- -"))))
    expected = {"pfc_priority": 3, "trust": "dscp", "ecn": True}
    assert rdma_checks.problems(state, expected, None) == [
        "eth4: PFC unknown",
        "eth4: trust mode unknown",
        "eth4: ECN on priority 3 unknown (no /sys/class/net/<if>/ecn)",
    ]
    assert state.unknown[0].startswith("mlnx_qos output unreadable:")


def test_rdma_with_dcb_only_reads_pfc_and_says_trust_is_unknown() -> None:
    dcb = '{"pfc_cap":8,"macsec_bypass":false,"delay":4096,' \
          '"prio_pfc":[false,false,false,true,false,false,false,false]}'
    state = rdma.parse_state("eth2", sections(mlnx_qos=(127, ""), dcb_pfc=(0, dcb)))
    assert (state.tool, state.pfc_enabled, state.trust) == ("dcb", [3], None)
    assert rdma_checks.problems(state, {"pfc_priority": 3}, None) == []
    assert rdma_checks.problems(state, {"pfc_priority": 3, "trust": "dscp"}, None) == [
        "eth2: trust mode unknown"]


def test_gpu_health_of_the_real_h200_capture_is_clean() -> None:
    gpus = nvidia_smi.nvidia_smi_query((H200 / "query_gpu_csv.txt").read_text())
    assert gpu.health_problems(gpus, 85, 5, 16) == []
    topo = nvidia_smi.nvidia_topo((H200 / "topo_m.txt").read_text())
    assert gpu.topology_problems(topo, True) == []
    assert gpu.nvlink_problems(nvidia_smi.nvlink_status(
        (H200 / "nvlink_status.txt").read_text())) == []
    assert gpu.xid_verdict(xid.xid_events((H200 / "dmesg_xid.txt").read_text()), {}) == (
        [], [])


def test_gpu_health_problems() -> None:
    gpus = nvidia_smi.nvidia_smi_query((H200 / "query_gpu_csv.txt").read_text())
    bad = dict(gpus[1], **{"ecc.errors.uncorrected.volatile.total": 2,
                           "remapped_rows.pending": True,
                           "clocks_event_reasons.hw_thermal_slowdown": True,
                           "temperature.gpu": 91, "pcie.link.width.current": 8})
    assert gpu.health_problems([gpus[0], bad], 85, None, None) == [
        "GPU1: 2 uncorrectable ECC errors since boot",
        "GPU1: row remapping pending (reset the GPU)",
        "GPU1: clock slowdown active: hw_thermal_slowdown",
        "GPU1: 91 C, above 85 C",
        "GPU1: PCIe x8, expected x16",
    ]


def test_gpu_topology_with_a_pair_on_sys() -> None:
    topo = {"gpus": ["GPU0", "GPU1", "GPU2"],
            "matrix": {"GPU0": {"GPU1": "NV18", "GPU2": "SYS"},
                       "GPU1": {"GPU0": "NV18", "GPU2": "NV18"},
                       "GPU2": {"GPU0": "SYS", "GPU1": "NV18"}}}
    assert gpu.topology_problems(topo, None) == ["GPU0-GPU2 connected by SYS, not NVLink"]
    assert gpu.topology_problems(topo, False) == []
    assert gpu.nvlink_problems({0: [26.5, None, 26.5], 1: [26.5]}) == [
        "GPU0 NVLink(s) 1 inactive"]


def test_xids_judged_by_the_catalogue_from_a_kernel_log(tmp_path: Path) -> None:
    log = ("[ 12.3] NVRM: Xid (PCI:0000:3b:00): 79, pid=123, name=python, GPU has fallen off "
           "the bus.\n[ 13.0] NVRM: Xid (PCI:0000:3b:00): 13, pid=9, Graphics Exception\n"
           "[ 14.0] NVRM: Xid (PCI:0000:3b:00): 63, Row Remapper: New row marked\n")
    events = xid.xid_events(log)
    assert [e["at"] for e in events] == [12.3, 13.0, 14.0]
    fell = ("Xid 79 on 0000:3b:00 (GPU has fallen off the bus): RESTART_BM [reboot]: GPU has "
            "fallen off the bus.")
    app = "Xid 13 on 0000:3b:00 (Graphics Engine Exception): RESTART_APP [application]: " \
          "Graphics Exception"
    assert gpu.xid_verdict(events, {}) == ([fell], [app])
    assert gpu.xid_verdict(events, {}, since=12.5) == ([], [app])
    quiet = gpu.xid_policy({79: "warn", "13": "ignore"})
    assert gpu.xid_verdict(events, quiet) == ([], [fell])
    assert gpu.xid_verdict(events, gpu.xid_policy({63: "fail"}))[0] == [
        fell, "Xid 63 on 0000:3b:00 (GPU memory remapping event): IGNORE [ignore]: Row "
              "Remapper: New row marked"]
    with pytest.raises(ValueError, match="gpu_xid_policy entry 79: drain"):
        gpu.xid_policy({79: "drain"})


def test_an_application_xid_repeating_on_one_gpu_fails_the_gpu_suite() -> None:
    """The third burst of Xid 13 on one GPU within an hour needs a reset; a burst of lines
    within seconds is one, and the same Xid on another GPU counts apart."""
    lines = [(100.0, "3b"), (100.5, "3b"), (900.0, "3b"), (1000.0, "5d"), (2000.0, "3b")]
    log = "".join(f"[{at}] NVRM: Xid (PCI:0000:{bus}:00): 13, pid=9, Graphics Exception\n"
                  for at, bus in lines)
    failures, warnings = gpu.xid_verdict(xid.xid_events(log), {})
    assert failures == ["Xid 13 on 0000:3b:00 (Graphics Engine Exception): RESTART_APP "
                        "[reset: 3 times in 1 h on this GPU]: Graphics Exception"]
    assert len(warnings) == 4


def test_reachability_pairs_and_ports() -> None:
    names = ["a", "b", "c", "d"]
    assert len(pairs(names, "all")) == 12
    assert pairs(names, "ring") == sorted({("a", "b"), ("b", "c"), ("c", "d"), ("d", "a"),
                                           ("b", "a"), ("c", "b"), ("d", "c"), ("a", "d")})
    sample = pairs(names, "sample:1")
    assert set(pairs(names, "ring")) <= set(sample) and sample == pairs(names, "sample:1")
    assert pairs(["a"], "all") == []
    with pytest.raises(GpufleetError, match="--pairs must be auto, all, ring or sample:K"):
        pairs(names, "some")
    assert probe_ports(29500, 49152, 65535, 3) == [29500, 49152, 53247, 57343, 61439, 65535]


# df -P -B1 /dev/shm as captured on a Debian 12 machine: its tmpfs (as large as its memory),
# and, in a mount namespace of its own, a 64 MiB one (``mount -t tmpfs -o size=64m``, the
# size a container runtime gives by default)
DF_SHM = ("Filesystem        1-blocks  Used   Available Capacity Mounted on\n"
          "tmpfs          25275990016     0 25275990016       0% /dev/shm\n")
DF_SHM_64M = ("Filesystem     1-blocks  Used Available Capacity Mounted on\n"
              "tmpfs          67108864     0  67108864       0% /dev/shm\n")


def test_shared_memory_is_read_from_df_and_judged_against_the_floor() -> None:
    size = host_sizing.parse_shm(DF_SHM)
    assert size == 25275990016
    assert host_sizing.shm_problem(size, 1) is None
    small = host_sizing.parse_shm(DF_SHM_64M)
    assert small == 64 * 2**20
    assert host_sizing.shm_problem(small, 1) == (
        "/dev/shm is 0.07 GB, below host_min_shm_gb 1: NCCL's shared-memory transport and "
        "DataLoader workers run out of it")
    with pytest.raises(GpufleetError, match="no /dev/shm in df output"):
        host_sizing.parse_shm("df: /dev/shm: No such file or directory\n")
