#!/usr/bin/python3
"""gpufleet-watch: the node's standing watch over its fabric, NVLink, PCIe and GPU memory
counters between gpufleet's runs.

Runs on the node with the standard library only (no gpufleet install), from the health
check's ``watch`` check, a systemd timer or cron. One observation reads every source,
appends what it read to the state kept between runs, judges every rule, writes the state,
the report and the node_exporter textfile, and prints:

  sources   RDMA ports       <sys_root>/class/infiniband/<dev>/ports/<n>/{counters,
                             hw_counters}/<name>, state, phys_state
            PCIe             <sys_root>/bus/pci/devices/*: NVIDIA GPUs and Mellanox NICs'
                             aer_dev_{correctable,nonfatal,fatal} and link width and speed
            NVLink           nvidia-smi nvlink -e
            GPU memory       nvidia-smi -q -d ECC,ROW_REMAPPER,PAGE_RETIREMENT
  rules     rate             a counter's increase over a window above a limit (RULES)
            increase         any increase of a counter (kept open for the rule's window)
            flaps            a port's downs (link_downed, observed state) within a window
            state, level     a condition (a link below its width or speed, a pending or
                             failed remapping) or a level seen ``confirm`` times in a row

A finding is pending until confirmed (rate, increase and flap rules confirm over their
window; state and level rules after ``confirm`` consecutive observations), then open; an
open finding clears once its rule finds it clean again and ``clear_after_s`` has passed
since the last observation that found it. An operator silences a finding until a time
(``gpufleet-watch silence ID --until TIME``): it is reported as silenced and no longer
makes the exit status 1.

State (``state_dir``): watch.json (the series, at most ``state_limit_bytes``; a corrupt or
oversized one is read as empty and replaced, costing one run's history), watch-report.json
(the last --json report), watch-silences.json, and watch.lock: one run at a time (a run
that finds another in progress past half its budget writes nothing and prints the last
report with a note). Exit status: 0 no open finding, 1 an open finding (a run that found
another in progress: the last report's), 2 a bad configuration. The contract is
docs/watch.md.
"""

from __future__ import annotations

import argparse
import calendar
import contextlib
import fcntl
import json
import os
import re
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

CONFIG = "/etc/gpufleet/watch.json"
DEFAULTS: dict[str, Any] = {
    "state_dir": "/var/lib/gpufleet",
    "textfile_dir": None,
    "sys_root": "/sys",
    "nvidia_smi": "nvidia-smi",
    "budget_s": 6.0,
    "state_limit_bytes": 1048576,
    "rules": {},
}
STATE_FILE = "watch.json"
REPORT_FILE = "watch-report.json"
SILENCES_FILE = "watch-silences.json"
LOCK_FILE = "watch.lock"
TEXTFILE = "gpufleet_watch.prom"
BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
VERSION = 1
STATE_VERSION = 1
OUTPUT_LIMIT = 4 * 1024 * 1024  # bytes a command may print; more is an unreadable source
FILE_LIMIT = 4096  # bytes read of one sysfs file
SILENCES_LIMIT = 262144
REPORT_LIMIT = 1 << 20  # bytes of the last report a run that found another in progress reads
MOST_SAMPLES = 24  # per series, spaced so that the rule's window is covered
MOST_DOWNS = 64  # recorded downs per port
MESSAGE_LIMIT = 150
RISING_MOST = 64  # rising counters named in the report
KILL_GRACE_S = 0.5
LOCK_SHARE = 0.5  # of budget_s a run waits for another run to finish; the rest is its own
LOCK_POLL_S = 0.05
BUSY = "another run in progress"
EXIT_OPEN = 1
EXIT_USAGE = 2
SOURCES = ("rdma", "pcie", "nvlink", "ecc")
CLASS_OF = {"rdma": "fabric", "pcie": "pcie", "nvlink": "nvlink", "ecc": "ecc"}
KINDS = ("rate", "increase", "flaps", "state", "level")
PARAMS = {
    "rate": ("enabled", "limit", "window_s", "clear_after_s"),
    "increase": ("enabled", "window_s", "clear_after_s"),
    "flaps": ("enabled", "count", "window_s", "min_down_s", "clear_after_s"),
    "state": ("enabled", "confirm", "clear_after_s"),
    "level": ("enabled", "limit", "confirm", "clear_after_s"),
}
_ID = re.compile(r"^[A-Za-z0-9_./:-]{1,200}$")
_NAME = re.compile(r"[^a-z0-9]+")
_GPU_LINE = re.compile(r"^GPU (\d+):")
_LINK_LINE = re.compile(r"^\s*Link (\d+): (.+?)\s*:\s*(\S+)\s*$")
_QGPU = re.compile(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\s*$")
_DIGITS = re.compile(r"(?<=[A-Za-z_])(\d+)")
_SPEED = re.compile(r"^\s*([0-9.]+)\s*GT/s")


@dataclass(frozen=True)
class Rule:
    """One rule's defaults: what it watches and judges, and the source of its threshold."""

    name: str
    source: str
    kind: str
    counters: tuple[str, ...]
    limit: float = 0.0
    window_s: float = 0.0
    count: int = 0
    min_down_s: float = 0.0
    confirm: int = 1
    clear_after_s: float = 0.0
    enabled: bool = True
    anchor: str = ""


NVSENTINEL = ("NVIDIA NVSentinel's NIC health monitor design "
              "(docs/nic-health-monitor/link-counter-detection.md): ")
RULES = (
    Rule("symbol_error", "rdma", "rate", ("symbol_error",), limit=120, window_s=3600,
         anchor="the IBTA bit error rate of 1e-12 as at most 120 symbol errors an hour "
                "(Oracle's 'Determine Which Links Are Experiencing Significant Errors', as "
                "NVIDIA NVSentinel's NIC health monitor design cites it)"),
    Rule("link_error_recovery", "rdma", "rate", ("link_error_recovery",), limit=5,
         window_s=60, anchor=NVSENTINEL + "more than 5 a minute"),
    Rule("port_rcv_errors", "rdma", "rate", ("port_rcv_errors",), limit=10, window_s=1,
         anchor=NVSENTINEL + "more than 10 a second"),
    Rule("excessive_buffer_overrun_errors", "rdma", "increase",
         ("excessive_buffer_overrun_errors",), window_s=3600,
         anchor=NVSENTINEL + "any increase is fatal"),
    Rule("local_link_integrity_errors", "rdma", "increase", ("local_link_integrity_errors",),
         window_s=3600, anchor=NVSENTINEL + "any increase is fatal"),
    Rule("port_xmit_discards", "rdma", "rate", ("port_xmit_discards",), limit=100, window_s=1,
         anchor=NVSENTINEL + "more than 100 a second"),
    Rule("out_of_sequence", "rdma", "rate", ("out_of_sequence",), limit=100, window_s=1,
         anchor=NVSENTINEL + "more than 100 a second"),
    Rule("packet_seq_err", "rdma", "rate", ("packet_seq_err",), limit=100, window_s=1,
         anchor="no anchor sets one: NVSentinel's out_of_sequence limit (more than 100 a "
                "second), for the same sequence errors as the requester counts them"),
    Rule("roce_slow_restart", "rdma", "rate", ("roce_slow_restart",), limit=10, window_s=1,
         anchor=NVSENTINEL + "more than 10 a second"),
    Rule("flaps", "rdma", "flaps", ("link_downed",), count=3, window_s=43200, min_down_s=25,
         anchor="GPUd (components/accelerator/nvidia/infiniband/store/scan_flaps.go): 3 "
                "flaps in the last 12 hours, each down at least 25 s"),
    Rule("aer_correctable", "pcie", "rate", ("aer_correctable",), limit=8, window_s=60,
         anchor="NVIDIA DCGM's health watch: more than 8 PCIe replays a minute "
                "(DCGM_LIMIT_MAX_PCIREPLAY_RATE), applied to the AER correctable total, "
                "whose BadTLP, BadDLLP, Rollover and Timeout entries are what replays"),
    Rule("aer_nonfatal", "pcie", "increase", ("aer_nonfatal",), window_s=3600,
         anchor="no anchor sets a limit: a non-fatal uncorrectable error lost a transaction "
                "(the Linux PCIe AER howto); any increase"),
    Rule("aer_fatal", "pcie", "increase", ("aer_fatal",), window_s=86400,
         anchor="a fatal uncorrectable error leaves the link unreliable (the Linux PCIe AER "
                "howto): any increase"),
    Rule("pcie_width", "pcie", "state", ("width",), confirm=2,
         anchor=NVSENTINEL.replace("link-counter", "link-state") + "a link below its "
                "capability is degraded; width for GPUs and NICs"),
    Rule("pcie_speed", "pcie", "state", ("speed",), confirm=2,
         anchor=NVSENTINEL.replace("link-counter", "link-state") + "speed degradation; "
                "NICs only (GPUs lower their PCIe speed at idle)"),
    Rule("nvlink_replay", "nvlink", "increase", ("replay_errors",), window_s=3600,
         anchor="NVIDIA DCGM's health watch (any NVLink replay error fails) and Meta GCM "
                "(check-dcgmi nvlink: --replay_error_threshold 0)"),
    Rule("nvlink_recovery", "nvlink", "increase", ("recovery_errors",), window_s=3600,
         anchor="NVIDIA DCGM's health watch (any NVLink recovery error fails) and Meta GCM "
                "(--recovery_error_threshold 0)"),
    Rule("nvlink_crc", "nvlink", "rate",
         ("crc_errors", "crc_flit_errors", "crc_data_errors", "flit_crc_errors",
          "data_crc_errors"), limit=100, window_s=1,
         anchor="NVIDIA DCGM's health watch: NVLink CRC errors fail at 100 a second "
                "(DCGM_LIMIT_MAX_NVLINK_CRC_ERROR; fewer only warn)"),
    Rule("nvlink5_errors", "nvlink", "increase",
         ("rx_errors", "rx_remote_errors", "local_link_integrity_errors",
          "link_recovery_failed_events", "effective_errors", "symbol_errors"), window_s=3600,
         anchor="GoogleCloudPlatform cluster-toolkit's dcgm-healthcheck (GB200, GB300): any "
                "NVLink 5 error counter of nvidia-smi nvlink -e that is not zero fails, FEC "
                "errors aside"),
    Rule("ecc_correctable", "ecc", "rate", ("ecc_correctable",), limit=10, window_s=60,
         enabled=False,
         anchor="no anchor publishes a correctable (single-bit) error rate: DCGM's "
                "DCGM_LIMIT_MAX_SBE_RATE 10 is marked a placeholder and its health watch no "
                "longer reads it; off by default, the rate kept as a metric"),
    Rule("ecc_sram_correctable", "ecc", "level", ("ecc_sram_correctable",), limit=10000,
         anchor="Azure HPC health checks (check_gpu_ecc 20000000 10000 on H100 and H200): "
                "more than 10000 SRAM correctable errors"),
    Rule("ecc_dram_correctable", "ecc", "level", ("ecc_dram_correctable",), limit=20000000,
         anchor="Azure HPC health checks (check_gpu_ecc 20000000 10000 on H100 and H200): "
                "more than 20,000,000 DRAM correctable errors"),
    Rule("ecc_uncorrectable", "ecc", "increase", ("ecc_uncorrectable",), window_s=86400,
         anchor="NVIDIA DCGM's health watch (any double-bit error fails), Meta GCM "
                "(ecc_uncorrected threshold 0), Azure (any SRAM uncorrectable error)"),
    Rule("retired_pages", "ecc", "level", ("retired_pages",), limit=62,
         anchor="NVIDIA DCGM's health watch: 63 retired pages fail a GPU "
                "(DCGM_LIMIT_MAX_RETIRED_PAGES); Azure: 62 with one pending is a full table"),
    Rule("retirement_pending", "ecc", "state", ("retirement_pending",), confirm=2,
         anchor="NVIDIA DCGM's health watch: a pending page retirement (a reboot or driver "
                "reload retires it)"),
    Rule("remap_pending", "ecc", "state", ("remap_pending",), confirm=2,
         anchor="GPUd (remapped-rows: a pending remapping needs a reset) and Azure (any "
                "pending remapping fails)"),
    Rule("remap_failure", "ecc", "state", ("remap_failure",), confirm=1,
         anchor="NVIDIA's row-remapping RMA criterion (A100 GPU memory error management), "
                "GPUd, DCGM and Azure: a remapping failure needs the GPU replaced"),
)
RDMA_COUNTERS = tuple(c for r in RULES if r.source == "rdma" for c in r.counters)
ECC_COUNTERS = ("ecc_correctable", "ecc_uncorrectable", "ecc_sram_correctable",
                "ecc_dram_correctable", "retired_pages")
LEVELS = {"ecc_sram_correctable": "SRAM correctable ECC errors (aggregate)",
          "ecc_dram_correctable": "DRAM correctable ECC errors (aggregate)",
          "retired_pages": "retired pages"}
# The InfiniBand PortCounters' widths (IBTA): a counter at its maximum stops counting.
SATURATED = {"symbol_error": 65535, "link_error_recovery": 255, "link_downed": 255,
             "port_rcv_errors": 65535, "port_xmit_discards": 65535,
             "local_link_integrity_errors": 15, "excessive_buffer_overrun_errors": 15}


class ConfigError(Exception):
    """The configuration cannot be used."""


class Deadline:
    """The time left of a budget; every command gets at most that."""

    def __init__(self, budget: float) -> None:
        self.end = time.monotonic() + budget

    def left(self) -> float:
        return max(0.0, self.end - time.monotonic())


@dataclass
class Output:
    """A command's exit status (None: it was stopped, the text says why) and output."""

    rc: int | None
    text: str


# ---- commands --------------------------------------------------------------------------------

def run_commands(commands: list[list[str]], deadline: Deadline,
                 limit: int = OUTPUT_LIMIT) -> list[Output | None]:
    """Run the commands side by side within the deadline, each printing at most ``limit``
    bytes; None for a command that is not installed."""
    env = dict(os.environ, PATH=os.environ.get("PATH") or DEFAULT_PATH, LC_ALL="C")
    procs: list[subprocess.Popen[bytes] | None] = []
    for argv in commands:
        try:
            procs.append(subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          env=env, start_new_session=True))
        except (FileNotFoundError, PermissionError, NotADirectoryError):
            procs.append(None)
    budget = deadline.left()
    chunks = _collect(procs, deadline, limit)
    results: list[Output | None] = []
    for proc, got in ((procs[i], chunks[i]) for i in range(len(procs))):
        if proc is None:
            results.append(None)
        elif sum(len(c) for c in got) > limit:
            results.append(_stop(proc, f"printed more than {limit} bytes"))
        else:
            try:
                results.append(Output(proc.wait(timeout=deadline.left()),
                                      b"".join(got).decode(errors="replace")))
            except subprocess.TimeoutExpired:
                results.append(_stop(proc, f"timed out after {round(budget, 1):g}s"))
    return results


def _collect(procs: list[subprocess.Popen[bytes] | None], deadline: Deadline,
             limit: int) -> list[list[bytes]]:
    """Each command's output, read until it ends, prints more than ``limit`` bytes or the
    deadline passes."""
    chunks: list[list[bytes]] = [[] for _ in procs]
    with selectors.DefaultSelector() as selector:
        for i, proc in enumerate(procs):
            if proc is not None and proc.stdout is not None:
                selector.register(proc.stdout, selectors.EVENT_READ, i)
        while selector.get_map() and deadline.left() > 0:
            for key, _ in selector.select(deadline.left()):
                data = os.read(key.fd, 65536)
                chunks[key.data].append(data)
                if not data or sum(len(c) for c in chunks[key.data]) > limit:
                    selector.unregister(key.fileobj)
    return chunks


def _stop(proc: subprocess.Popen[bytes], why: str) -> Output:
    """Kill a command (its whole process group) and give it a moment to end; one that does
    not end is left behind, never waited for."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=KILL_GRACE_S)
    if proc.stdout is not None:
        proc.stdout.close()
    return Output(None, why)


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:120] if lines else "no output"


# ---- parsers ---------------------------------------------------------------------------------

def counter_name(text: str) -> str:
    """``Replay Errors`` -> ``replay_errors``."""
    return _NAME.sub("_", text.strip().lower()).strip("_")


def parse_nvlink_errors(text: str) -> dict[tuple[int, int], dict[str, int]]:
    """(GPU index, link) -> counter -> value from ``nvidia-smi nvlink -e``; counters that
    are not integers (N/A, a bit error rate) are left out."""
    links: dict[tuple[int, int], dict[str, int]] = {}
    gpu: int | None = None
    for line in text.splitlines():
        head = _GPU_LINE.match(line)
        if head:
            gpu = int(head.group(1))
            continue
        match = _LINK_LINE.match(line)
        if match and gpu is not None and match.group(3).isdigit():
            links.setdefault((gpu, int(match.group(1))), {})[
                counter_name(match.group(2))] = int(match.group(3))
    return links


def parse_smi_q(text: str) -> dict[str, dict[str, str]]:
    """Bus id (``0000:18:00.0``) -> section path (``ECC Errors/Aggregate/DRAM
    Uncorrectable``) -> value from ``nvidia-smi -q`` (any ``-d`` selection)."""
    gpus: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    stack: list[tuple[int, str]] = []
    for line in text.splitlines():
        head = _QGPU.match(line)
        if head:
            current = gpus.setdefault(pci_address(head.group(1)), {})
            stack = []
            continue
        if current is None or not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        while stack and stack[-1][0] >= indent:
            stack.pop()
        name, colon, value = line.strip().partition(":")
        if not colon:
            stack.append((indent, name.strip()))
            continue
        path = "/".join([*(s for _, s in stack), name.strip()])
        current[path] = value.strip()
    return gpus


def pci_address(text: str) -> str:
    """A PCI address in one spelling: ``00000000:3B:00.0`` and ``0000:3b:00.0`` are one."""
    domain, rest = text.strip().lower().split(":", 1)
    return f"{int(domain, 16):04x}:{rest}"


def _int(value: str | None) -> int | None:
    return int(value) if value is not None and value.isdigit() else None


def _total(fields: dict[str, str], section: str, kind: str) -> int | None:
    """The sum of a GPU's ``section`` (Volatile, Aggregate) counts of ``kind``
    (correctable, uncorrectable): the SRAM and DRAM lines, or the Single Bit or Double Bit
    Total of older drivers; None when the GPU has none (ECC off or not supported)."""
    legacy = "Single Bit" if kind == "correctable" else "Double Bit"
    older = _int(fields.get(f"ECC Errors/{section}/{legacy}/Total"))
    if older is not None:
        return older
    prefix = f"ECC Errors/{section}/"
    values = []
    for key, value in fields.items():
        name = key[len(prefix):].lower() if key.startswith(prefix) else "/"
        if "/" not in name and "correctable" in name \
                and ("uncorrectable" in name) == (kind == "uncorrectable"):
            values.append(_int(value))
    counted = [v for v in values if v is not None]
    return sum(counted) if counted else None


def ecc_readings(fields: dict[str, str]) -> dict[str, int | bool]:
    """What the watch reads of one GPU's ``-q -d ECC,ROW_REMAPPER,PAGE_RETIREMENT``:
    ecc_correctable and ecc_uncorrectable (aggregate, else volatile), the aggregate
    ecc_sram_correctable and ecc_dram_correctable, retired_pages, and the conditions
    retirement_pending, remap_pending and remap_failure."""
    found: dict[str, int | bool] = {}
    for kind in ("correctable", "uncorrectable"):
        value = _total(fields, "Aggregate", kind)
        if value is None:
            value = _total(fields, "Volatile", kind)
        if value is not None:
            found[f"ecc_{kind}"] = value
    for memory in ("SRAM", "DRAM"):
        value = _int(fields.get(f"ECC Errors/Aggregate/{memory} Correctable"))
        if value is not None:
            found[f"ecc_{memory.lower()}_correctable"] = value
    pages = [_int(fields.get(f"Retired Pages/{k}")) for k in ("Single Bit ECC",
                                                               "Double Bit ECC")]
    if any(p is not None for p in pages):
        found["retired_pages"] = sum(p or 0 for p in pages)
    for path, key in (("Retired Pages/Pending Page Blacklist", "retirement_pending"),
                      ("Retired Pages/Pending Page Retirement", "retirement_pending"),
                      ("Retired Pages/Pending", "retirement_pending"),
                      ("Remapped Rows/Pending", "remap_pending"),
                      ("Remapped Rows/Remapping Failure Occurred", "remap_failure")):
        answer = fields.get(path, "").lower()
        if answer in ("yes", "no"):
            found[key] = bool(found.get(key)) or answer == "yes"
    return found


def aer_total(text: str, name: str) -> int | None:
    """The ``TOTAL_ERR_*`` line of an ``aer_dev_*`` file."""
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == name and parts[1].isdigit():
            return int(parts[1])
    return None


def link_speed(text: str) -> float | None:
    """GT/s from ``32.0 GT/s PCIe`` or ``8 GT/s``; None for ``Unknown``."""
    match = _SPEED.match(text)
    return float(match.group(1)) if match else None


# ---- reading the node ------------------------------------------------------------------------

def read_file(path: str) -> str | None:
    try:
        with open(path, "rb") as fh:
            return fh.read(FILE_LIMIT).decode(errors="replace")
    except OSError:
        return None


def _listdir(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path), key=lambda n: (len(n), n))
    except OSError:
        return []


@dataclass
class Port:
    """One RDMA port as read now: up (its state ACTIVE, else its phys_state LinkUp; None
    when neither can be read), its link_downed."""

    up: bool | None
    link_downed: int | None


@dataclass
class Condition:
    """A state or level rule's verdict on one subject now."""

    rule: str
    bad: bool
    message: str


@dataclass
class Reading:
    """What one observation read: counters by series key (``source/subject/counter``),
    ports, conditions by finding id, the sources read and notes."""

    counters: dict[str, int] = field(default_factory=dict)
    ports: dict[str, Port] = field(default_factory=dict)
    conditions: dict[str, Condition] = field(default_factory=dict)
    read: set[str] = field(default_factory=set)
    notes: list[str] = field(default_factory=list)


def read_rdma(root: str, reading: Reading) -> None:
    """The counters and link state of every port under ``<root>/class/infiniband``."""
    base = os.path.join(root, "class", "infiniband")
    if not os.path.isdir(base):
        return
    reading.read.add("rdma")
    for device in _listdir(base):
        ports = os.path.join(base, device, "ports")
        for port in _listdir(ports):
            where = os.path.join(ports, port)
            subject = f"{device}/{port}"
            for group in ("counters", "hw_counters"):
                for name in RDMA_COUNTERS:
                    text = read_file(os.path.join(where, group, name))
                    if text is not None and text.strip().isdigit():
                        value = int(text.strip())
                        reading.counters[f"rdma/{subject}/{name}"] = value
                        if group == "counters" and value == SATURATED.get(name):
                            reading.notes.append(
                                f"{subject} {name} is saturated at {value}: it counts no "
                                "more until cleared (perfquery -R)")
            state = read_file(os.path.join(where, "state"))
            phys = read_file(os.path.join(where, "phys_state"))
            up = None
            if state is not None and state.strip():
                up = state.strip().split(":")[-1].strip().upper() == "ACTIVE"
            elif phys is not None and phys.strip():
                up = phys.strip().split(":")[-1].strip().lower() == "linkup"
            downed = read_file(os.path.join(where, "counters", "link_downed"))
            reading.ports[subject] = Port(up, int(downed.strip()) if downed is not None
                                          and downed.strip().isdigit() else None)


def read_pcie(root: str, rules: dict[str, Rule], reading: Reading) -> None:
    """AER totals and link width/speed of NVIDIA GPUs and Mellanox NICs."""
    base = os.path.join(root, "bus", "pci", "devices")
    if not os.path.isdir(base):
        return
    reading.read.add("pcie")
    for address in sorted(os.listdir(base)):
        where = os.path.join(base, address)
        klass = (read_file(os.path.join(where, "class")) or "").strip().lower()[:6]
        if klass not in ("0x0300", "0x0302", "0x0200", "0x0207"):
            continue
        vendor = (read_file(os.path.join(where, "vendor")) or "").strip().lower()
        if vendor == "0x10de" and klass in ("0x0300", "0x0302"):
            kind = "GPU"
        elif vendor == "0x15b3" and klass in ("0x0200", "0x0207"):
            kind = "NIC"
        else:
            continue
        if os.path.exists(os.path.join(where, "physfn")):
            continue  # a virtual function: its link is its physical function's
        names = _listdir(os.path.join(where, "infiniband"))
        shown = f"{address} ({kind}{' ' + names[0] if names else ''})"
        for name, total in (("correctable", "TOTAL_ERR_COR"), ("nonfatal", "TOTAL_ERR_NONFATAL"),
                            ("fatal", "TOTAL_ERR_FATAL")):
            text = read_file(os.path.join(where, f"aer_dev_{name}"))
            value = aer_total(text, total) if text is not None else None
            if value is not None:
                reading.counters[f"pcie/{address}/aer_{name}"] = value
        width = [_int((read_file(os.path.join(where, f"{w}_link_width")) or "").strip())
                 for w in ("current", "max")]
        if width[0] and width[1] and rules["pcie_width"].enabled:
            reading.conditions[f"pcie/{address}/width"] = Condition(
                "pcie_width", width[0] < width[1],
                f"{shown} PCIe link x{width[0]}, capable of x{width[1]}")
        speed = [link_speed(read_file(os.path.join(where, f"{w}_link_speed")) or "")
                 for w in ("current", "max")]
        if kind == "NIC" and speed[0] and speed[1] and rules["pcie_speed"].enabled:
            reading.conditions[f"pcie/{address}/speed"] = Condition(
                "pcie_speed", speed[0] < speed[1],
                f"{shown} PCIe link {speed[0]:g} GT/s, capable of {speed[1]:g} GT/s")


def read_nvidia(tool: str, deadline: Deadline, rules: dict[str, Rule],
                reading: Reading) -> None:
    """NVLink error counters and GPU memory errors from two nvidia-smi runs side by side."""
    if shutil.which(tool, path=os.environ.get("PATH") or DEFAULT_PATH) is None:
        return  # no nvidia-smi: no GPU sources
    nvlink = [tool, "nvlink", "-e"]
    memory = [tool, "-q", "-d", "ECC,ROW_REMAPPER,PAGE_RETIREMENT"]
    outputs = run_commands([nvlink, memory], deadline)
    for argv, out, source in ((nvlink, outputs[0], "nvlink"), (memory, outputs[1], "ecc")):
        shown = " ".join(["nvidia-smi", *argv[1:]])
        if out is None:
            return  # no nvidia-smi: no GPU sources
        if out.rc is None:
            reading.notes.append(f"{shown}: {out.text}")
            continue
        if out.rc != 0:
            reading.notes.append(f"{shown}: exit status {out.rc}: {last_line(out.text)}")
            continue
        reading.read.add(source)
        if source == "nvlink":
            for (gpu, link), counters in parse_nvlink_errors(out.text).items():
                for name, value in counters.items():
                    reading.counters[f"nvlink/gpu{gpu}/link{link}/{name}"] = value
        else:
            _read_ecc(parse_smi_q(out.text), rules, reading)


def _read_ecc(gpus: dict[str, dict[str, str]], rules: dict[str, Rule],
              reading: Reading) -> None:
    for address, fields in gpus.items():
        found = ecc_readings(fields)
        for counter in ECC_COUNTERS:
            if counter in found:
                reading.counters[f"ecc/{address}/{counter}"] = int(found[counter])
        for name, what in LEVELS.items():
            level = rules[name]
            if name in found and level.enabled:
                value = int(found[name])
                reading.conditions[f"ecc/{address}/{name}"] = Condition(
                    name, value > level.limit,
                    f"GPU {address} {value} {what} (limit {level.limit:g})")
        for name, what in (("retirement_pending", "a page retirement pending (reboot or "
                                                  "reload the driver)"),
                           ("remap_pending", "a row remapping pending (reset the GPU)"),
                           ("remap_failure", "a row remapping failed (replace the GPU)")):
            if name in found and rules[name].enabled:
                reading.conditions[f"ecc/{address}/{name}"] = Condition(
                    name, bool(found[name]), f"GPU {address} {what}")


def observe(config: dict[str, Any], rules: dict[str, Rule], deadline: Deadline) -> Reading:
    """Read every source; an unreadable one costs its reading only (a note)."""
    reading = Reading()
    read_rdma(config["sys_root"], reading)
    read_pcie(config["sys_root"], rules, reading)
    read_nvidia(config["nvidia_smi"], deadline, rules, reading)
    return reading


# ---- series and judging ----------------------------------------------------------------------

def rule_of_counter(rules: dict[str, Rule]) -> dict[tuple[str, str], Rule]:
    """(source, counter) -> the rule that judges it."""
    return {(r.source, c): r for r in rules.values() for c in r.counters}


def split_key(key: str) -> tuple[str, str, str]:
    """``rdma/mlx5_0/1/symbol_error`` -> (``rdma``, ``mlx5_0/1``, ``symbol_error``)."""
    source, rest = key.split("/", 1)
    subject, counter = rest.rsplit("/", 1)
    return source, subject, counter


def add_sample(samples: list[list[float]], now: float, value: int,
               horizon: float) -> list[list[float]]:
    """``samples`` ([time, value], oldest first) with this one added: a value below the
    last (a reset) or a time not after it restarts the series; a run of equal values keeps
    its ends only; samples closer than the horizon's share of MOST_SAMPLES are merged; the
    newest sample at or before the horizon's start is the oldest kept."""
    if samples and (value < samples[-1][1] or now <= samples[-1][0]):
        samples = []
    samples = [*samples, [now, value]]
    spacing = horizon / (MOST_SAMPLES - 2) if horizon > 0 else 0.0
    if len(samples) >= 3 and (samples[-3][1] == samples[-2][1] == samples[-1][1]
                              or samples[-1][0] - samples[-3][0] < spacing):
        del samples[-2]
    start = now - horizon
    oldest = 0
    for i, sample in enumerate(samples):
        if sample[0] <= start:
            oldest = i
    return samples[max(oldest, len(samples) - MOST_SAMPLES):]


@dataclass
class Window:
    """A counter's increase within a window: the increase, the span it was seen over (at
    least the window when the series is older), and the rate per window."""

    increase: int
    span: float
    per_window: float


def windowed(samples: list[list[float]], now: float, window: float) -> Window:
    """The increase since the value at the window's start: the newest sample at or before
    it (its value held up to the start when the next sample has the same), else the
    oldest sample. The rate per window is the increase over the longer of the span and the
    window, scaled to the window."""
    start = now - window
    base = 0
    for i, sample in enumerate(samples):
        if sample[0] <= start:
            base = i
    base_time = samples[base][0]
    if base + 1 < len(samples) and samples[base + 1][1] == samples[base][1] and base_time <= start:
        base_time = start
    increase = int(samples[-1][1] - samples[base][1])
    span = max(now - base_time, 0.0)
    per_window = increase * window / max(span, window) if window > 0 else float(increase)
    return Window(increase, span, per_window)


def duration(seconds: float, short: bool = False) -> str:
    """``1h0m``, ``5m0s``, ``12s``, ``2d3h``; short: no zero second part (``1h``, ``12h``)."""
    s = round(seconds)
    for size, unit, part, next_unit in ((86400, "d", 3600, "h"), (3600, "h", 60, "m"),
                                        (60, "m", 1, "s")):
        if s >= size:
            rest = s % size // part
            return f"{s // size}{unit}" + ("" if short and not rest else f"{rest}{next_unit}")
    return f"{s}s"


def _unit(window: float) -> tuple[str, float]:
    if window >= 3600:
        return "h", 3600.0
    if window >= 60:
        return "min", 60.0
    return "s", 1.0


def rate_message(rule: Rule, subject: str, counter: str, seen: Window) -> str:
    """``mlx5_0/1 symbol_error +140 in 1h0m (140.0/h, limit 120/h over 1h)``."""
    head = f"{subject} {counter} +{seen.increase} in {duration(seen.span)}"
    if rule.kind == "increase":
        return f"{head} (any increase opens; held {duration(rule.window_s, True)})"
    unit, seconds = _unit(rule.window_s)
    rate = seen.per_window * seconds / rule.window_s
    limit = rule.limit * seconds / rule.window_s
    return (f"{head} ({rate:.1f}/{unit}, limit {limit:g}/{unit} over "
            f"{duration(rule.window_s, True)})")


def update_port(record: dict[str, Any] | None, port: Port, now: float,
                rule: Rule) -> dict[str, Any]:
    """A port's record after this observation: its state, link_downed and the downs
    counted within the rule's window. A down is link_downed's increase, or the port seen
    down after being seen up (the larger); it is not counted when it is known to have been
    shorter than min_down_s: the port was up at both observations around it and they are
    closer than that."""
    record = dict(record or {})
    downs = [d for d in record.get("downs", []) if isinstance(d, list) and len(d) == 2
             and isinstance(d[0], (int, float)) and isinstance(d[1], int)
             and d[0] > now - rule.window_s]
    was_up, last_downed, last_time = record.get("up"), record.get("ld"), record.get("t")
    moved = 0
    if isinstance(last_downed, int) and port.link_downed is not None \
            and port.link_downed >= last_downed:
        moved = port.link_downed - last_downed
    seen_down = 1 if was_up is True and port.up is False else 0
    new = max(moved, seen_down)
    short = (new and was_up is True and port.up is True and isinstance(last_time, (int, float))
             and now - last_time < rule.min_down_s)
    if new and not short:
        downs.append([now, new])
    record.update(up=port.up, ld=port.link_downed, t=now, downs=downs[-MOST_DOWNS:])
    return record


def flap_count(record: dict[str, Any], now: float, rule: Rule) -> int:
    return sum(n for t, n in record.get("downs", []) if t > now - rule.window_s)


@dataclass
class Verdict:
    """A rule's verdict on one finding id this run (a clean verdict needs no message;
    a clean one over less than the rule's window, after a reboot or a reset, is not known
    to be clean)."""

    rule: Rule
    bad: bool
    message: str
    known: bool = True


def judge(state: dict[str, Any], reading: Reading, rules: dict[str, Rule],
          now: float) -> tuple[dict[str, Verdict], list[dict[str, Any]]]:
    """Every rule's verdict by finding id, and the rates of the counters read (for the
    textfile and the report)."""
    verdicts: dict[str, Verdict] = {}
    rates: list[dict[str, Any]] = []
    by_counter = rule_of_counter(rules)
    series = state["series"]
    for key in reading.counters:
        source, subject, counter = split_key(key)
        rule = by_counter.get((source, counter))
        if rule is None or rule.kind not in ("rate", "increase") or key not in series:
            continue
        seen = windowed(series[key], now, rule.window_s)
        rates.append({"subject": subject, "counter": counter, "window": rule.window_s,
                      "increase": seen.increase,
                      "rate_per_hour": seen.per_window * 3600 / rule.window_s,
                      "limit": rule.limit if rule.kind == "rate" and rule.enabled else None})
        if rule.enabled:
            bad = seen.increase > 0 if rule.kind == "increase" else seen.per_window > rule.limit
            verdicts[key] = Verdict(rule, bad, rate_message(rule, subject, counter, seen)
                                    if bad else "", series[key][0][0] <= now - rule.window_s)
    flaps = rules["flaps"]
    for subject in reading.ports:
        record = state["ports"].get(subject, {})
        count = flap_count(record, now, flaps)
        if flaps.enabled:
            verdicts[f"rdma/{subject}/flaps"] = Verdict(
                flaps, count >= flaps.count,
                f"{subject} went down {count} times in {duration(flaps.window_s)} "
                f"(limit {flaps.count} within {duration(flaps.window_s, True)}, downs of "
                f"{flaps.min_down_s:g}s or more)")
    for ident, condition in reading.conditions.items():
        verdicts[ident] = Verdict(rules[condition.rule], condition.bad, condition.message)
    return verdicts, rates


def update_findings(findings: dict[str, dict[str, Any]], verdicts: dict[str, Verdict],
                    read: set[str], now: float) -> dict[str, dict[str, Any]]:
    """The findings after this run: a bad verdict opens a finding (state and level rules
    after ``confirm`` in a row: pending until then); a clean one drops a pending finding
    and clears an open one once ``clear_after_s`` has passed since its last bad
    observation. A finding whose source could not be read this run, or whose rule's window
    is not yet observed whole (its series restarted), is kept as it was; one whose subject
    is gone from a source that was read is dropped."""
    kept: dict[str, dict[str, Any]] = {}
    for ident, finding in findings.items():
        if ident not in verdicts and ident.split("/", 1)[0] not in read:
            kept[ident] = finding
    for ident, verdict in verdicts.items():
        old = findings.get(ident) or {}
        rule = verdict.rule
        was_open = old.get("status") == "open"
        last_bad = old.get("last_bad")
        if verdict.bad:
            before = old.get("seen")
            seen = (before if isinstance(before, int) else 0) + 1
            needed = rule.confirm if rule.kind in ("state", "level") else 1
            kept[ident] = {
                "class": CLASS_OF[rule.source], "rule": rule.name,
                "status": "open" if was_open or seen >= needed else "pending",
                "since": old.get("since", int(now)), "last_bad": now, "seen": seen,
                "message": _message(verdict.message, seen, needed, was_open)}
        elif old and not verdict.known:
            kept[ident] = old
        elif was_open and isinstance(last_bad, (int, float)) \
                and now - last_bad < rule.clear_after_s:
            kept[ident] = dict(old, seen=0)
    return kept


def _message(message: str, seen: int, needed: int, was_open: bool) -> str:
    if seen < needed and not was_open:
        message += f" ({seen} of {needed} observations)"
    return message[:MESSAGE_LIMIT]


# ---- state, silences, report and textfile ----------------------------------------------------

def read_json(path: str, limit: int) -> tuple[dict[str, Any], str]:
    """A JSON object from ``path`` and, when it could not be used, why: absent, over
    ``limit`` bytes, not a JSON object or unreadable are all read as empty."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(limit + 1)
    except FileNotFoundError:
        return {}, "absent"
    except OSError as exc:
        return {}, f"unreadable ({exc.strerror}), read as empty"
    if len(raw) > limit:
        return {}, f"over {limit} bytes, read as empty"
    try:
        data = json.loads(raw.decode())
    except (UnicodeDecodeError, ValueError, RecursionError):
        return {}, "corrupt, read as empty"
    if not isinstance(data, dict):
        return {}, "not a JSON object, read as empty"
    return data, ""


def write_atomic(path: str, text: str, durable: bool = True) -> None:
    """Write ``text`` to ``path`` atomically (a temporary file beside it, renamed over
    it), synced to disk first when ``durable`` (the state and the silences; the report and
    the textfile are rewritten at the next run). Raises OSError."""
    os.makedirs(os.path.dirname(path) or ".", mode=0o755, exist_ok=True)
    temporary = f"{path}.{os.getpid()}.tmp"
    try:
        with open(temporary, "w") as fh:
            fh.write(text)
            if durable:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(temporary, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)


def load_state(path: str, limit: int, boot: str) -> tuple[dict[str, Any], list[str]]:
    """The state kept between runs, checked part by part; notes on what was lost."""
    data, why = read_json(path, limit)
    notes = []
    if why and why != "absent":
        notes.append(f"state {path} {why}: this run's history is lost")
        data = {}
    if data and data.get("version") != STATE_VERSION:
        notes.append(f"state {path} is of another version: history restarted")
        data = {}
    series, ports, findings = (_object(data, k) for k in ("series", "ports", "findings"))
    clean_series = {k: v for k, v in series.items() if isinstance(k, str) and _samples(v)}
    clean_ports = {k: v for k, v in ports.items() if isinstance(v, dict)}
    clean_findings = {k: v for k, v in findings.items() if isinstance(k, str) and _ID.match(k)
                      and isinstance(v, dict) and v.get("status") in ("pending", "open")
                      and isinstance(v.get("since"), int) and isinstance(v.get("message"), str)
                      and v.get("class") in CLASS_OF.values()}
    if data and data.get("boot_id") != boot:
        notes.append("new boot: counter series restarted")
        clean_series = {}
        clean_ports = {k: {"downs": v.get("downs", [])} for k, v in clean_ports.items()}
    return {"version": STATE_VERSION, "boot_id": boot, "series": clean_series,
            "ports": clean_ports, "findings": clean_findings}, notes


def _object(data: dict[str, Any], key: str) -> dict[str, Any]:
    value = data.get(key)
    return value if isinstance(value, dict) else {}


def _samples(value: Any) -> bool:
    """A series as the state keeps it: [[time, value], ...], numbers only."""
    return isinstance(value, list) and bool(value) and all(
        type(s) is list and len(s) == 2 and type(s[0]) in (int, float)
        and type(s[1]) in (int, float) for s in value)


def bounded_state(state: dict[str, Any], limit: int) -> tuple[str, list[str]]:
    """The state's JSON text within ``limit`` bytes: series thinned to fewer samples (each
    keeps its oldest and newest), then dropped, until it fits; a note says what it cost."""
    text = json.dumps(state, sort_keys=True, separators=(",", ":"))
    most = MOST_SAMPLES
    while len(text) + 1 > limit and most > 2:
        most = max(2, most // 2)
        for key, samples in state["series"].items():
            if len(samples) > most:
                step = (len(samples) - 1) / (most - 1)
                state["series"][key] = [samples[round(i * step)] for i in range(most)]
        text = json.dumps(state, sort_keys=True, separators=(",", ":"))
    dropped = 0
    while len(text) + 1 > limit and (state["series"] or state["ports"]):
        part = "series" if state["series"] else "ports"
        for key in sorted(state[part])[-max(1, len(state[part]) // 4):]:
            del state[part][key]
            dropped += 1
        text = json.dumps(state, sort_keys=True, separators=(",", ":"))
    notes = []
    if most < MOST_SAMPLES:
        notes.append(f"state over {limit} bytes: kept {most} samples a series"
                     + (f", dropped {dropped} series" if dropped else ""))
    return text + "\n", notes


def load_silences(path: str, now: float) -> tuple[dict[str, dict[str, Any]], bool, str]:
    """The silences still in force, whether expired or malformed ones were dropped, and a
    note when the file could not be read."""
    data, why = read_json(path, SILENCES_LIMIT)
    note = f"silences {path} {why}" if why and why != "absent" else ""
    live = {k: v for k, v in data.items() if isinstance(k, str) and _ID.match(k)
            and isinstance(v, dict) and isinstance(v.get("until"), (int, float))
            and not isinstance(v.get("until"), bool) and v["until"] > now
            and isinstance(v.get("reason"), (str, type(None)))}
    return live, len(live) != len(data), note


def report_of(findings: dict[str, dict[str, Any]], silences: dict[str, dict[str, Any]],
              notes: list[str], *, series: int, now: float,
              rates: list[dict[str, Any]]) -> dict[str, Any]:
    """The --json report: version 1, every pending, open or silenced finding (open first,
    then by id), notes, how many series, and the counters that rose within their window."""
    listed = []
    for ident, finding in findings.items():
        silence = silences.get(ident)
        listed.append({"id": ident, "class": finding["class"],
                       "status": "silenced" if silence else finding["status"],
                       "since": finding["since"], "message": finding["message"],
                       "silenced_until": silence["until"] if silence else None,
                       "silence_reason": silence.get("reason") if silence else None})
    order = {"open": 0, "pending": 1, "silenced": 2}
    listed.sort(key=lambda f: (order[f["status"]], natural(f["id"])))
    rising = sorted((r for r in rates if r["increase"] > 0),
                    key=lambda r: -r["rate_per_hour"])[:RISING_MOST]
    return {"version": VERSION, "time": now, "findings": listed, "notes": notes,
            "series": series, "rising": rising}


def natural(text: str) -> tuple[tuple[int, str], ...]:
    """A sort key that puts ``gpu0/link2`` before ``gpu0/link10``."""
    return tuple((int(part), "") if part.isdigit() else (-1, part)
                 for part in _DIGITS.split(text) if part)


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def textfile(report: dict[str, Any], state: dict[str, Any], rates: list[dict[str, Any]],
             rules: dict[str, Rule], took: float) -> str:
    """The node_exporter textfile: counters, their windowed rates, flaps per port,
    findings, the run's time and duration."""
    lines = ["# HELP gpufleet_watch_value A watched counter's value at the last run.",
             "# TYPE gpufleet_watch_value gauge"]
    for key in sorted(state["series"], key=natural):
        _, subject, counter = split_key(key)
        value = state["series"][key][-1][1]
        lines.append(f'gpufleet_watch_value{{subject="{_label(subject)}",'
                     f'counter="{_label(counter)}"}} {value:g}')
    lines += ["# HELP gpufleet_watch_rate_per_hour A counter's increase within its rule's "
              "window, per hour.",
              "# TYPE gpufleet_watch_rate_per_hour gauge"]
    for rate in sorted(rates, key=lambda r: natural(f"{r['subject']}/{r['counter']}")):
        lines.append(f'gpufleet_watch_rate_per_hour{{subject="{_label(rate["subject"])}",'
                     f'counter="{_label(rate["counter"])}",window="{rate["window"]:g}"}} '
                     f'{rate["rate_per_hour"]:.6g}')
    flaps = rules["flaps"]
    lines += ["# HELP gpufleet_watch_flaps A port's downs counted within the flap window.",
              "# TYPE gpufleet_watch_flaps gauge"]
    now = report["time"]
    for subject in sorted(state["ports"], key=natural):
        count = flap_count(state["ports"][subject], now, flaps)
        lines.append(f'gpufleet_watch_flaps{{subject="{_label(subject)}",'
                     f'window="{flaps.window_s:g}"}} {count}')
    lines += ["# HELP gpufleet_watch_finding A pending, open or silenced finding.",
              "# TYPE gpufleet_watch_finding gauge"]
    for finding in report["findings"]:
        lines.append(f'gpufleet_watch_finding{{id="{_label(finding["id"])}",'
                     f'class="{finding["class"]}",status="{finding["status"]}"}} 1')
    lines += ["# HELP gpufleet_watch_last_run_timestamp_seconds When the watch last ran.",
              "# TYPE gpufleet_watch_last_run_timestamp_seconds gauge",
              f"gpufleet_watch_last_run_timestamp_seconds {now:.3f}",
              "# HELP gpufleet_watch_run_duration_seconds How long the last run took.",
              "# TYPE gpufleet_watch_run_duration_seconds gauge",
              f"gpufleet_watch_run_duration_seconds {took:.3f}"]
    return "\n".join(lines) + "\n"


# ---- configuration ---------------------------------------------------------------------------

def load_config(path: str) -> tuple[dict[str, Any], dict[str, Rule]]:
    """The defaults overlaid with the configuration file, and the rules with its
    overrides; unknown or mistyped keys fail naming the key. A missing file is the
    defaults."""
    try:
        with open(path) as fh:
            data = json.load(fh)
    except FileNotFoundError:
        data = {}
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path} line {exc.lineno}: not valid JSON: {exc.msg}") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: must be a JSON object")
    config = dict(DEFAULTS)
    for key, value in data.items():
        if key.startswith("_"):
            continue
        if key not in DEFAULTS:
            raise ConfigError(f"{path}: unknown key {key!r} (known: {', '.join(DEFAULTS)})")
        config[key] = value

    def number(value: Any, least: float) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and value >= least

    checks = {
        "state_dir": isinstance(config["state_dir"], str) and config["state_dir"].startswith("/"),
        "textfile_dir": config["textfile_dir"] is None or (
            isinstance(config["textfile_dir"], str) and config["textfile_dir"].startswith("/")),
        "sys_root": isinstance(config["sys_root"], str) and config["sys_root"].startswith("/"),
        "nvidia_smi": isinstance(config["nvidia_smi"], str) and bool(config["nvidia_smi"]),
        "budget_s": number(config["budget_s"], 0) and config["budget_s"] > 0,
        "state_limit_bytes": isinstance(config["state_limit_bytes"], int)
        and number(config["state_limit_bytes"], 4096),
        "rules": isinstance(config["rules"], dict),
    }
    for key, ok in checks.items():
        if not ok:
            raise ConfigError(f"{path}: {key} has a wrong type or value: {config[key]!r}")
    return config, load_rules(path, config["rules"])


def load_rules(path: str, overrides: dict[str, Any]) -> dict[str, Rule]:
    """RULES with ``overrides`` ({rule: {param: value}}) applied and checked."""
    rules = {r.name: r for r in RULES}
    for name, params in overrides.items():
        if name.startswith("_"):
            continue
        if name not in rules:
            raise ConfigError(f"{path}: unknown key 'rules.{name}' (known: "
                              f"{', '.join(rules)})")
        if not isinstance(params, dict):
            raise ConfigError(f"{path}: rules.{name} must be an object")
        rule = rules[name]
        allowed = PARAMS[rule.kind]
        changes: dict[str, Any] = {}
        for param, value in params.items():
            if param.startswith("_"):
                continue
            where = f"rules.{name}.{param}"
            if param not in allowed:
                raise ConfigError(f"{path}: unknown key {where!r} (known: "
                                  f"{', '.join(allowed)})")
            if param == "enabled":
                ok = isinstance(value, bool)
            elif param in ("count", "confirm"):
                ok = isinstance(value, int) and not isinstance(value, bool) and value >= 1
            else:
                ok = isinstance(value, (int, float)) and not isinstance(value, bool) and (
                    value > 0 if param == "window_s" else value >= 0)
            if not ok:
                raise ConfigError(f"{path}: {where} has a wrong type or value: {value!r}")
            changes[param] = value
        rules[name] = replace(rule, **changes)
    return rules


def horizon_of(rule: Rule) -> float:
    """How far back a counter's series reaches: its rule's window (flap and level rules
    judge other records or the last value only)."""
    return rule.window_s if rule.kind in ("rate", "increase") else 0.0


def _command(args: list[str]) -> str | None:
    """The subcommand (silence, unsilence) among the arguments, if any."""
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg in ("--config", "--now", "--until", "--reason"):
            skip = True
        elif not arg.startswith("-"):
            return arg
    return None


# ---- the commands ----------------------------------------------------------------------------

def record(state: dict[str, Any], reading: Reading, rules: dict[str, Rule],
           now: float) -> None:
    """Add what was read to the state: each counter to its series, each port's downs; the
    series and ports a source that was read no longer has are dropped."""
    by_counter = rule_of_counter(rules)
    series = state["series"]
    for key, value in reading.counters.items():
        source, _, counter = split_key(key)
        rule = by_counter.get((source, counter))
        if rule is not None:
            series[key] = add_sample(series.get(key, []), now, value, horizon_of(rule))
    for key in [k for k in series if k not in reading.counters
                and k.split("/", 1)[0] in reading.read]:
        del series[key]
    for subject, port in reading.ports.items():
        state["ports"][subject] = update_port(state["ports"].get(subject), port, now,
                                              rules["flaps"])
    if "rdma" in reading.read:
        for subject in [s for s in state["ports"] if s not in reading.ports]:
            del state["ports"][subject]


def silences_now(path: str, now: float, notes: list[str]) -> dict[str, dict[str, Any]]:
    """The silences in force; expired ones are dropped from the file."""
    silences, dropped, note = load_silences(path, now)
    if note:
        notes.append(note)
    elif dropped:
        with contextlib.suppress(OSError):
            write_atomic(path, json.dumps(silences, sort_keys=True, indent=1) + "\n")
    return silences


def write_outputs(files: list[tuple[str, str, bool]], notes: list[str]) -> None:
    """Write each (path, text, durable) atomically; one that cannot be written is a
    note."""
    for path, text, durable in files:
        try:
            write_atomic(path, text, durable)
        except OSError as exc:
            notes.append(f"cannot write {path}: {exc.strerror or exc}")


@contextlib.contextmanager
def run_lock(state_dir: str, wait_s: float) -> Iterator[tuple[bool, str]]:
    """Hold ``state_dir/watch.lock`` (flock) while the block runs: (True, "") once taken,
    waiting at most ``wait_s`` for another run to let go; (False, BUSY...) when it did not;
    (True, a note) when the lock file cannot be opened (the run goes on unlocked)."""
    path = os.path.join(state_dir, LOCK_FILE)
    try:
        os.makedirs(state_dir, mode=0o755, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        yield True, f"cannot open the lock {path}: {exc.strerror or exc}; running unlocked"
        return
    try:
        end = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= end:
                    yield False, f"{BUSY} (it held {path} for the {wait_s:.1f}s waited)"
                    return
                time.sleep(LOCK_POLL_S)
        yield True, ""
    finally:
        os.close(fd)  # closing lets go of the lock


def busy_report(state_dir: str, why: str, now: float) -> dict[str, Any]:
    """What a run that found another in progress prints: the last report kept (the other
    run's verdict until it writes its own) with ``why`` first among its notes, else an empty
    one."""
    path = os.path.join(state_dir, REPORT_FILE)
    kept, unread = read_json(path, REPORT_LIMIT)
    findings, notes, series = kept.get("findings"), kept.get("notes"), kept.get("series")
    if (unread or kept.get("version") != VERSION or not isinstance(findings, list)
            or not all(isinstance(f, dict) and f.get("status") in ("open", "pending", "silenced")
                       and isinstance(f.get("id"), str) and isinstance(f.get("message"), str)
                       for f in findings)):
        return {"version": VERSION, "time": now, "findings": [],
                "notes": [f"{why}: nothing observed; no last report ({path} "
                          f"{unread or 'not a report'})"], "series": 0, "rising": []}
    return {**kept, "series": series if isinstance(series, int) else 0,
            "notes": [f"{why}: nothing observed; this is the last report",
                      *(notes if isinstance(notes, list) else [])]}


def show(report: dict[str, Any], as_json: bool, took: float) -> int:
    """Print the report (one JSON object, or a line per finding and note and a summary);
    the exit status it gives."""
    counts = {s: sum(f["status"] == s for f in report["findings"])
              for s in ("open", "pending", "silenced")}
    if as_json:
        print(json.dumps(report))
    else:
        for finding in report["findings"]:
            print(f"{finding['status'].upper()} {finding['id']}: {finding['message']}")
        for line in report["notes"]:
            print(f"NOTE {line}")
        node = socket.gethostname().split(".")[0]
        print(f"watch {node}: {counts['open']} open, {counts['pending']} pending, "
              f"{counts['silenced']} silenced, {report['series']} series in {took:.2f}s")
    return EXIT_OPEN if counts["open"] else 0


def observation(config: dict[str, Any], rules: dict[str, Rule], now: float | None,
                as_json: bool) -> int:
    """One observation under the run lock; a run that finds another in progress past its
    share of the budget writes nothing and repeats the last report's verdict (so the health
    check neither drains nor resumes a node for it)."""
    started = time.monotonic()
    deadline = Deadline(float(config["budget_s"]))
    with run_lock(config["state_dir"], config["budget_s"] * LOCK_SHARE) as (held, why):
        if not held:
            report = busy_report(config["state_dir"], why, time.time() if now is None else now)
            return show(report, as_json, time.monotonic() - started)
        return observe_and_write(config, rules, time.time() if now is None else now,
                                 deadline, notes=[why] if why else [], as_json=as_json,
                                 started=started)


def observe_and_write(config: dict[str, Any], rules: dict[str, Rule], now: float,
                      deadline: Deadline, *, notes: list[str], as_json: bool,
                      started: float) -> int:
    """One observation: read, append, judge, write, print; the exit status."""
    state_dir = config["state_dir"]
    state_path = os.path.join(state_dir, STATE_FILE)
    boot = read_file(BOOT_ID_FILE)
    state, state_notes = load_state(state_path, config["state_limit_bytes"],
                                    boot.strip() if boot else "unknown")
    notes += state_notes
    reading = observe(config, rules, deadline)
    notes += reading.notes
    record(state, reading, rules, now)
    verdicts, rates = judge(state, reading, rules, now)
    state["findings"] = update_findings(state["findings"], verdicts, reading.read, now)
    silences = silences_now(os.path.join(state_dir, SILENCES_FILE), now, notes)
    state_text, bound_notes = bounded_state(state, config["state_limit_bytes"])
    notes += bound_notes
    report = report_of(state["findings"], silences, notes, series=len(state["series"]),
                       now=now, rates=rates)
    write_outputs([(state_path, state_text, True),
                   (os.path.join(state_dir, REPORT_FILE), json.dumps(report) + "\n", False)],
                  report["notes"])
    took = time.monotonic() - started
    if config["textfile_dir"]:
        write_outputs([(os.path.join(config["textfile_dir"], TEXTFILE),
                        textfile(report, state, rates, rules, took), False)], report["notes"])
    return show(report, as_json, took)


def parse_until(text: str) -> float:
    """Unix seconds from ``1765000000`` or an ISO 8601 time (``2026-12-08T18:00Z``, a time
    without a zone is UTC)."""
    with contextlib.suppress(ValueError):
        return float(text)
    value = text.strip()
    if value.endswith(("Z", "z")):
        value = value[:-1] + "+00:00"
    match = re.match(r"^(\d{4})-(\d{2})-(\d{2})(?:[T ](\d{2}):(\d{2})(?::(\d{2})(?:\.\d+)?)?)?"
                     r"(?:([+-])(\d{2}):?(\d{2}))?$", value)
    if not match:
        raise ValueError(f"--until: not a time: {text!r} (ISO 8601 or Unix seconds)")
    year, month, day, hour, minute, second = (int(g or 0) for g in match.groups()[:6])
    seconds = calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0))
    if match.group(7):
        offset = int(match.group(8)) * 3600 + int(match.group(9)) * 60
        seconds -= offset if match.group(7) == "+" else -offset
    return float(seconds)


def silence(config: dict[str, Any], ident: str, until: float, reason: str | None,
            now: float) -> int:
    """Silence a finding until a time (kept in watch-silences.json)."""
    path = os.path.join(config["state_dir"], SILENCES_FILE)
    silences, _, note = load_silences(path, now)
    if note:
        print(f"note: {note}: starting a new one", file=sys.stderr)
    silences[ident] = {"until": until, "reason": reason}
    write_atomic(path, json.dumps(silences, sort_keys=True, indent=1) + "\n")
    shown = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(until))
    late = " (already past: it has no effect)" if until <= now else ""
    print(f"silenced {ident} until {shown}{late}" + (f": {reason}" if reason else ""))
    return 0


def unsilence(config: dict[str, Any], ident: str, now: float) -> int:
    path = os.path.join(config["state_dir"], SILENCES_FILE)
    silences, _, _ = load_silences(path, now)
    if silences.pop(ident, None) is None:
        print(f"{ident} was not silenced")
        return 0
    write_atomic(path, json.dumps(silences, sort_keys=True, indent=1) + "\n")
    print(f"unsilenced {ident}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="gpufleet-watch",
        description="The node's standing watch: RDMA, PCIe, NVLink and GPU memory counters "
                    "over windows; subcommands silence ID --until TIME and unsilence ID.")
    parser.add_argument("--config", default=CONFIG, help=f"settings (default {CONFIG})")
    parser.add_argument("--now", type=float, help="the observation's time (Unix seconds)")
    command = _command(args)
    if command is not None:
        parser.add_argument("command", choices=("silence", "unsilence"))
        parser.add_argument("id", help="the finding's id, as the report names it")
        if command == "silence":
            parser.add_argument("--until", required=True, help="ISO 8601 time or Unix seconds")
            parser.add_argument("--reason", help="why (shown with the finding)")
    else:
        parser.add_argument("--json", action="store_true",
                            help="print the report as one JSON object")
    parsed = parser.parse_args(args)
    try:
        config, rules = load_config(parsed.config)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if command is None:
        return observation(config, rules, parsed.now, parsed.json)
    with run_lock(config["state_dir"], config["budget_s"]) as (held, why):
        if not held:
            print(f"error: {why}: try again", file=sys.stderr)
            return EXIT_USAGE
        return silence_command(config, parsed,
                               parsed.now if parsed.now is not None else time.time())


def silence_command(config: dict[str, Any], parsed: argparse.Namespace, now: float) -> int:
    """silence ID --until TIME [--reason TEXT], or unsilence ID."""
    try:
        if not _ID.match(parsed.id):
            raise ValueError(f"not a finding id: {parsed.id!r}")
        if parsed.command == "unsilence":
            return unsilence(config, parsed.id, now)
        until = parse_until(parsed.until)
        return silence(config, parsed.id, until, parsed.reason, now)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
    except OSError as exc:
        print(f"error: cannot write the silences: {exc}", file=sys.stderr)
    return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
