"""gpufleet-watch against its budget on a full node: 8 GPUs with 18 NVLinks each and 8 HCAs.

Builds a sysfs tree (8 InfiniBand HCAs mlx5_0..7 with the full counters/ and hw_counters/
sets an mlx5 port has, 8 GPUs' and 8 NICs' PCI functions with AER files among 200 other PCI
devices) and a stand-in nvidia-smi printing ``nvlink -e`` for 8 GPUs x 18 links and the
8-GPU ``-q -d ECC,ROW_REMAPPER,PAGE_RETIREMENT``, both in the layout of the real H200
captures (tests/fixtures/h200x2). Runs the program N times as the health check does (a new
Python each time, ``--json``, five minutes apart by --now) in two scenarios:

  quiet    the counters stand still (a healthy node: each series keeps its two ends)
  moving   every watched counter rises at every run (the most samples every series keeps,
           and findings open)

and reports each scenario's median and worst wall time, the program's own time, and the
sizes of the state, the report and the textfile. Without root, from the project root:

    .venv/bin/python bench/watch_budget.py --runs 50

``--smi PATH`` and ``--sys-root /sys`` time a real node's nvidia-smi and sysfs instead.
Results: bench/results/watch-budget.json and .md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PROGRAM = ROOT / "gpufleet" / "node" / "watch.py"
CAPTURE = ROOT / "tests" / "fixtures" / "h200x2" / "nvidia_smi_q.txt"
RESULTS = ROOT / "bench" / "results"
GPUS = 8
LINKS = 18
HCAS = 8
OTHER_PCI = 200
BUDGET_S = 1.0  # the watch's own share of the health check's 9 s (3 s of it reserved)
T0 = 1_765_000_000
IB_COUNTERS = (
    "VL15_dropped", "excessive_buffer_overrun_errors", "link_downed", "link_error_recovery",
    "local_link_integrity_errors", "multicast_rcv_packets", "multicast_xmit_packets",
    "port_rcv_constraint_errors", "port_rcv_data", "port_rcv_errors", "port_rcv_packets",
    "port_rcv_remote_physical_errors", "port_rcv_switch_relay_errors",
    "port_xmit_constraint_errors", "port_xmit_data", "port_xmit_discards",
    "port_xmit_packets", "port_xmit_wait", "symbol_error", "unicast_rcv_packets",
    "unicast_xmit_packets")
HW_COUNTERS = (
    "duplicate_request", "implied_nak_seq_err", "lifespan", "local_ack_timeout_err",
    "np_cnp_sent", "np_ecn_marked_roce_packets", "out_of_buffer", "out_of_sequence",
    "packet_seq_err", "req_cqe_error", "req_cqe_flush_error", "req_remote_access_errors",
    "req_remote_invalid_request", "resp_cqe_error", "resp_cqe_flush_error",
    "resp_local_length_error", "resp_remote_access_errors", "rnr_nak_retry_err",
    "roce_adp_retrans", "roce_adp_retrans_to", "roce_slow_restart", "roce_slow_restart_cnps",
    "roce_slow_restart_trans", "rp_cnp_handled", "rp_cnp_ignored", "rx_atomic_requests",
    "rx_dct_connect", "rx_icrc_encapsulated", "rx_read_requests", "rx_write_requests")
WATCHED = ("symbol_error", "link_error_recovery", "port_rcv_errors", "link_downed",
           "excessive_buffer_overrun_errors", "local_link_integrity_errors",
           "port_xmit_discards", "out_of_sequence", "packet_seq_err", "roce_slow_restart")
AER = {"correctable": ("RxErr", "BadTLP", "BadDLLP", "Rollover", "Timeout", "NonFatalErr",
                       "CorrIntErr", "HeaderOF", "TOTAL_ERR_COR"),
       "nonfatal": ("Undefined", "DLP", "SDES", "TLP", "FCP", "CmpltTO", "CmpltAbrt",
                    "UnxCmplt", "RxOF", "MalfTLP", "ECRC", "UnsupReq", "ACSViol",
                    "UncorrIntErr", "BlockedTLP", "AtomicOpBlocked", "TLPBlockedErr",
                    "PoisonTLPBlocked", "TOTAL_ERR_NONFATAL"),
       "fatal": ("Undefined", "DLP", "SDES", "TLP", "FCP", "CmpltTO", "CmpltAbrt", "UnxCmplt",
                 "RxOF", "MalfTLP", "ECRC", "UnsupReq", "ACSViol", "UncorrIntErr",
                 "BlockedTLP", "AtomicOpBlocked", "TLPBlockedErr", "PoisonTLPBlocked",
                 "TOTAL_ERR_FATAL")}
GPU_BUS = ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")
NIC_BUS = ("19", "2b", "3b", "5e", "9b", "ac", "bb", "dc")


def gpu_sections() -> str:
    """The ECC, Retired Pages and Remapped Rows sections of one GPU of the real capture:
    what ``-q -d ECC,ROW_REMAPPER,PAGE_RETIREMENT`` prints of it."""
    text = CAPTURE.read_text().split("GPU 00000000:00:07.0")[0]
    lines, keep = [], False
    for line in text.splitlines():
        if re.match(r"^    \S", line):
            keep = line.strip() in ("ECC Mode", "ECC Errors", "Retired Pages", "Remapped Rows")
        if keep:
            lines.append(line)
    return "\n".join(lines) + "\n"


def smi_q(moved: int) -> str:
    sections = gpu_sections().replace(
        "            DRAM Correctable                           : 0",
        f"            DRAM Correctable                           : {moved}")
    head = ("\n==============NVSMI LOG==============\n\n"
            "Timestamp                                              : Mon Dec  7 05:00:00 2026\n"
            "Driver Version                                         : 580.159.04\n"
            "CUDA Version                                           : 13.0\n\n"
            f"Attached GPUs                                          : {GPUS}\n")
    return head + "".join(f"GPU 00000000:{bus.upper()}:00.0\n{sections}\n" for bus in GPU_BUS)


def nvlink_e(moved: int) -> str:
    out = []
    for gpu in range(GPUS):
        out.append(f"GPU {gpu}: NVIDIA H200 (UUID: GPU-{gpu:08x}-b792-6c46-c09e-1b0f8a6947c6)")
        for link in range(LINKS):
            out += [f"\t Link {link}: Replay Errors: {moved}",
                    f"\t Link {link}: Recovery Errors: {moved}",
                    f"\t Link {link}: CRC Errors: {moved}", ""]
    return "\n".join(out) + "\n"


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def build_sys(root: Path) -> None:
    devices = root / "bus" / "pci" / "devices"
    for i in range(OTHER_PCI):
        base = devices / f"0000:{i // 32:02x}:{i % 32:02x}.0"
        write(base / "vendor", "0x8086\n")
        write(base / "class", "0x060400\n")
    for kind, buses, vendor, klass in (("gpu", GPU_BUS, "0x10de", "0x030200"),
                                       ("nic", NIC_BUS, "0x15b3", "0x020700")):
        for i, bus in enumerate(buses):
            base = devices / f"0000:{bus}:00.0"
            write(base / "vendor", vendor + "\n")
            write(base / "class", klass + "\n")
            for name in ("current_link_width", "max_link_width"):
                write(base / name, "16\n")
            for name in ("current_link_speed", "max_link_speed"):
                write(base / name, "32.0 GT/s PCIe\n")
            if kind == "nic":
                (base / "infiniband" / f"mlx5_{i}").mkdir(parents=True)
    move_sys(root, 0)


def move_sys(root: Path, moved: int) -> None:
    """Every counter the watch reads at ``moved``; the others at a traffic-like value."""
    for hca in range(HCAS):
        port = root / "class" / "infiniband" / f"mlx5_{hca}" / "ports" / "1"
        for group, names in (("counters", IB_COUNTERS), ("hw_counters", HW_COUNTERS)):
            for name in names:
                write(port / group / name, f"{moved if name in WATCHED else 10**9 + moved}\n")
        write(port / "state", "4: ACTIVE\n")
        write(port / "phys_state", "5: LinkUp\n")
        write(port / "rate", "400 Gb/sec (4X NDR)\n")
        write(port / "link_layer", "InfiniBand\n")
    devices = root / "bus" / "pci" / "devices"
    for bus in GPU_BUS + NIC_BUS:
        for name, lines in AER.items():
            value = moved if name == "correctable" else 0
            write(devices / f"0000:{bus}:00.0" / f"aer_dev_{name}",
                  "".join(f"{line} {value if line.startswith('TOTAL') or line == lines[0] else 0}\n"
                          for line in lines))


def stand_in(root: Path, moved: int) -> Path:
    write(root / "smi" / "nvlink.txt", nvlink_e(moved))
    write(root / "smi" / "q.txt", smi_q(moved))
    tool = root / "bin" / "nvidia-smi"
    write(tool, f'#!/bin/sh\nif [ "$1" = nvlink ]; then cat {root}/smi/nvlink.txt; '
                f"else cat {root}/smi/q.txt; fi\n")
    tool.chmod(0o755)
    return tool


def scenario(name: str, runs: int, python: str, smi: str | None,
             sys_root: str | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="watch-budget-") as tmp:
        root = Path(tmp)
        if sys_root is None:
            build_sys(root / "sys")
        tool = smi or str(stand_in(root, 0))
        config = root / "watch.json"
        config.write_text(json.dumps({
            "state_dir": str(root / "state"), "textfile_dir": str(root / "textfile"),
            "sys_root": sys_root or str(root / "sys"), "nvidia_smi": tool}))
        walls, owns, opened = [], [], 0
        for run in range(runs):
            if name == "moving" and run:
                if sys_root is None:
                    move_sys(root / "sys", run)
                if smi is None:
                    stand_in(root, run)
            started = time.perf_counter()
            proc = subprocess.run([python, str(PROGRAM), "--config", str(config),
                                   "--now", str(T0 + 300 * run)], capture_output=True,
                                  text=True, timeout=120, check=False)
            walls.append(time.perf_counter() - started)
            match = re.search(r"(\d+) open, .* (\d+) series in [0-9.]+s$", proc.stdout.strip())
            if proc.returncode not in (0, 1) or not match:
                raise SystemExit(f"run {run} failed ({proc.returncode}): {proc.stdout}"
                                 f"{proc.stderr}")
            prom = (root / "textfile" / "gpufleet_watch.prom").read_text()
            owns.append(float(re.findall(r"^gpufleet_watch_run_duration_seconds (\S+)$", prom,
                                         re.M)[0]))
            opened = int(match.group(1))
            series = int(match.group(2))
        sizes = {f: (root / "state" / f).stat().st_size
                 for f in ("watch.json", "watch-report.json")}
        sizes["gpufleet_watch.prom"] = (root / "textfile" / "gpufleet_watch.prom").stat().st_size
    return {"scenario": name, "runs": runs, "series": series, "open_findings": opened,
            "wall_median_s": statistics.median(walls), "wall_max_s": max(walls),
            "own_median_s": statistics.median(owns), "own_max_s": max(owns),
            "bytes": sizes}


def markdown(results: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [f"gpufleet-watch budget ({meta['python']}, {meta['machine']}, {meta['cpus']} CPUs, "
             f"load average {meta['load_average'][0]} before, {meta['load_average'][1]} "
             f"after); {meta['nvidia_smi']}, {meta['sys']}", "",
             "| scenario | runs | series | open | wall median | wall worst | own median | "
             "own worst | state | report | textfile |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        b = r["bytes"]
        lines.append(f"| {r['scenario']} | {r['runs']} | {r['series']} | {r['open_findings']} "
                     f"| {r['wall_median_s']:.3f} s | {r['wall_max_s']:.3f} s | "
                     f"{r['own_median_s']:.3f} s | {r['own_max_s']:.3f} s | "
                     f"{b['watch.json'] / 1024:.1f} KiB | {b['watch-report.json'] / 1024:.1f} KiB"
                     f" | {b['gpufleet_watch.prom'] / 1024:.1f} KiB |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=50, help="runs per scenario (default 50)")
    parser.add_argument("--python", default=sys.executable, help="the Python that runs it")
    parser.add_argument("--smi", help="a real nvidia-smi instead of the stand-in")
    parser.add_argument("--sys-root", help="a real sysfs (/sys) instead of the fixture tree")
    parser.add_argument("--results", type=Path, default=RESULTS / "watch-budget.json")
    args = parser.parse_args(argv)
    load = [os.getloadavg()[0]]
    results = [scenario(name, args.runs, args.python, args.smi, args.sys_root)
               for name in ("quiet", "moving")]
    load.append(os.getloadavg()[0])
    python = subprocess.run([args.python, "--version"], capture_output=True, text=True,
                            check=False).stdout.strip()
    meta = {"python": python, "machine": subprocess.run(
                ["uname", "-srm"], capture_output=True, text=True, check=False).stdout.strip(),
            "nvidia_smi": args.smi or f"stand-in nvidia-smi ({GPUS} GPUs x {LINKS} links)",
            "sys": args.sys_root or f"fixture sysfs ({HCAS} HCAs, {GPUS} GPUs, {HCAS} NICs, "
                                     f"{OTHER_PCI} other PCI devices)",
            "budget_s": BUDGET_S, "cpus": os.cpu_count(),
            "load_average": [round(x, 1) for x in load]}
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps({"meta": meta, "results": results}, indent=1) + "\n")
    text = markdown(results, meta)
    args.results.with_suffix(".md").write_text(text)
    print(text, end="")
    worst = max(r["own_max_s"] for r in results)
    print(f"worst own time {worst:.3f} s of a {BUDGET_S:g} s budget: "
          + ("within" if worst < BUDGET_S else "OVER"))
    return 0 if worst < BUDGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
