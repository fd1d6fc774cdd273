"""gpufleet-watch (gpufleet/node/watch.py): its parsers on real captures, and each rule on a
synthetic sysfs tree and a stand-in nvidia-smi, observed at chosen times (--now)."""

from __future__ import annotations

import ast
import contextlib
import fcntl
import json
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gpufleet.node import watch
from tests.conftest import FIXTURES, stand_in

PROGRAM = Path(watch.__file__)
T0 = 1_765_000_000.0
IB_COUNTERS = ("symbol_error", "link_error_recovery", "link_downed", "port_rcv_errors",
               "excessive_buffer_overrun_errors", "local_link_integrity_errors",
               "port_xmit_discards")
GPU = "0000:18:00.0"
NIC = "0000:1a:00.0"


# ---- a node: a sysfs tree, a stand-in nvidia-smi and the program's state ---------------------

@dataclass
class Node:
    """A node the watch observes: its sysfs tree, nvidia-smi's outputs, its configuration."""

    root: Path
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def sys(self) -> Path:
        return self.root / "sys"

    @property
    def state_dir(self) -> Path:
        return self.root / "state"

    @property
    def smi_dir(self) -> Path:
        return self.root / "smi"

    def write_config(self, **extra: Any) -> Path:
        config = {"state_dir": str(self.state_dir), "sys_root": str(self.sys),
                  "textfile_dir": str(self.root / "textfile"),
                  "nvidia_smi": str(self.root / "bin" / "nvidia-smi"), **self.config, **extra}
        path = self.root / "watch.json"
        path.write_text(json.dumps(config))
        return path

    def port(self, device: str = "mlx5_0", number: int = 1, up: bool = True,
             hw: dict[str, int] | None = None, **counters: int) -> None:
        base = self.sys / "class" / "infiniband" / device / "ports" / str(number)
        (base / "counters").mkdir(parents=True, exist_ok=True)
        (base / "hw_counters").mkdir(exist_ok=True)
        (base / "state").write_text("4: ACTIVE\n" if up else "1: DOWN\n")
        (base / "phys_state").write_text("5: LinkUp\n" if up else "3: Disabled\n")
        (base / "link_layer").write_text("InfiniBand\n")
        for name in IB_COUNTERS:
            path = base / "counters" / name
            if name in counters or not path.exists():
                path.write_text(f"{counters.get(name, 0)}\n")
        for name, value in (hw or {}).items():
            (base / "hw_counters" / name).write_text(f"{value}\n")

    def pci(self, address: str, kind: str = "GPU", width: tuple[int, int] = (16, 16),
            speed: tuple[str, str] = ("32.0 GT/s PCIe", "32.0 GT/s PCIe"),
            aer: tuple[int, int, int] = (0, 0, 0)) -> None:
        base = self.sys / "bus" / "pci" / "devices" / address
        base.mkdir(parents=True, exist_ok=True)
        vendor, klass = ("0x10de", "0x030200") if kind == "GPU" else ("0x15b3", "0x020700")
        (base / "vendor").write_text(vendor + "\n")
        (base / "class").write_text(klass + "\n")
        (base / "current_link_width").write_text(f"{width[0]}\n")
        (base / "max_link_width").write_text(f"{width[1]}\n")
        (base / "current_link_speed").write_text(speed[0] + "\n")
        (base / "max_link_speed").write_text(speed[1] + "\n")
        names = {"correctable": ("RxErr", "BadTLP", "TOTAL_ERR_COR"),
                 "nonfatal": ("Undefined", "CmpltTO", "TOTAL_ERR_NONFATAL"),
                 "fatal": ("DLP", "SDES", "TOTAL_ERR_FATAL")}
        for (name, lines), count in zip(names.items(), aer, strict=True):
            (base / f"aer_dev_{name}").write_text(
                f"{lines[0]} {count}\n{lines[1]} 0\n{lines[2]} {count}\n")

    def smi(self, nvlink: str = "", query: str = "", delay: float = 0) -> None:
        """The stand-in nvidia-smi: ``nvlink -e`` prints ``nvlink``, ``-q ...`` prints
        ``query``."""
        self.smi_dir.mkdir(parents=True, exist_ok=True)
        (self.smi_dir / "nvlink.txt").write_text(nvlink)
        (self.smi_dir / "q.txt").write_text(query)
        (self.root / "bin").mkdir(exist_ok=True)
        pause = f"sleep {delay}\n" if delay else ""
        stand_in(self.root / "bin", "nvidia-smi",
                 f'{pause}if [ "$1" = nvlink ]; then cat {self.smi_dir}/nvlink.txt; '
                 f"else cat {self.smi_dir}/q.txt; fi\n")

    def run(self, now: float, *args: str, capsys: pytest.CaptureFixture[str],
            **extra: Any) -> tuple[int, dict[str, Any]]:
        """One observation at ``now`` with --json: the exit status and the report."""
        rc = watch.main(["--config", str(self.write_config(**extra)), "--json", "--now",
                         str(now), *args])
        out = capsys.readouterr().out
        report = json.loads(out)
        assert out.count("\n") == 1, "one JSON object on one line"
        return rc, report

    def text(self, now: float, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
        rc = watch.main(["--config", str(self.write_config()), "--now", str(now)])
        return rc, capsys.readouterr().out

    def command(self, *args: str) -> int:
        return watch.main([*args, "--config", str(self.write_config())])


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Node]:
    boot = tmp_path / "boot_id"
    boot.write_text("boot-1\n")
    monkeypatch.setattr(watch, "BOOT_ID_FILE", str(boot))
    yield Node(tmp_path)


def finding(report: dict[str, Any], ident: str) -> dict[str, Any] | None:
    return next((f for f in report["findings"] if f["id"] == ident), None)


def promtool(path: Path) -> None:
    tool = shutil.which("promtool")
    assert tool, "promtool missing: ./scripts/setup installs Debian's prometheus package"
    proc = subprocess.run([tool, "check", "metrics"], input=path.read_bytes(),
                          capture_output=True, timeout=60, check=False)
    assert proc.returncode == 0, (proc.stdout + proc.stderr).decode()


# ---- the program -----------------------------------------------------------------------------

def test_program_needs_only_the_standard_library_and_python_3_8() -> None:
    tree = ast.parse(PROGRAM.read_text(), feature_version=(3, 8))
    roots = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
             for alias in node.names}
    roots |= {node.module.split(".")[0] for node in ast.walk(tree)
              if isinstance(node, ast.ImportFrom) and node.module}
    assert roots - set(sys.stdlib_module_names) == set()


def test_every_rule_names_its_source_and_its_parameters_are_its_kinds() -> None:
    names = [r.name for r in watch.RULES]
    assert len(names) == len(set(names))
    for rule in watch.RULES:
        assert rule.anchor and rule.kind in watch.KINDS and rule.source in watch.SOURCES
        if rule.kind in ("rate", "increase", "flaps"):
            assert rule.window_s > 0
    rules = {r.name: r for r in watch.RULES}
    assert (rules["flaps"].count, rules["flaps"].window_s, rules["flaps"].min_down_s) == \
        (3, 43200, 25)
    assert rules["pcie_width"].confirm == 2 and rules["remap_failure"].confirm == 1


def test_docs_name_every_rule_with_its_kind_and_class() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "watch.md").read_text()
    for rule in watch.RULES:
        assert f"| `{rule.name}` | {watch.CLASS_OF[rule.source]} | {rule.kind} |" in text


# ---- parsers on real captures ----------------------------------------------------------------

WATCH_FIXTURES = FIXTURES / "watch"
ZERO_ECC = {"ecc_correctable": 0, "ecc_uncorrectable": 0, "ecc_sram_correctable": 0,
            "ecc_dram_correctable": 0, "remap_pending": False, "remap_failure": False}


@pytest.mark.parametrize("capture", [
    "h200x2/nvidia_smi_q.txt", "h200x2/query_ecc.txt", "h200x1/nvidia_smi_q.txt",
    "nvidia/h200x1_q.txt", "nvidia/a10_q_gpud.txt",
    "watch/nvidia-smi/h200x1_q_excerpt_perf_ecc_pages_remap.txt",
    "watch/nvidia-smi/h200x1_q_d_ecc_row_remapper_page_retirement.txt"])
def test_memory_errors_read_from_real_nvidia_smi_q(capture: str) -> None:
    """Driver 580's layout (SRAM split into Parity and SEC-DED, Inactive remapped rows) on
    the H200s and the older one of the A10 (GPUd's capture)."""
    gpus = watch.parse_smi_q((FIXTURES / capture).read_text())
    assert gpus
    for address, fields in gpus.items():
        assert address.startswith("0000:")
        assert watch.ecc_readings(fields) == ZERO_ECC, address


def test_memory_error_counts_add_sram_and_dram_and_skip_the_sources_breakdown() -> None:
    text = (FIXTURES / "h200x2" / "nvidia_smi_q.txt").read_text()
    text = text.replace("            DRAM Uncorrectable                         : 0",
                        "            DRAM Uncorrectable                         : 2", 2)
    text = text.replace("            SRAM Correctable                           : 0",
                        "            SRAM Correctable                           : 5", 2)
    text = text.replace("            SRAM L2                                    : 0",
                        "            SRAM L2                                    : 9", 1)
    text = text.replace("        Remapping Failure Occurred                     : No",
                        "        Remapping Failure Occurred                     : Yes", 1)
    first = watch.ecc_readings(watch.parse_smi_q(text)["0000:00:06.0"])
    assert first == {**ZERO_ECC, "ecc_correctable": 5, "ecc_sram_correctable": 5,
                     "ecc_uncorrectable": 2, "remap_failure": True}


def test_retired_pages_of_eight_gpus_real_and_full() -> None:
    """Azure's PAGE_RETIREMENT captures of 8 GPUs (PCI domains 0001..0008): the real one,
    all 0, and the one its authors edited to fill the retirement table."""
    clean = watch.parse_smi_q((WATCH_FIXTURES / "azure-nhc" / "orig_nvsmi8_output.txt")
                              .read_text())
    assert sorted(clean) == [f"{d:04x}:00:00.0" for d in range(1, 9)]
    assert all(watch.ecc_readings(f) == {"retired_pages": 0, "retirement_pending": False}
               for f in clean.values())
    full = watch.parse_smi_q((WATCH_FIXTURES / "azure-nhc" / "bad_nvsmi8_output.txt")
                             .read_text())
    found = {a: watch.ecc_readings(f) for a, f in full.items()}
    assert found["0001:00:00.0"] == {"retired_pages": 65, "retirement_pending": False}
    assert found["0002:00:00.0"] == {"retired_pages": 63, "retirement_pending": True}
    assert found["0004:00:00.0"] == {"retired_pages": 6, "retirement_pending": True}


def test_memory_errors_of_older_drivers_single_and_double_bit_totals() -> None:
    """The Volta-era layout (Single Bit / Double Bit groups with a Total), written from the
    layout NVIDIA's older drivers print: no public capture of it was found."""
    text = """GPU 00000000:3B:00.0
    ECC Errors
        Volatile
            Single Bit
                Device Memory             : 3
                Total                     : 3
            Double Bit
                Total                     : 0
        Aggregate
            Single Bit
                Device Memory             : 7
                Total                     : 7
            Double Bit
                Device Memory             : 1
                Total                     : 1
    Retired Pages
        Single Bit ECC                    : 2
        Double Bit ECC                    : 1
        Pending Page Blacklist            : Yes
"""
    found = watch.ecc_readings(watch.parse_smi_q(text)["0000:3b:00.0"])
    assert found == {"ecc_correctable": 7, "ecc_uncorrectable": 1, "retired_pages": 3,
                     "retirement_pending": True}


def test_nvlink_errors_read_from_real_captures() -> None:
    links = watch.parse_nvlink_errors((FIXTURES / "h200x2" / "nvlink_e.txt").read_text())
    assert sorted({gpu for gpu, _ in links}) == [0, 1]
    assert len(links) == 36
    assert links[(1, 17)] == {"replay_errors": 0, "recovery_errors": 0, "crc_errors": 0}
    assert watch.parse_nvlink_errors(
        (WATCH_FIXTURES / "nvidia-smi" / "h200x1_nvlink_e_empty.txt").read_text()) == {}
    cut = (WATCH_FIXTURES / "nvidia-smi" / "h100_nvlink_e_cut_ml_engineering.txt").read_text()
    links = watch.parse_nvlink_errors(cut)  # spaces for the tab, an editor's [...] line
    assert sorted(links) == [(0, 0), (0, 1), (0, 17)]
    assert links[(0, 17)] == {"replay_errors": 0, "recovery_errors": 0, "crc_errors": 0}


def test_nvlink_5_counters_are_read_by_name() -> None:
    """The NVLink 5 names (GoogleCloudPlatform/cluster-toolkit's test lines): counters by
    name, bit error rates left out."""
    text = ("GPU 0: NVIDIA B200 (UUID: GPU-0)\n\t Link 0: FEC Errors - 0: 17941761\n"
            "\t Link 3: Effective Errors: 0\n\t Link 3: Effective BER: 1e-9\n"
            "\t Link 3: Symbol Errors: 2\n")
    assert watch.parse_nvlink_errors(text) == {
        (0, 0): {"fec_errors_0": 17941761},
        (0, 3): {"effective_errors": 0, "symbol_errors": 2}}


@pytest.mark.parametrize(("tree", "devices"), [
    ("gpud", {"mlx5_0", "mlx5_1", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7", "mlx5_8",
              "mlx5_9", "mlx5_bond_0"}),
    ("procfs", {"mlx4_0", "mlx5_0", "hfi1_0"}),
    ("node_exporter", {"mlx4_0"}),
])
def test_real_rdma_trees_are_read_and_judged_clean(
        node: Node, capsys: pytest.CaptureFixture[str], tree: str, devices: set[str]) -> None:
    """GPUd's H100 node (8 ConnectX-7 InfiniBand ports and a BlueField-3 RoCE bond),
    procfs' ConnectX-3, ConnectX-4 and Omni-Path ports, node_exporter's (an iWARP port
    whose counters read 'N/A (no PMA)' gives none). No PCI device there is an NVIDIA GPU or
    a Mellanox NIC."""
    root = WATCH_FIXTURES / tree / "sys"
    reading = watch.observe({"sys_root": str(root), "nvidia_smi": str(node.root / "absent")},
                            {r.name: r for r in watch.RULES}, watch.Deadline(5))
    assert {k.split("/")[1] for k in reading.counters} == devices
    assert all(port.up for port in reading.ports.values())
    assert reading.read == ({"rdma", "pcie"} if (root / "bus").exists() else {"rdma"})
    assert not reading.conditions
    for key, value in reading.counters.items():
        _, device, port, name = key.split("/")
        group = "hw_counters" if name in ("out_of_sequence", "packet_seq_err",
                                          "roce_slow_restart") else "counters"
        path = root / "class" / "infiniband" / device / "ports" / port / group / name
        assert int(path.read_text()) == value
    rc, report = node.run(T0, capsys=capsys, sys_root=str(root))
    assert rc == 0 and report["findings"] == [] and report["series"] == len(reading.counters)


def test_symbol_errors_climbing_on_a_real_h100_tree(node: Node, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "gpud"
    shutil.copytree(WATCH_FIXTURES / "gpud" / "sys", root)
    node.run(T0, capsys=capsys, sys_root=str(root))
    counter = root / "class" / "infiniband" / "mlx5_7" / "ports" / "1" / "counters"
    (counter / "symbol_error").write_text(str(int((counter / "symbol_error").read_text()) + 200))
    rc, report = node.run(T0 + 1800, capsys=capsys, sys_root=str(root))
    assert rc == 1 and [f["id"] for f in report["findings"]] == ["rdma/mlx5_7/1/symbol_error"]
    assert report["findings"][0]["message"] == (
        "mlx5_7/1 symbol_error +200 in 30m0s (200.0/h, limit 120/h over 1h)")


def test_saturated_counters_of_a_real_port_are_named(node: Node,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """gpud pull request 943's mlx5_1 counters: link_downed at 255, port_xmit_discards at
    65535 and excessive_buffer_overrun_errors at 15 count nothing more."""
    for line in (FIXTURES / "nic" / "ib-port-counters-mlx5_1.txt").read_text().splitlines():
        path, value = line.split(": ")
        target = node.sys / "class" / "infiniband" / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(value + "\n")
    rc, report = node.run(T0, capsys=capsys)
    assert rc == 0 and report["findings"] == []
    assert {n.split(" is saturated")[0] for n in report["notes"]} == {
        "mlx5_1/1 link_downed", "mlx5_1/1 port_xmit_discards",
        "mlx5_1/1 excessive_buffer_overrun_errors"}


@pytest.mark.parametrize("tree", ["procfs", "node_exporter"])
def test_real_pci_files_as_a_mellanox_nic(node: Node, tmp_path: Path, tree: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """Each PCI device of procfs' and node_exporter's trees, its own AER and link files
    kept and its vendor and class made a Mellanox InfiniBand NIC's: the links trained
    below their width (x4 of x8, x8 of x16) or speed (8 of 16 GT/s) are pending; the
    synthetic AER file whose non-fatal file ends in TOTAL_ERR_FATAL gives no non-fatal
    total."""
    root = tmp_path / tree
    shutil.copytree(WATCH_FIXTURES / tree / "sys" / "bus", root / "bus")
    for device in (root / "bus" / "pci" / "devices").iterdir():
        (device / "vendor").write_text("0x15b3\n")
        (device / "class").write_text("0x020700\n")
    rc, report = node.run(T0, capsys=capsys, sys_root=str(root))
    pending = {f["id"]: f["message"] for f in report["findings"]}
    assert rc == 0 and {f["status"] for f in report["findings"]} == {"pending"}
    expected = {"procfs": {"pcie/0000:00:02.1/width", "pcie/0000:00:03.0/width"},
                "node_exporter": {"pcie/0000:00:02.1/width", "pcie/0000:01:00.0/speed"}}
    assert set(pending) == expected[tree]
    if tree == "procfs":
        assert pending["pcie/0000:00:03.0/width"] == (
            "0000:00:03.0 (NIC) PCIe link x8, capable of x16 (1 of 2 observations)")
        state = json.loads((node.state_dir / "watch.json").read_text())
        synthetic = {k.rsplit("/", 1)[1]: v[-1][1] for k, v in state["series"].items()
                     if k.startswith("pcie/0000:00:1f.6/")}
        assert synthetic == {"aer_correctable": 9, "aer_fatal": 28}
    else:
        assert pending["pcie/0000:01:00.0/speed"].startswith(
            "0000:01:00.0 (NIC) PCIe link 8 GT/s, capable of 16 GT/s")


def test_aer_totals_link_speeds_and_times() -> None:
    text = "RxErr 3\nBadTLP 1\nTOTAL_ERR_COR 4\n"
    assert watch.aer_total(text, "TOTAL_ERR_COR") == 4
    assert watch.aer_total(text, "TOTAL_ERR_FATAL") is None
    assert watch.link_speed("32.0 GT/s PCIe") == 32.0
    assert watch.link_speed("8 GT/s") == 8.0
    assert watch.link_speed("Unknown") is None
    assert watch.parse_until("1765000000") == 1765000000.0
    assert watch.parse_until("2025-12-06T05:46:40Z") == 1765000000.0
    assert watch.parse_until("2025-12-06T06:46:40+01:00") == 1765000000.0
    assert watch.parse_until("2025-12-06 05:46:40") == 1765000000.0
    with pytest.raises(ValueError, match="not a time"):
        watch.parse_until("next friday")


# ---- rate rules ------------------------------------------------------------------------------

def test_symbol_errors_over_the_rate_open_a_finding_naming_counter_rate_and_window(
        node: Node, capsys: pytest.CaptureFixture[str]) -> None:
    node.port(symbol_error=0)
    assert node.run(T0, capsys=capsys)[0] == 0
    node.port(symbol_error=30)
    assert node.run(T0 + 900, capsys=capsys)[0] == 0
    node.port(symbol_error=121)
    rc, report = node.run(T0 + 3600, capsys=capsys)
    assert rc == 1
    found = finding(report, "rdma/mlx5_0/1/symbol_error")
    assert found is not None and found["status"] == "open" and found["class"] == "fabric"
    assert found["message"] == ("mlx5_0/1 symbol_error +121 in 1h0m (121.0/h, limit 120/h "
                                "over 1h)")
    assert found["since"] == int(T0 + 3600)
    assert report["series"] > 0 and report["rising"][0]["counter"] == "symbol_error"


def test_one_increment_below_the_rate_is_nothing(node: Node,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    node.port(symbol_error=0)
    node.run(T0, capsys=capsys)
    node.port(symbol_error=120)
    rc, report = node.run(T0 + 3600, capsys=capsys)
    assert rc == 0 and report["findings"] == []


def test_a_rate_over_a_longer_span_than_the_window_is_averaged(
        node: Node, capsys: pytest.CaptureFixture[str]) -> None:
    """+200 over two hours is 100/h: under 120/h, though more than 120 in one reading."""
    node.port(symbol_error=0)
    node.run(T0, capsys=capsys)
    node.port(symbol_error=200)
    rc, report = node.run(T0 + 7200, capsys=capsys)
    assert rc == 0 and report["findings"] == []
    assert report["rising"][0]["rate_per_hour"] == 100


def test_a_quiet_counter_keeps_its_value_at_the_window_start(
        node: Node, capsys: pytest.CaptureFixture[str]) -> None:
    """Runs every 5 minutes for 3 hours, then 121 errors in the last 10 minutes: the
    increase is counted from the held value, over the window (not the whole series)."""
    node.port(symbol_error=7)
    for i in range(36):
        node.run(T0 + 300 * i, capsys=capsys)
    state = json.loads((node.state_dir / "watch.json").read_text())
    assert len(state["series"]["rdma/mlx5_0/1/symbol_error"]) == 2
    node.port(symbol_error=128)
    rc, report = node.run(T0 + 300 * 37, capsys=capsys)
    found = finding(report, "rdma/mlx5_0/1/symbol_error")
    assert rc == 1 and found is not None
    assert found["message"].startswith("mlx5_0/1 symbol_error +121 in 1h0m (121.0/h")


def test_a_counter_that_went_backwards_restarts_its_series(
        node: Node, capsys: pytest.CaptureFixture[str]) -> None:
    node.port(symbol_error=500)
    node.run(T0, capsys=capsys)
    node.port(symbol_error=100)  # reset (a driver reload, perfquery -R)
    rc, report = node.run(T0 + 600, capsys=capsys)
    assert rc == 0 and report["findings"] == []
    node.port(symbol_error=150)
    assert node.run(T0 + 1200, capsys=capsys)[0] == 0
    node.port(symbol_error=221)
    assert node.run(T0 + 1800, capsys=capsys)[0] == 1


def test_a_new_boot_restarts_every_series(node: Node, capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    node.port(symbol_error=0)
    node.run(T0, capsys=capsys)
    boot = node.root / "boot_id_2"
    boot.write_text("boot-2\n")
    monkeypatch.setattr(watch, "BOOT_ID_FILE", str(boot))
    node.port(symbol_error=500)
    rc, report = node.run(T0 + 600, capsys=capsys)
    assert rc == 0 and report["findings"] == []
    assert "new boot: counter series restarted" in report["notes"]


def test_roce_hw_counters_and_a_fatal_counter(node: Node,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    node.port(hw={"out_of_sequence": 0, "roce_slow_restart": 0})
    node.run(T0, capsys=capsys)
    node.port(hw={"out_of_sequence": 90_000, "roce_slow_restart": 10},
              excessive_buffer_overrun_errors=1)
    rc, report = node.run(T0 + 300, capsys=capsys)
    assert rc == 1
    assert finding(report, "rdma/mlx5_0/1/out_of_sequence")["message"] == (  # type: ignore[index]
        "mlx5_0/1 out_of_sequence +90000 in 5m0s (300.0/s, limit 100/s over 1s)")
    assert finding(report, "rdma/mlx5_0/1/roce_slow_restart") is None
    overrun = finding(report, "rdma/mlx5_0/1/excessive_buffer_overrun_errors")
    assert overrun is not None and "any increase opens" in overrun["message"]


# ---- flaps -----------------------------------------------------------------------------------

def test_a_single_flap_is_recorded_never_a_finding(node: Node,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    node.port(link_downed=0)
    node.run(T0, capsys=capsys)
    node.port(link_downed=1)
    rc, report = node.run(T0 + 300, capsys=capsys)
    assert rc == 0 and report["findings"] == []
    prom = (node.root / "textfile" / "gpufleet_watch.prom").read_text()
    assert 'gpufleet_watch_flaps{subject="mlx5_0/1",window="43200"} 1' in prom


def test_three_flaps_within_twelve_hours_open(node: Node,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    node.port(link_downed=0)
    node.run(T0, capsys=capsys)
    node.port(link_downed=1)
    node.run(T0 + 3600, capsys=capsys)
    node.port(up=False, link_downed=2)  # seen down: the second
    assert node.run(T0 + 7200, capsys=capsys)[0] == 0
    node.port(up=True)  # back up: the same down, counted once
    assert node.run(T0 + 7500, capsys=capsys)[0] == 0
    node.port(link_downed=3)
    rc, report = node.run(T0 + 40000, capsys=capsys)
    found = finding(report, "rdma/mlx5_0/1/flaps")
    assert rc == 1 and found is not None and found["status"] == "open"
    assert found["message"].startswith("mlx5_0/1 went down 3 times in 12h0m")
    # the first flap leaves the window: 2 within 12 h, clean again
    rc, report = node.run(T0 + 3600 + 43201, capsys=capsys)
    assert rc == 0 and report["findings"] == []


def test_downs_shorter_than_the_minimum_are_not_flaps(node: Node,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    node.port(link_downed=0)
    node.run(T0, capsys=capsys)
    for i in range(1, 5):  # up at both runs 10 s apart: each down lasted under 25 s
        node.port(link_downed=i)
        assert node.run(T0 + 10 * i, capsys=capsys)[0] == 0
    state = json.loads((node.state_dir / "watch.json").read_text())
    assert state["ports"]["mlx5_0/1"]["downs"] == []


def test_three_flaps_spread_over_more_than_twelve_hours_are_nothing(
        node: Node, capsys: pytest.CaptureFixture[str]) -> None:
    node.port(link_downed=0)
    node.run(T0, capsys=capsys)
    for i, hours in enumerate((1, 8, 14), start=1):
        node.port(link_downed=i)
        rc, report = node.run(T0 + hours * 3600, capsys=capsys)
        assert rc == 0 and report["findings"] == []


# ---- PCIe ------------------------------------------------------------------------------------

def test_a_link_below_its_width_is_pending_then_open_then_clears(
        node: Node, capsys: pytest.CaptureFixture[str]) -> None:
    node.pci(GPU, width=(8, 16))
    rc, report = node.run(T0, capsys=capsys)
    found = finding(report, f"pcie/{GPU}/width")
    assert rc == 0 and found is not None and found["status"] == "pending"
    assert found["message"] == (f"{GPU} (GPU) PCIe link x8, capable of x16 "
                                "(1 of 2 observations)")
    rc, report = node.run(T0 + 300, capsys=capsys)
    found = finding(report, f"pcie/{GPU}/width")
    assert rc == 1 and found is not None and found["status"] == "open"
    assert found["since"] == int(T0)
    node.pci(GPU, width=(16, 16))
    rc, report = node.run(T0 + 600, capsys=capsys)
    assert rc == 0 and report["findings"] == []


def test_a_pending_width_seen_once_drops_and_gpu_speed_is_not_judged(
        node: Node, capsys: pytest.CaptureFixture[str]) -> None:
    node.pci(GPU, width=(8, 16), speed=("2.5 GT/s PCIe", "32.0 GT/s PCIe"))
    node.pci(NIC, kind="NIC", speed=("16.0 GT/s PCIe", "32.0 GT/s PCIe"))
    rc, report = node.run(T0, capsys=capsys)
    assert {f["id"] for f in report["findings"]} == {f"pcie/{GPU}/width", f"pcie/{NIC}/speed"}
    node.pci(GPU, width=(16, 16), speed=("2.5 GT/s PCIe", "32.0 GT/s PCIe"))
    rc, report = node.run(T0 + 300, capsys=capsys)
    assert rc == 1 and [f["id"] for f in report["findings"]] == [f"pcie/{NIC}/speed"]
    assert report["findings"][0]["message"].startswith(
        f"{NIC} (NIC) PCIe link 16 GT/s, capable of 32 GT/s")


def test_an_aer_fatal_increase_opens_at_once(node: Node,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    node.pci(GPU)
    node.run(T0, capsys=capsys)
    node.pci(GPU, aer=(3, 0, 1))
    rc, report = node.run(T0 + 300, capsys=capsys)
    assert rc == 1 and [f["id"] for f in report["findings"]] == [f"pcie/{GPU}/aer_fatal"]
    assert report["findings"][0]["message"].startswith(f"{GPU} aer_fatal +1 in 5m0s")


# ---- NVLink and GPU memory -------------------------------------------------------------------

NVLINK = (FIXTURES / "h200x2" / "nvlink_e.txt").read_text()
SMI_Q = (FIXTURES / "h200x2" / "nvidia_smi_q.txt").read_text()


def test_nvlink_replay_errors_open(node: Node, capsys: pytest.CaptureFixture[str]) -> None:
    node.smi(NVLINK, SMI_Q)
    rc, report = node.run(T0, capsys=capsys)
    assert rc == 0 and report["findings"] == [] and report["series"] == 36 * 3 + 2 * 4
    node.smi(NVLINK.replace("Link 3: Replay Errors: 0", "Link 3: Replay Errors: 12", 1), SMI_Q)
    rc, report = node.run(T0 + 300, capsys=capsys)
    found = finding(report, "nvlink/gpu0/link3/replay_errors")
    assert rc == 1 and found is not None and found["class"] == "nvlink"
    assert found["message"].startswith("gpu0/link3 replay_errors +12 in 5m0s")


def test_nvlink_5_error_counters_open_and_fec_errors_do_not(
        node: Node, capsys: pytest.CaptureFixture[str]) -> None:
    lines = ("GPU 0: NVIDIA B200 (UUID: GPU-0)\n\t Link 0: FEC Errors - 0: {fec}\n"
             "\t Link 3: Effective Errors: 0\n\t Link 3: Effective BER: 1e-9\n"
             "\t Link 3: Symbol Errors: {symbol}\n")
    node.smi(lines.format(fec=17941761, symbol=0), "")
    node.run(T0, capsys=capsys)
    node.smi(lines.format(fec=27941761, symbol=0), "")
    assert node.run(T0 + 300, capsys=capsys)[0] == 0
    node.smi(lines.format(fec=27941761, symbol=2), "")
    rc, report = node.run(T0 + 600, capsys=capsys)
    assert rc == 1 and [f["id"] for f in report["findings"]] == [
        "nvlink/gpu0/link3/symbol_errors"]
    assert report["series"] == 2


def test_nvlink_crc_errors_under_their_rate_are_nothing(
        node: Node, capsys: pytest.CaptureFixture[str]) -> None:
    node.smi(NVLINK, SMI_Q)
    node.run(T0, capsys=capsys)
    node.smi(NVLINK.replace("Link 3: CRC Errors: 0", "Link 3: CRC Errors: 30000", 1), SMI_Q)
    assert node.run(T0 + 300, capsys=capsys)[0] == 0  # 100/s over 300 s is the limit


def test_uncorrectable_ecc_and_a_remapping_failure_open_at_once(
        node: Node, capsys: pytest.CaptureFixture[str]) -> None:
    node.smi(NVLINK, SMI_Q)
    node.run(T0, capsys=capsys)
    broken = SMI_Q.replace("            DRAM Uncorrectable                         : 0",
                           "            DRAM Uncorrectable                         : 1", 2)
    broken = broken.replace("        Remapping Failure Occurred                     : No",
                            "        Remapping Failure Occurred                     : Yes", 1)
    node.smi(NVLINK, broken)
    rc, report = node.run(T0 + 300, capsys=capsys)
    assert rc == 1
    assert {f["id"]: f["status"] for f in report["findings"]} == {
        "ecc/0000:00:06.0/ecc_uncorrectable": "open",
        "ecc/0000:00:06.0/remap_failure": "open"}


def test_a_full_retirement_table_opens_and_a_pending_retirement_waits(
        node: Node, capsys: pytest.CaptureFixture[str]) -> None:
    node.smi("", (WATCH_FIXTURES / "azure-nhc" / "bad_nvsmi8_output.txt").read_text())
    rc, report = node.run(T0, capsys=capsys)
    assert rc == 1
    full = {f"ecc/000{gpu}:00:00.0/retired_pages": "open" for gpu in (1, 2, 6, 8)}
    pending = {f"ecc/000{gpu}:00:00.0/retirement_pending": "pending" for gpu in (2, 4, 6, 8)}
    assert {f["id"]: f["status"] for f in report["findings"]} == full | pending
    assert finding(report, "ecc/0002:00:00.0/retired_pages")["message"] == (  # type: ignore[index]
        "GPU 0002:00:00.0 63 retired pages (limit 62)")
    rc, report = node.run(T0 + 300, capsys=capsys)
    assert finding(report, "ecc/0004:00:00.0/retirement_pending")["status"] == "open"  # type: ignore[index]


def test_a_hung_nvidia_smi_costs_its_sources_only(node: Node,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    node.port(symbol_error=0)
    node.smi(NVLINK, SMI_Q, delay=5)
    started = time.monotonic()
    rc, report = node.run(T0, capsys=capsys, budget_s=0.5)
    assert time.monotonic() - started < 3
    assert rc == 0 and len(report["notes"]) == 2
    for note, command in zip(report["notes"], ("nvlink -e", "-q -d ECC,ROW_REMAPPER,"
                                               "PAGE_RETIREMENT"), strict=True):
        assert re.fullmatch(rf"nvidia-smi {command}: timed out after 0\.\ds", note), note
    assert report["series"] == 7


def test_a_failing_nvidia_smi_is_a_note_and_keeps_its_findings(
        node: Node, capsys: pytest.CaptureFixture[str]) -> None:
    node.smi(NVLINK, SMI_Q)
    node.run(T0, capsys=capsys)
    node.smi(NVLINK.replace("Link 3: Replay Errors: 0", "Link 3: Replay Errors: 1", 1), SMI_Q)
    assert node.run(T0 + 300, capsys=capsys)[0] == 1
    stand_in(node.root / "bin", "nvidia-smi", "echo 'NVIDIA-SMI has failed'; exit 9\n")
    rc, report = node.run(T0 + 600, capsys=capsys)
    assert rc == 1 and finding(report, "nvlink/gpu0/link3/replay_errors") is not None
    assert report["notes"][0] == "nvidia-smi nvlink -e: exit status 9: NVIDIA-SMI has failed"


# ---- state -----------------------------------------------------------------------------------

def test_a_corrupt_state_costs_one_runs_history(node: Node,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    node.port(symbol_error=0)
    node.run(T0, capsys=capsys)
    (node.state_dir / "watch.json").write_text('{"version": 1, "series": {"rdma/')
    node.port(symbol_error=500)
    rc, report = node.run(T0 + 600, capsys=capsys)
    assert rc == 0 and report["findings"] == []
    assert report["notes"] == [f"state {node.state_dir / 'watch.json'} corrupt, read as "
                               "empty: this run's history is lost"]
    node.port(symbol_error=700)
    rc, report = node.run(T0 + 1200, capsys=capsys)
    assert rc == 1 and report["notes"] == []


def test_a_wrongly_shaped_state_is_read_part_by_part(node: Node,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    node.state_dir.mkdir()
    (node.state_dir / "watch.json").write_text(json.dumps({
        "version": 1, "boot_id": "boot-1", "series": {"rdma/x/1/symbol_error": [[1, "a"]]},
        "ports": [], "findings": {"bad id!": {}, "ok": {"status": "open"}}}))
    node.port()
    rc, report = node.run(T0, capsys=capsys)
    assert rc == 0 and report["findings"] == [] and report["notes"] == []


def test_the_state_stays_within_its_limit(node: Node,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    for device in range(8):
        node.port(f"mlx5_{device}")
    for i in range(12):
        for device in range(8):
            node.port(f"mlx5_{device}", symbol_error=i, port_rcv_errors=i)
        _, report = node.run(T0 + 300 * i, capsys=capsys, state_limit_bytes=4096)
    size = (node.state_dir / "watch.json").stat().st_size
    assert size <= 4096
    assert any(n.startswith("state over 4096 bytes: kept") for n in report["notes"])


def test_json_report_is_kept_and_text_lines_name_each_finding(
        node: Node, capsys: pytest.CaptureFixture[str]) -> None:
    node.pci(GPU, width=(8, 16))
    rc, report = node.run(T0, capsys=capsys)
    kept = json.loads((node.state_dir / "watch-report.json").read_text())
    assert kept == report
    assert set(report) >= {"version", "time", "findings", "notes", "series"}
    assert report["version"] == 1 and report["time"] == T0
    assert set(report["findings"][0]) == {"id", "class", "status", "since", "message",
                                          "silenced_until", "silence_reason"}
    rc, out = node.text(T0 + 300, capsys)
    lines = out.splitlines()
    assert rc == 1
    assert lines[0] == f"OPEN pcie/{GPU}/width: {GPU} (GPU) PCIe link x8, capable of x16"
    assert " 1 open, 0 pending, 0 silenced, 3 series in " in lines[-1]
    assert lines[-1].startswith("watch ")


# ---- silences --------------------------------------------------------------------------------

def test_a_silenced_finding_shows_and_does_not_fail_until_it_expires(
        node: Node, capsys: pytest.CaptureFixture[str]) -> None:
    ident = f"pcie/{GPU}/aer_fatal"
    node.pci(GPU)
    node.run(T0, capsys=capsys)
    node.pci(GPU, aer=(0, 0, 1))
    assert node.run(T0 + 300, capsys=capsys)[0] == 1
    assert node.command("silence", ident, "--until", str(T0 + 3600), "--reason",
                        "RMA 4471") == 0
    assert capsys.readouterr().out.startswith(f"silenced {ident} until 2025-12-06T06:46:40Z")
    rc, report = node.run(T0 + 600, capsys=capsys)
    assert rc == 0
    assert report["findings"] == [{
        "id": ident, "class": "pcie", "status": "silenced", "since": int(T0 + 300),
        "message": report["findings"][0]["message"], "silenced_until": T0 + 3600,
        "silence_reason": "RMA 4471"}]
    prom = (node.root / "textfile" / "gpufleet_watch.prom").read_text()
    assert f'gpufleet_watch_finding{{id="{ident}",class="pcie",status="silenced"}} 1' in prom
    rc, out = node.text(T0 + 900, capsys)
    assert rc == 0 and out.startswith(f"SILENCED {ident}: ")
    rc, report = node.run(T0 + 3601, capsys=capsys)  # expired: dropped from the file
    assert rc == 1 and report["findings"][0]["status"] == "open"
    assert json.loads((node.state_dir / "watch-silences.json").read_text()) == {}


def test_unsilence_and_bad_silences(node: Node, capsys: pytest.CaptureFixture[str]) -> None:
    assert node.command("silence", "rdma/mlx5_0/1/flaps", "--until",
                        "2099-01-01T00:00Z") == 0
    assert node.command("unsilence", "rdma/mlx5_0/1/flaps") == 0
    assert node.command("unsilence", "rdma/mlx5_0/1/flaps") == 0
    out = capsys.readouterr().out
    assert "unsilenced rdma/mlx5_0/1/flaps" in out and "was not silenced" in out
    assert node.command("silence", "bad id", "--until", "2099-01-01") == 2
    assert node.command("silence", "x/y", "--until", "someday") == 2
    err = capsys.readouterr().err
    assert "not a finding id" in err and "--until: not a time" in err


# ---- clearing --------------------------------------------------------------------------------

def test_a_reboot_does_not_clear_a_finding_before_a_clean_window(
        node: Node, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    node.pci(GPU)
    node.run(T0, capsys=capsys)
    node.pci(GPU, aer=(0, 0, 1))
    assert node.run(T0 + 300, capsys=capsys)[0] == 1
    boot = node.root / "boot_id_2"
    boot.write_text("boot-2\n")
    monkeypatch.setattr(watch, "BOOT_ID_FILE", str(boot))
    node.pci(GPU, aer=(0, 0, 0))  # the reboot cleared the device's AER counters
    rc, report = node.run(T0 + 900, capsys=capsys)
    assert rc == 1 and report["findings"][0]["id"] == f"pcie/{GPU}/aer_fatal"
    assert node.run(T0 + 900 + 43200, capsys=capsys)[0] == 1
    rc, report = node.run(T0 + 900 + 86400, capsys=capsys)
    assert rc == 0 and report["findings"] == []


def test_a_rate_finding_clears_after_a_clean_window(node: Node,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    node.port(symbol_error=0)
    node.run(T0, capsys=capsys)
    node.port(symbol_error=500)
    assert node.run(T0 + 600, capsys=capsys)[0] == 1
    assert node.run(T0 + 1800, capsys=capsys)[0] == 1  # the burst is still in the window
    rc, report = node.run(T0 + 600 + 3600, capsys=capsys)
    assert rc == 0 and report["findings"] == []


def test_clear_after_keeps_an_open_finding_through_a_clean_observation(
        node: Node, capsys: pytest.CaptureFixture[str]) -> None:
    node.config = {"rules": {"pcie_width": {"clear_after_s": 1800}}}
    node.pci(GPU, width=(8, 16))
    node.run(T0, capsys=capsys)
    node.run(T0 + 300, capsys=capsys)
    node.pci(GPU, width=(16, 16))
    assert node.run(T0 + 600, capsys=capsys)[0] == 1
    assert node.run(T0 + 300 + 1800, capsys=capsys)[0] == 0


# ---- textfile and configuration --------------------------------------------------------------

def test_the_textfile_passes_promtool(node: Node, capsys: pytest.CaptureFixture[str]) -> None:
    node.port(symbol_error=0, link_downed=0)
    node.port("mlx5_1", hw={"out_of_sequence": 0})
    node.pci(GPU, width=(8, 16))
    node.pci(NIC, kind="NIC")
    node.smi(NVLINK, SMI_Q)
    node.run(T0, capsys=capsys)
    node.port(symbol_error=400, link_downed=1)
    node.run(T0 + 300, capsys=capsys)
    path = node.root / "textfile" / "gpufleet_watch.prom"
    promtool(path)
    prom = path.read_text()
    assert 'gpufleet_watch_value{subject="mlx5_0/1",counter="symbol_error"} 400' in prom
    assert ('gpufleet_watch_rate_per_hour{subject="mlx5_0/1",counter="symbol_error",'
            'window="3600"} 400') in prom
    assert (f'gpufleet_watch_finding{{id="pcie/{GPU}/width",class="pcie",status="open"}} 1'
            in prom)
    assert "gpufleet_watch_last_run_timestamp_seconds 1765000300.000" in prom
    assert "gpufleet_watch_run_duration_seconds " in prom


@pytest.mark.parametrize(("config", "message"), [
    ({"colour": 1}, "unknown key 'colour'"),
    ({"budget_s": "6"}, "budget_s has a wrong type or value: '6'"),
    ({"state_dir": "relative"}, "state_dir has a wrong type or value"),
    ({"rules": {"symbol_errors": {}}}, "unknown key 'rules.symbol_errors'"),
    ({"rules": {"symbol_error": {"count": 3}}}, "unknown key 'rules.symbol_error.count'"),
    ({"rules": {"flaps": {"count": 0}}}, "rules.flaps.count has a wrong type or value: 0"),
    ({"rules": {"pcie_width": {"enabled": "no"}}}, "rules.pcie_width.enabled has a wrong"),
    ({"rules": []}, "rules has a wrong type or value"),
])
def test_a_bad_configuration_exits_2_with_one_line(
        node: Node, capsys: pytest.CaptureFixture[str], config: dict[str, Any],
        message: str) -> None:
    path = node.root / "bad.json"
    path.write_text(json.dumps(config))
    assert watch.main(["--config", str(path), "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and str(path) in captured.err and message in captured.err


def test_invalid_json_configuration_names_the_line(node: Node,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    path = node.root / "bad.json"
    path.write_text('{\n "budget_s": 6,\n}')
    assert watch.main(["--config", str(path)]) == 2
    assert f"{path} line 3: not valid JSON" in capsys.readouterr().err


def test_rules_are_overridden_and_underscore_keys_ignored(
        node: Node, capsys: pytest.CaptureFixture[str]) -> None:
    node.config = {"_comment": "site", "rules": {"_note": "x", "symbol_error": {
        "limit": 10, "window_s": 3600}, "pcie_width": {"enabled": False}}}
    node.port(symbol_error=0)
    node.pci(GPU, width=(8, 16))
    node.run(T0, capsys=capsys)
    node.port(symbol_error=11)
    rc, report = node.run(T0 + 3600, capsys=capsys)
    assert rc == 1 and [f["id"] for f in report["findings"]] == ["rdma/mlx5_0/1/symbol_error"]
    assert report["findings"][0]["message"].endswith("(11.0/h, limit 10/h over 1h)")


def test_the_program_runs_as_a_script(node: Node) -> None:
    node.port()
    proc = subprocess.run([sys.executable, str(PROGRAM), "--config", str(node.write_config()),
                           "--json"], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["series"] == 7


# ---- one run at a time -----------------------------------------------------------------------

HOLD = ("import fcntl, os, sys, time\n"
        "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "print('held', flush=True)\n"
        "time.sleep(float(sys.argv[2]))\n")


@contextlib.contextmanager
def held(node: Node, seconds: float = 60) -> Iterator[subprocess.Popen[str]]:
    """Another process holding the watch's lock (as a run of the program does) for
    ``seconds``, or until the block ends."""
    node.state_dir.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(node.state_dir / "watch.lock"),
                             str(seconds)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "held\n"
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=30)


def locked(path: Path) -> bool:
    """Whether a process holds the lock file (tried without waiting, let go at once)."""
    if not path.exists():
        return False
    with path.open("a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(fh, fcntl.LOCK_UN)
        return False


def test_a_run_that_finds_another_in_progress_writes_nothing_and_repeats_the_last_verdict(
        node: Node, capsys: pytest.CaptureFixture[str]) -> None:
    node.port(symbol_error=0)
    node.run(T0, capsys=capsys)
    node.port(symbol_error=500)
    assert node.run(T0 + 600, capsys=capsys)[0] == 1
    kept = {name: (node.state_dir / name).read_bytes()
            for name in ("watch.json", "watch-report.json")}
    node.port(symbol_error=5000)
    node.config = {"budget_s": 0.6}
    with held(node):
        started = time.monotonic()
        rc, report = node.run(T0 + 1200, capsys=capsys)
        waited = time.monotonic() - started
        rc_text, text = node.text(T0 + 1200, capsys=capsys)
    assert 0.3 <= waited < 5, "it waits half the budget, no longer"
    assert rc == 1 and rc_text == 1, "the last report had an open finding: the same verdict"
    assert report["time"] == T0 + 600
    assert report["notes"][0].startswith("another run in progress (it held ")
    assert report["notes"][0].endswith("for the 0.3s waited): nothing observed; this is the "
                                       "last report")
    assert [f["id"] for f in report["findings"]] == ["rdma/mlx5_0/1/symbol_error"]
    assert "+500 in 10m0s" in report["findings"][0]["message"]
    assert "NOTE another run in progress" in text and "OPEN rdma/mlx5_0/1/symbol_error" in text
    assert kept == {name: (node.state_dir / name).read_bytes() for name in kept}
    rc, report = node.run(T0 + 1800, capsys=capsys)
    assert rc == 1 and "+5000" in report["findings"][0]["message"]
    assert not any(n.startswith("another run") for n in report["notes"])


def test_a_busy_run_without_an_earlier_report_passes_saying_so(
        node: Node, capsys: pytest.CaptureFixture[str]) -> None:
    node.port(symbol_error=0)
    node.config = {"budget_s": 0.2}
    with held(node):
        rc, report = node.run(T0, capsys=capsys)
        assert node.command("silence", "rdma/mlx5_0/1/flaps", "--until", "2099-01-01") == 2
        assert "another run in progress" in capsys.readouterr().err
        assert sorted(p.name for p in node.state_dir.iterdir()) == ["watch.lock"]
        (node.state_dir / "watch-report.json").write_text('{"version": 1, "findings": [7]}')
        rc_shaped, shaped = node.run(T0, capsys=capsys)
    assert rc == 0 and report["findings"] == [] and report["series"] == 0
    assert report["notes"] == [
        "another run in progress (it held " + str(node.state_dir / "watch.lock") + " for the "
        f"0.1s waited): nothing observed; no last report ({node.state_dir}/watch-report.json "
        "absent)"]
    assert rc_shaped == 0 and shaped["findings"] == []
    assert shaped["notes"][0].endswith("watch-report.json not a report)")


def test_a_run_waits_for_one_that_lets_go_within_its_share_of_the_budget(
        node: Node, capsys: pytest.CaptureFixture[str]) -> None:
    node.port(symbol_error=0)
    with held(node, seconds=0.5):
        rc, report = node.run(T0, capsys=capsys, budget_s=20)
    assert rc == 0 and report["series"] == 7 and report["notes"] == []


def _program(node: Node, now: float) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(PROGRAM), "--config",
                             str(node.root / "watch.json"), "--json", "--now", str(now)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize(("budget", "second_runs"), [(4.0, False), (12.0, True)])
def test_two_runs_at_once_one_waits_for_the_other_or_writes_nothing(
        node: Node, budget: float, second_runs: bool) -> None:
    """The health check and the timer start the program together; the first holds the lock
    through a slow nvidia-smi (4 s, or its budget). The second waits half its budget: 2 s
    is too short, and it answers with a note and writes nothing; 6 s is enough, and it
    observes after the first, whose samples it keeps."""
    node.port(symbol_error=0)
    node.pci(GPU)
    node.smi(delay=4)
    node.write_config(budget_s=budget)
    first = _program(node, T0)
    lock = node.state_dir / "watch.lock"
    deadline = time.monotonic() + 30
    while not locked(lock):
        assert first.poll() is None and time.monotonic() < deadline
        time.sleep(0.02)
    second = _program(node, T0 + 60)
    out_second, err_second = second.communicate(timeout=60)
    out_first, err_first = first.communicate(timeout=60)
    assert (first.returncode, second.returncode) == (0, 0), err_first + err_second
    report_first, report_second = json.loads(out_first), json.loads(out_second)
    assert not any("another run" in n for n in report_first["notes"])
    kept = json.loads((node.state_dir / "watch-report.json").read_text())
    state = json.loads((node.state_dir / "watch.json").read_text())
    times = {sample[0] for sample in state["series"]["rdma/mlx5_0/1/symbol_error"]}
    if second_runs:
        assert not any("another run" in n for n in report_second["notes"])
        assert kept["time"] == T0 + 60 and times == {T0, T0 + 60}
    else:
        assert report_second["notes"][0].startswith("another run in progress")
        assert report_second["findings"] == [] and report_second["series"] == 0
        assert kept["time"] == T0 and times == {T0}


# ---- the report kept as a fixture for the controller's parser --------------------------------

RISING_FIXTURE = FIXTURES / "watch" / "report_program_rising.json"


def rising_node_report(node: Node, capsys: pytest.CaptureFixture[str]) -> str:
    """The recipe of tests/fixtures/watch/report_program_rising.json: a node with two IB
    ports, a GPU, a NIC and the H200 pair's nvidia-smi outputs, observed every 20 minutes
    for an hour while its counters move; the report file the last run keeps."""
    moves = [(0, 0, 0, 0, 0), (40, 10, 5, 1, 0), (90, 20, 10, 2, 2), (200, 30, 15, 4, 2)]
    for i, (symbols, other, sequence, aer, replay) in enumerate(moves):
        node.port("mlx5_0", symbol_error=symbols, hw={"out_of_sequence": sequence})
        node.port("mlx5_1", symbol_error=other)
        node.pci(GPU, aer=(aer, 0, 0))
        node.pci(NIC, kind="NIC", width=(16, 16) if i < 3 else (8, 16))
        node.smi(NVLINK.replace("Link 3: Replay Errors: 0", f"Link 3: Replay Errors: {replay}",
                                1), SMI_Q)
        node.run(T0 + 1200 * i, capsys=capsys)
    return (node.state_dir / "watch-report.json").read_text()


def test_the_rising_report_fixture_is_what_the_program_writes(
        node: Node, capsys: pytest.CaptureFixture[str]) -> None:
    written = rising_node_report(node, capsys)
    assert written == RISING_FIXTURE.read_text(), (
        f"the program's report changed; the new one (for {RISING_FIXTURE}):\n{written}")
    report = json.loads(written)
    assert [(f["id"], f["status"]) for f in report["findings"]] == [
        ("nvlink/gpu0/link3/replay_errors", "open"), ("rdma/mlx5_0/1/symbol_error", "open"),
        (f"pcie/{NIC}/width", "pending")]
    assert [(r["subject"], r["counter"], r["increase"], r["rate_per_hour"], r["limit"])
            for r in report["rising"]] == [
        ("mlx5_0/1", "symbol_error", 200, 200, 120), ("mlx5_1/1", "symbol_error", 30, 30, 120),
        ("mlx5_0/1", "out_of_sequence", 5, 15, 100), (GPU, "aer_correctable", 2, 6, 8),
        ("gpu0/link3", "replay_errors", 2, 2, None)], "windows shorter than the 20 minutes " \
        "between runs: the increase since the last run, at its average rate"
