"""The NVIDIA readers on real captures of several GPU generations, drivers and layouts
(tests/fixtures/nvidia/README.md says where each comes from), and the faults those captures
showed: units left in query values, a topology matrix with an empty CPU Affinity or with
its tabs turned into spaces, a DCGM result that stands for several GPUs, and the empty
``nvlink -s`` of a machine without NVLink."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from gpufleet.errors import ParseError
from gpufleet.facts import catalog
from gpufleet.facts import script as fscript
from gpufleet.facts.gather import parse_sections
from gpufleet.facts.parsers import dcgm, nvidia_smi, system, xid

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
NVIDIA, H200X1, H200X2 = FIXTURES / "nvidia", FIXTURES / "h200x1", FIXTURES / "h200x2"


def read(path: Path) -> str:
    return path.read_text()


# --------------------------------------------------------------------------- --query-gpu


def test_query_gpu_with_units_reads_the_numbers_nounits_gives() -> None:
    with_units = nvidia_smi.nvidia_smi_query(read(NVIDIA / "h200x1_query_gpu_csv_units.txt"))
    without = nvidia_smi.nvidia_smi_query(read(H200X1 / "query_gpu_csv.txt"))
    assert with_units[0]["memory.total"] == without[0]["memory.total"] == 143771
    assert with_units[0]["power.draw"] == 79.67
    assert with_units[0]["power.limit"] == 700.0
    assert with_units[0]["clocks.current.sm"] == 345
    assert with_units[0]["clocks.max.sm"] == 1980
    assert list(with_units[0]) == list(without[0])
    assert {k: type(v) for k, v in with_units[0].items()} == \
        {k: type(v) for k, v in without[0].items()}


def test_query_gpu_percent_and_not_available_with_units() -> None:
    assert nvidia_smi.nvidia_smi_query(read(NVIDIA / "h200x1_query_gpu_csv_units_memory.txt")) == [{
        "index": 0, "memory.total": 143771, "memory.used": 0, "memory.free": 143156,
        "power.draw": 79.74, "power.limit": 700.0, "clocks.current.sm": 345,
        "clocks.current.memory": 3201, "temperature.gpu": 35, "utilization.gpu": 0,
        "fan.speed": None}]


def test_query_gpu_keeps_a_value_whose_unit_is_not_its_header_s() -> None:
    text = "index, memory.total [MiB]\n0, 140 GiB\n"
    assert nvidia_smi.nvidia_smi_query(text) == [{"index": 0, "memory.total": "140 GiB"}]


# --------------------------------------------------------------------------- topo -m


def test_topo_h100_with_tabs_turned_into_spaces() -> None:
    topo = nvidia_smi.nvidia_topo(read(NVIDIA / "h100x4_topo_m_spaces_nccl1617.txt"))
    assert topo["gpus"] == ["GPU0", "GPU1", "GPU2", "GPU3"]
    assert list(topo["matrix"]) == [*topo["gpus"], "NIC0", "NIC1", "NIC2", "NIC3"]
    assert topo["matrix"]["GPU0"] == {"GPU0": "X", "GPU1": "NV6", "GPU2": "NV6", "GPU3": "NV6",
                                      "NIC0": "PIX", "NIC1": "SYS", "NIC2": "SYS", "NIC3": "SYS"}
    assert topo["matrix"]["NIC3"]["NIC3"] == "X"
    assert topo["cpu_affinity"] == {"GPU0": "6,14,22,30", "GPU1": "4,12,20,28",
                                    "GPU2": "7,15,23,31", "GPU3": "5,13,21,29"}
    assert topo["numa_affinity"] == {"GPU0": "3", "GPU1": "1", "GPU2": "7", "GPU3": "5"}


def test_topo_a100_spaces_without_gpu_numa_id_and_with_the_nic_legend() -> None:
    topo = nvidia_smi.nvidia_topo(read(NVIDIA / "a100x4_topo_m_spaces_nccltests331.txt"))
    assert topo["gpus"] == ["GPU0", "GPU1", "GPU2", "GPU3"]
    assert all(topo["matrix"][a][b] == "NV4" for a in topo["gpus"] for b in topo["gpus"]
               if a != b)
    assert topo["cpu_affinity"] == dict.fromkeys(topo["gpus"], "0")
    assert topo["numa_affinity"] == dict.fromkeys(topo["gpus"], "0-1")
    assert topo["nics"] == {"NIC0": "mlx5_0", "NIC1": "mlx5_1"}


def test_topo_rtx4090_tab_separated() -> None:
    topo = nvidia_smi.nvidia_topo(read(NVIDIA / "rtx4090x8_topo_m_tabs_gpuallocator17.txt"))
    assert len(topo["gpus"]) == 8
    assert topo["matrix"]["GPU6"]["NIC0"] == topo["matrix"]["NIC0"]["GPU6"] == "PHB"
    assert topo["cpu_affinity"]["GPU0"] == "0-55,112-167"
    assert topo["cpu_affinity"]["GPU7"] == "56-111,168-223"
    assert topo["numa_affinity"] == {f"GPU{i}": str(i // 4) for i in range(8)}


@pytest.mark.parametrize("path", [H200X2 / "topo_m.txt", NVIDIA / "h200x1_topo_m.txt",
                                  NVIDIA / "rtx4090x8_topo_m_tabs_gpuallocator17.txt"],
                         ids=lambda p: p.name)
def test_topo_copied_from_a_terminal_reads_like_the_tool_printed_it(path: Path) -> None:
    text = read(path)
    assert nvidia_smi.nvidia_topo(text.expandtabs()) == nvidia_smi.nvidia_topo(text)


@pytest.mark.parametrize("prefix", ["    ", "\t", "  \t"], ids=["spaces", "tab", "mixed"])
@pytest.mark.parametrize("name", ["h100x4_topo_m_spaces_nccl1617.txt",
                                  "a100x4_topo_m_spaces_nccltests331.txt"])
def test_topo_with_spaces_and_every_line_indented(name: str, prefix: str) -> None:
    text = read(NVIDIA / name)
    indented = "".join(prefix + line + "\n" for line in text.splitlines())
    assert nvidia_smi.nvidia_topo(indented) == nvidia_smi.nvidia_topo(text)


def test_topo_empty_cpu_affinity_inside_a_cpuset() -> None:
    # What a job's cpuset without the GPU's CPUs makes nvidia-smi print: nothing between
    # the tabs where the CPU list goes.
    text = read(H200X2 / "topo_m.txt").replace("\t0-31\t", "\t\t")
    topo = nvidia_smi.nvidia_topo(text)
    assert topo["cpu_affinity"] == {"GPU0": "", "GPU1": ""}
    assert topo["numa_affinity"] == {"GPU0": "0", "GPU1": "0"}
    assert nvidia_smi.nvidia_topo(text.expandtabs()) == topo


def test_topo_empty_cpu_affinity_with_spaces() -> None:
    text = read(NVIDIA / "h100x4_topo_m_spaces_nccl1617.txt")
    for cpus in ("6,14,22,30", "4,12,20,28", "7,15,23,31", "5,13,21,29"):
        text = text.replace(cpus, " " * len(cpus))
    topo = nvidia_smi.nvidia_topo(text)
    assert topo["cpu_affinity"] == {"GPU0": "", "GPU1": "", "GPU2": "", "GPU3": ""}
    assert topo["numa_affinity"] == {"GPU0": "3", "GPU1": "1", "GPU2": "7", "GPU3": "5"}


def test_topo_spaced_row_with_a_missing_affinity_other_than_cpu_is_refused() -> None:
    text = "        GPU0    CPU Affinity    NUMA Affinity   GPU NUMA ID\nGPU0     X      0-15\n"
    with pytest.raises(ParseError, match="3 affinity fields"):
        nvidia_smi.nvidia_topo(text)


# --------------------------------------------------------------------------- nvlink -s


@pytest.mark.parametrize("name", ["h200x1_nvlink_s_empty.txt", "a10_nvlink_s_empty_gpud.txt"])
def test_nvlink_status_of_a_machine_without_nvlink_is_no_links(name: str) -> None:
    assert nvidia_smi.nvlink_status(read(NVIDIA / name)) == {}


def test_nvlink_status_a100() -> None:
    links = nvidia_smi.nvlink_status(read(NVIDIA / "a100_nvlink_s_gpud.txt"))
    assert links == {gpu: [25.0] * 12 for gpu in range(8)}


def test_the_nvlink_fact_of_a_single_gpu_is_no_links_not_unknown(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\n[ \"$1\" = nvlink ] && exit 0\nexit 2\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    fact = next(f for f in catalog.BASE_FACTS if f.name == "nvlink")
    text = fscript.compose([(fact.name, fact.shell)])
    proc = subprocess.run(["sh", "-c", text], capture_output=True, timeout=60, check=False)
    facts = parse_sections("local", proc.stdout.decode(), [fact])
    assert facts.absent == {}
    assert facts.values["nvlink"] == {}


# --------------------------------------------------------------------------- nvidia-smi -q / -L


@pytest.mark.parametrize(("name", "bus_id"), [("a10_q_gpud.txt", "00000000:06:00.0"),
                                              ("h200x1_q.txt", "00000000:00:06.0")])
def test_smi_q_without_a_fabric(name: str, bus_id: str) -> None:
    assert nvidia_smi.nvidia_smi_q(read(NVIDIA / name)) == [
        {"bus_id": bus_id.lower(), "persistence": "Enabled", "fabric_state": "N/A",
         "fabric_status": "N/A"}]


def test_smi_list_skips_mig_devices() -> None:
    gpus = nvidia_smi.nvidia_smi_list(read(NVIDIA / "a100_L_mig_telegraf5812.txt"))
    assert [(g["index"], g["name"]) for g in gpus] == [
        (i, "NVIDIA A100-SXM4-80GB") for i in range(4)]
    assert gpus[0]["uuid"] == "GPU-513536b6-7d19-9063-b049-1e69664bb298"


@pytest.mark.parametrize(("name", "model", "count"), [
    ("quadro_rtx4000_L_akash12.txt", "Quadro RTX 4000", 2),
    ("h200x1_L.txt", "NVIDIA H200", 1),
])
def test_smi_list(name: str, model: str, count: int) -> None:
    gpus = nvidia_smi.nvidia_smi_list(read(NVIDIA / name))
    assert [g["name"] for g in gpus] == [model] * count
    assert all(g["uuid"].startswith("GPU-") for g in gpus)


# --------------------------------------------------------------------------- dcgmi diag


def test_dcgm3_result_for_several_gpus_is_one_row_per_gpu() -> None:
    diag = dcgm.dcgm_diag(read(NVIDIA / "dcgm3_diag_8gpu_dcgm_jsonresulttests.txt"))
    assert diag["version"] == "3.1.0"
    gpus = [str(i) for i in range(8)]
    assert [t["gpu"] for t in diag["tests"] if t["name"] == "Denylist"] == gpus
    assert [t["gpu"] for t in diag["tests"] if t["name"] == "software"] == gpus
    assert len(diag["tests"]) == 10 * 8
    assert {t["status"] for t in diag["tests"]} == {"PASS"}


def test_dcgm4_results_by_entity() -> None:
    diag = dcgm.dcgm_diag(read(NVIDIA / "dcgm4_diag_8gpu_dcgm215.txt"))
    assert [(t["gpu"], t["status"]) for t in diag["tests"]] == [
        (str(i), "PASS") for i in range(8)]
    assert diag["tests"][0]["info"].endswith("GPU 0 calculated at approximately 859.08 "
                                             "gigaflops during this test")
    assert diag["tests"][7]["info"] == ""


def test_dcgm4_version_and_warnings_as_dcgm_4_writes_them() -> None:
    document = json.loads(read(NVIDIA / "dcgm4_diag_8gpu_dcgm215.txt"))
    result = document["DCGM Diagnostic"]["test_categories"][0]["tests"][0]["results"][1]
    result.update(status="Fail", warnings=[{"error_category": 8, "error_id": 29,
                                            "warning": "GPU 1 has uncorrectable errors"}])
    document["metadata"] = {"Driver Version Detected": "580.82.09", "version": "4.2.3"}
    diag = dcgm.dcgm_diag(json.dumps(document))
    assert diag["version"] == "4.2.3"
    assert diag["tests"][1]["status"] == "FAIL"
    assert diag["tests"][1]["info"].startswith("GPU 1 has uncorrectable errors; Allocated")


@pytest.mark.parametrize("ids", ['"0,x"', '""', "true", '"0,,1"'])
def test_dcgm3_gpu_ids_that_are_not_gpu_numbers_are_refused(ids: str) -> None:
    text = ('{"DCGM GPU Diagnostic": {"test_categories": [{"category": "Deployment", "tests": '
            f'[{{"name": "Denylist", "results": [{{"gpu_ids": {ids}, "status": "PASS"}}]}}]}}]}}}}')
    with pytest.raises(ParseError, match="gpu_ids"):
        dcgm.dcgm_diag(text)


# --------------------------------------------------------------------------- Xid, driver


def test_xid_events_dmesg_a800() -> None:
    events = xid.xid_events(read(NVIDIA / "a800_dmesg_xid13_vllm5901.txt"))
    assert len(events) == 6
    assert {(e["pci"], e["xid"]) for e in events} == {("0000:43:00", 13)}
    assert events[0]["at"] == 93297.027938
    assert events[0]["message"].startswith("Graphics Exception: ESR 0x52e7b0=0x101000e")


def test_xid_events_dmesg_human_times() -> None:
    events = xid.xid_events(read(NVIDIA / "dmesg_T_xid_akash244.txt"))
    assert [(e["pci"], e["xid"], e["at"]) for e in events] == [
        ("0000:00:05", 43, None), ("0000:00:05", 43, None), ("0000:00:07", 31, None),
        ("0000:00:08", 94, None)]
    assert events[3]["message"] == "Contained: SM (0x1). RST: No, D-RST: No"


def test_xid_events_syslog_keeps_the_kernel_time() -> None:
    events = xid.xid_events(read(NVIDIA / "syslog_xid13_relion436.txt"))
    assert [e["at"] for e in events] == [82659.755847, 82659.755933, 82659.75594, 82659.755946]
    assert events[1]["message"] == ("Graphics SM Warp Exception on (GPC 1, TPC 0, SM 0): "
                                    "Illegal Instruction Encoding")


def test_xid_events_gsp_timeout_among_rpc_history() -> None:
    events = xid.xid_events(read(NVIDIA / "dmesg_xid119_gpud.txt"))
    assert [e["xid"] for e in events] == [119] * 5
    assert {e["pci"] for e in events} == {"0000:9b:00"}


@pytest.mark.parametrize(("name", "version", "flavor"), [
    ("proc_version_384_neofetch876.txt", "384.98", "proprietary"),
    ("proc_version_565_open_nixgl186.txt", "565.57.01", "open"),
    ("proc_version_jetson_aarch64_nixgl139.txt", "35.3.1", "open"),
    ("proc_version_580_truenas19.txt", "580.173.02", "proprietary"),
    ("h200x1_proc_version.txt", "580.159.04", "open"),
])
def test_proc_driver_version(name: str, version: str, flavor: str) -> None:
    text = read(NVIDIA / name)
    assert system.proc_driver_version(text) == version
    assert system.proc_driver_flavor(text) == flavor


# --------------------------------------------------------------------------- garbled lines


def test_an_xid_line_that_cannot_be_read_makes_the_log_unknown() -> None:
    text = read(NVIDIA / "a800_dmesg_xid13_vllm5901.txt").replace("): 13, pid", "): 1x, pid", 1)
    with pytest.raises(ParseError, match="NVRM: Xid"):
        xid.xid_events(text)


def test_smi_q_gpu_line_without_a_bus_id_is_refused() -> None:
    text = read(NVIDIA / "a10_q_gpud.txt").replace("GPU 00000000:06:00.0", "GPU 0")
    with pytest.raises(ParseError, match="'GPU 0'"):
        nvidia_smi.nvidia_smi_q(text)


def test_a_broken_dcgm_document_is_not_read_from_an_object_inside_it() -> None:
    text = read(NVIDIA / "dcgm3_diag_8gpu_dcgm_jsonresulttests.txt")
    broken = text.replace('"status" : "PASS"', '"status" : PASS', 1)
    with pytest.raises(ParseError, match="valid JSON"):
        dcgm.dcgm_diag(broken)
