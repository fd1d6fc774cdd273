#!/usr/bin/python3
"""gpufleet-healthcheck: the node-local checks Slurm runs, as its health check, prolog and epilog.

Runs on the node with the standard library only (no gpufleet install). One catalogue of
checks; each runs in the contexts it is tagged with:

  periodic  slurmd's HealthCheckProgram (the default; under 10 s)
  prolog    slurmd's Prolog, at each job's start: only the job's GPUs (under 5 s)
  epilog    slurmd's Epilog, at each job's end: the job's GPUs cleaned and compared

  gpus           periodic, prolog  nvidia-smi answers; the expected GPU count, or the job's
                                   GPUs exist
  gpu_processes  prolog, epilog    no compute process on the job's GPUs (the epilog kills
                                   what is left: SIGTERM, then SIGKILL)
  ecc            periodic, prolog  no uncorrectable ECC error since the driver loaded, no
                                   row remapping pending or failed
  gpu_memory     epilog            the job's GPUs' memory is released
  xid            periodic, prolog  no Xid that needs a GPU reset, a reboot or a person
                                   (NVIDIA's catalogue, in context) since boot; in the
                                   prolog, none newer than the last one a prolog saw
                                   (state_dir/gate.json)
  driver, nccl   periodic          the loaded driver and libnccl2 are the versions bootstrap
                                   recorded
  port_range     periodic          net.ipv4.ip_local_port_range is the expected range
  fabric_ports   prolog            every InfiniBand/RoCE port (or those configured) is ACTIVE
  memlock        prolog            slurmd's RLIMIT_MEMLOCK, which jobs get, is unlimited
  gpu_config     prolog, epilog    the prolog records the job's GPUs' application clocks,
                                   compute mode and MIG mode (state_dir/jobs/<job>.json);
                                   the epilog finds them unchanged
  watch          periodic          gpufleet-watch (``watch_program``) reports no open
                                   finding: NIC, NVLink, PCIe and ECC counters judged over
                                   windows between runs, link flaps, links below their width
  time_sync      periodic          the clock is synchronised (chrony, else systemd) and
                                   within ``time_max_offset_ms`` of its source
  roce_qos       periodic          every port the roce_qos role declares keeps its trust,
                                   PFC priority and ECN (mlnx_qos, else dcb)

The context is ``--context``, else the name the program was run by (gpufleet-prolog,
gpufleet-epilog: Slurm's Prolog= takes no arguments), else periodic. The prolog and epilog
read the job from SLURM_JOB_ID and SLURM_JOB_GPUS (else CUDA_VISIBLE_DEVICES): GPU indexes
or UUIDs as nvidia-smi lists them; a job without GPUs skips the GPU checks.

It prints one line per check (PASS, FAIL or SKIP) and exits 1 when a check failed, 2 on a
bad configuration. Each context has a budget (``budget_s``, ``prolog_budget_s``,
``epilog_budget_s``); every command gets at most the time left of it, less a reserve (3 s,
2 s in the prolog and epilog) that stays for scontrol, so a hung nvidia-smi still leaves
time to drain the node.

With --drain, or when slurmd runs it (SLURMD_NODENAME is set), it keeps its findings in
the node's drain reason, beside gpufleet's other findings (a failed conformance check, a
drifted role) in the format of gpufleet/slurm/findings.py, which this program carries a
copy of: a failed check adds its finding (the reason then starts ``gf hc/<check>: ...``,
``gf prolog/<check>: ...`` or ``gf epilog/<check>: ...``). The periodic run clears the
findings (its own, the prolog's and the epilog's) of each check it passes, and resumes the
node once no finding of anyone's is left; the prolog and epilog only drain, and only ask
Slurm anything when a check failed. A node that an operator drained is left alone.

Expectations come from a JSON file (default /etc/gpufleet/healthcheck.json, written by
gpufleet's slurm_healthcheck role) and the node's recorded state /etc/gpufleet/node.json
(written by bootstrap).
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import json
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

CONFIG = "/etc/gpufleet/healthcheck.json"
DEFAULTS: dict[str, Any] = {
    "gpu_count": None,
    "critical_xids": [],
    "port_range": None,
    "state_file": "/etc/gpufleet/node.json",
    "nvidia_smi_timeout_s": 4.0,
    "budget_s": 9.0,
    "syslog_socket": "/dev/log",
    "prolog_budget_s": 5.0,
    "epilog_budget_s": 30.0,
    "epilog_kill_grace_s": 5.0,
    "epilog_max_used_mib": 1024,
    "job_memlock_min_kib": None,
    "fabric_ports": None,
    "state_dir": "/var/lib/gpufleet",
    "watch_program": None,
    "watch_config": None,
    "time_max_offset_ms": 100,
}
DRIVER_VERSION_FILE = "/proc/driver/nvidia/version"
PORT_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"
INFINIBAND_DIR = "/sys/class/infiniband"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
GPU_QUERY = ("index,pci.bus_id,name,ecc.errors.uncorrected.volatile.total,"
             "remapped_rows.pending,remapped_rows.failure")
SETTINGS = ("clocks.applications.graphics", "clocks.applications.memory", "compute_mode",
            "mig.mode.current")
JOB_QUERY = GPU_QUERY + ",uuid,memory.used," + ",".join(SETTINGS)
APPS_QUERY = "gpu_bus_id,pid,used_memory"
SLURM_RESERVE_S = 3.0
JOB_RESERVE_S = 2.0  # the prolog's and epilog's: Slurm drains on their failure anyway
KILL_GRACE_S = 0.5  # after SIGKILL: a tool still not ended by then is left behind
POLL_S = 0.25  # between two looks at the GPUs while the epilog waits
STATE_LIMIT = 65536  # bytes of a state file: a larger one is read as empty
JOBS_MOST = 256  # job records kept in state_dir/jobs (the oldest go first)
LINE_LIMIT = 300  # characters of the Xid line gate.json keeps
WATCH_LIMIT = 1 << 20  # characters of gpufleet-watch's --json report: a longer one fails
WATCH_SHOWN = 3  # silenced findings a passing watch check names
SYSLOG_TAG = "gpufleet-healthcheck"
SYSLOG_FACILITY = 3  # daemon (RFC 5424), as LBNL NHC logs
SYSLOG_ERR, SYSLOG_INFO = 3, 6
SYSLOG_LIMIT = 2000  # bytes of one message: a datagram /dev/log takes whole
# The reason format of gpufleet/slurm/findings.py (tests/unit/test_slurm_findings.py holds
# the two copies together).
PREFIX = "gf "
LEGACY = "gpufleet: "
MESSAGE_LIMIT = 160
MOST = 40
LETTERS = {"c": "conformance", "d": "drift", "h": "healthcheck", "b": "bootstrap",
           "p": "prolog", "e": "epilog", "g": "gang"}
LABELS = {"c": "", "d": "drift/", "h": "hc/", "b": "bootstrap/", "p": "prolog/",
          "e": "epilog/", "g": "gang/"}
_TRAILER = re.compile(r" \{gf1 (?P<body>[^{}]*)\}$")
_PUNCTUATION = str.maketrans({'"': "'", "{": "(", "}": ")", "[": "(", "]": ")"})
_SLURM_FIELD = re.compile(r"\b(Reason|Comment|Extra)=")
_TOKEN = re.compile(r"^(?P<source>[a-z]):(?P<id>[^\s@{}]+)@(?P<since>\d+)$")
_LEGACY = re.compile(r"^gpufleet: (?P<source>conformance|drift|healthcheck|bootstrap)/"
                     r"(?P<id>[^:]*?):")
EXIT_FAILED = 1
EXIT_USAGE = 2

_XID = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}"
                  r"(?:\.[0-7])?)\):\s*(\d+),\s*(.*?)\s*$")
_XID_CONTEXT = re.compile(r"^(?:pid=[^,]*,\s*)?(?:name=[^,]*,\s*)?")
# NVIDIA's Xid catalogue as gpufleet/facts/xids.py holds it (its docstring names the source),
# in the compact form this program needs: code -> (action class, NVIDIA's immediate action,
# name); tests/unit/test_xid_catalogue.py holds the two copies, and their rules, together.
XID_CLASSES = ("ignore", "application", "reset", "reboot", "hardware")  # mildest first
XID_DRAINS = frozenset({"reset", "reboot", "hardware"})
XID_REPEATS = 3  # an application Xid's bursts on one GPU within the window: a reset
XID_REPEAT_WINDOW_S = 3600.0
XID_BURST_S = 10.0  # the same Xid on the same GPU again within this is the same burst
XID_UNUSED = (1, 2, 3, 4, 5, 6, 7, 9, 10, 12, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 26, 27, 28,
              29, 30, 33, 34, 35, 36, 42, 47, 49, 50, 51, 52, 53, 55, 56, 57, 58, 59, 61, 65, 73,
              81, 87, 90, 91, 111, 112, 113, 114, 115, 116, 117, 118, 122, 123, 124, 125, 138)
XID_CATALOGUE: dict[int, tuple[str, str, str]] = {
    **dict.fromkeys(XID_UNUSED, ("hardware", "CONTACT_SUPPORT", "not used on Ampere or newer")),
    8: ("application", "RESTART_APP", "GPU stopped processing"),
    11: ("application", "RESTART_APP", "Invalid or corrupted push buffer stream"),
    13: ("application", "RESTART_APP", "Graphics Engine Exception"),
    14: ("ignore", "IGNORE", "Fake or injected error"),
    25: ("application", "RESTART_APP", "Invalid or illegal push buffer stream"),
    31: ("application", "RESTART_APP", "GPU memory page fault"),
    32: ("application", "RESTART_APP", "Invalid or corrupted push buffer stream"),
    37: ("ignore", "IGNORE", "Driver firmware error"),
    38: ("ignore", "IGNORE", "Driver firmware error"),
    39: ("application", "RESTART_APP", "Copy Engine Exception"),
    40: ("application", "RESTART_APP", "Copy Engine Exception"),
    41: ("application", "RESTART_APP", "Copy Engine Exception"),
    43: ("ignore", "IGNORE", "GPU stopped processing"),
    44: ("ignore", "IGNORE", "Graphics Engine fault during context switch"),
    45: ("ignore", "WORKFLOW_XID_45", "Preemptive cleanup, due to previous errors"),
    46: ("reset", "RESET_GPU", "GPU stopped processing"),
    48: ("reset", "WORKFLOW_XID_48", "Double Bit ECC Error"),
    54: ("hardware", "CHECK_MECHANICALS", "Auxiliary power is not connected to the GPU board"),
    60: ("application", "RESTART_APP", "Video processor exception"),
    62: ("reset", "RESET_GPU", "Internal micro-controller halt"),
    63: ("ignore", "IGNORE", "GPU memory remapping event"),
    64: ("reset", "RESET_GPU", "GPU memory remapping failure"),
    66: ("ignore", "IGNORE", "Illegal access by driver"),
    67: ("ignore", "IGNORE", "Illegal access by driver"),
    68: ("application", "RESTART_APP", "NVDEC0 Exception"),
    69: ("application", "RESTART_APP", "Graphics Engine class error"),
    70: ("application", "RESTART_APP", "CE3: Unknown Error"),
    71: ("application", "RESTART_APP", "CE4: Unknown Error"),
    72: ("application", "RESTART_APP", "CE5: Unknown Error"),
    74: ("reset", "WORKFLOW_NVLINK_ERR", "NVLINK Error"),
    75: ("application", "RESTART_APP", "CE6: Unknown Error"),
    76: ("application", "RESTART_APP", "CE7: Unknown Error"),
    77: ("application", "RESTART_APP", "CE8: Unknown Error"),
    78: ("hardware", "UPDATE_SWFW", "vGPU Start Error"),
    79: ("reboot", "RESTART_BM", "GPU has fallen off the bus"),
    80: ("application", "RESTART_APP", "Corrupted data sent to GPU"),
    82: ("application", "RESTART_APP", "NVJPG0 Error"),
    83: ("application", "RESTART_APP", "NVDEC1 Error"),
    84: ("application", "RESTART_APP", "NVDEC2 Error"),
    85: ("application", "RESTART_APP", "CE9: Unknown Error"),
    86: ("application", "RESTART_APP", "OFA Exception"),
    88: ("application", "RESTART_APP", "NVDEC3 Error"),
    89: ("application", "RESTART_APP", "NVDEC4 Error"),
    92: ("ignore", "IGNORE", "High single-bit ECC error rate"),
    93: ("ignore", "IGNORE", "Non-fatal violation of provisioned InfoROM wear limit"),
    94: ("application", "RESTART_APP", "Contained memory error"),
    95: ("reset", "RESET_GPU", "Uncontained memory error"),
    96: ("application", "RESTART_APP", "NVDEC5 Error"),
    97: ("application", "RESTART_APP", "NVDEC6 Error"),
    98: ("application", "RESTART_APP", "NVDEC7 Error"),
    99: ("application", "RESTART_APP", "NVJPG1 Error"),
    100: ("application", "RESTART_APP", "NVJPG2 Error"),
    101: ("application", "RESTART_APP", "NVJPG3 Error"),
    102: ("application", "RESTART_APP", "NVJPG4 Error"),
    103: ("application", "RESTART_APP", "NVJPG5 Error"),
    104: ("application", "RESTART_APP", "NVJPG6 Error"),
    105: ("application", "RESTART_APP", "NVJPG7 Error"),
    106: ("ignore", "IGNORE", "SMBPBI Test Message"),
    107: ("ignore", "IGNORE", "SMBPBI Test Message Silent"),
    108: ("ignore", "IGNORE", "NVLink remote translation error"),
    109: ("reset", "RESET_GPU", "Context Switch Timeout Error"),
    110: ("reset", "RESET_GPU", "Security Fault Error"),
    119: ("reset", "RESET_GPU", "GSP RPC Timeout"),
    120: ("reset", "RESET_GPU", "GSP Error"),
    121: ("ignore", "IGNORE", "C2C Error"),
    126: ("application", "RESTART_APP", "CE10: Unknown Error"),
    127: ("application", "RESTART_APP", "CE11: Unknown Error"),
    128: ("application", "RESTART_APP", "CE12: Unknown Error"),
    129: ("application", "RESTART_APP", "CE13: Unknown Error"),
    130: ("application", "RESTART_APP", "CE14: Unknown Error"),
    131: ("application", "RESTART_APP", "CE15: Unknown Error"),
    132: ("application", "RESTART_APP", "CE16: Unknown Error"),
    133: ("application", "RESTART_APP", "CE17: Unknown Error"),
    134: ("application", "RESTART_APP", "CE18: Unknown Error"),
    135: ("application", "RESTART_APP", "CE19: Unknown Error"),
    136: ("reset", "RESET_GPU", "Link Training Failed"),
    137: ("ignore", "IGNORE", "NVLink Privilege Error"),
    139: ("application", "RESTART_APP", "OFA1 Error"),
    140: ("reset", "RESET_GPU", "ECC Unrecovered Error"),
    141: ("ignore", "IGNORE", "CUDA Fast Path Error"),
    142: ("hardware", "CONTACT_SUPPORT", "NVENC3 Error"),
    143: ("reset", "RESET_GPU", "GPU Initialization Error"),
    144: ("reset", "WORKFLOW_NVLINK5_ERR", "NVLINK: SAW Error"),
    145: ("reset", "WORKFLOW_NVLINK5_ERR", "NVLINK: RLW Error"),
    146: ("reset", "WORKFLOW_NVLINK5_ERR", "NVLINK: TLW Error"),
    147: ("reset", "WORKFLOW_NVLINK5_ERR", "NVLINK: TREX Error"),
    148: ("reset", "WORKFLOW_NVLINK5_ERR", "NVLINK: NVLPW_CTRL Error"),
    149: ("reset", "WORKFLOW_NVLINK5_ERR", "NVLINK: NETIR Error"),
    150: ("reset", "WORKFLOW_NVLINK5_ERR", "NVLINK: MSE Error"),
    151: ("reboot", "RESTART_VM", "Key rotation Error"),
    152: ("ignore", "IGNORE", "DLA SMMU Error"),
    153: ("ignore", "IGNORE", "DLA timeout Error"),
    154: ("reset", "XID_154", "GPU Recovery Action Changed"),
    155: ("reset", "RESET_GPU", "NVLINK: SW Defined Error"),
    156: ("reset", "RESET_GPU", "Resource Retirement Event"),
    157: ("ignore", "IGNORE", "Resource Retirement Failure"),
    158: ("reset", "RESET_GPU", "GPU Fatal Timeout"),
    159: ("reset", "CHECK_UVM", "CHI Non-Data Error"),
    160: ("ignore", "IGNORE", "Channel Retirement Event"),
    161: ("ignore", "IGNORE", "Channel Retirement Failure"),
    162: ("ignore", "NONE_GIVEN", "Power smoothing circuitry reengaged"),
    163: ("ignore", "NONE_GIVEN", "Power smoothing circuitry disengaged"),
    164: ("ignore", "NONE_GIVEN", "Power smoothing circuitry low lifetime"),
    165: ("ignore", "NONE_GIVEN", "Power smoothing circuitry lifetime exhausted"),
    166: ("reset", "NONE_GIVEN", "Confidential traffic before the link was set up for it"),
    167: ("reset", "NONE_GIVEN", "PCIe fatal timeout"),
    168: ("reboot", "NONE_GIVEN", "Errors found in the write-protected region"),
    169: ("reset", "NONE_GIVEN", "Internal micro-controller halt"),
    170: ("reset", "NONE_GIVEN", "Interrupt seen in confidential computing mode"),
    171: ("reset", "NONE_GIVEN", "Uncorrectable DRAM error"),
    172: ("reset", "NONE_GIVEN", "Uncorrectable SRAM error"),
}
XID_UNKNOWN = ("application", "UNKNOWN", "not in NVIDIA's catalogue")
_XID_RECOVERY = re.compile(r"recovery action changed\b.*\bto\s+0x[0-9a-fA-F]+\s*\(([^)]*)\)",
                           re.IGNORECASE)
_XID_NONFATAL = re.compile(r"^\S+\s+Nonfatal\b", re.IGNORECASE)
_STAMP = re.compile(r"\[\s*(\d+\.\d+)\]")
_MODULE = re.compile(r"Kernel Module(?:\s+for\s+\S+)?\s+(\d+(?:\.\d+)+)")
_STATE = re.compile(r"(?:^|\s)State=(\S+)")
_REASON = re.compile(r"\sReason=(.*?)(?: \[[^\]\s]*@[^\]\s]+\])?(?: (?:Comment|Extra)=.*)?$")
_JOB_ID = re.compile(r"^\d{1,20}$")
_PORT = re.compile(r"^[A-Za-z0-9_.-]+/\d+$")

# The contexts: the name each is run by, its findings' letter, its budget and its reserve.
CONTEXTS = ("periodic", "prolog", "epilog")
BY_NAME = {"gpufleet-prolog": "prolog", "gpufleet-epilog": "epilog"}
LETTER_OF = {"periodic": "h", "prolog": "p", "epilog": "e"}
BUDGET_OF = {"periodic": "budget_s", "prolog": "prolog_budget_s", "epilog": "epilog_budget_s"}
RESERVE_OF = {"periodic": SLURM_RESERVE_S, "prolog": JOB_RESERVE_S, "epilog": JOB_RESERVE_S}
TAG_OF = {"periodic": SYSLOG_TAG, "prolog": "gpufleet-prolog", "epilog": "gpufleet-epilog"}
LABEL_OF = {"periodic": "healthcheck", "prolog": "prolog", "epilog": "epilog"}


class ConfigError(Exception):
    """The configuration or the recorded state cannot be used."""


class SlurmUnavailable(Exception):
    """scontrol is missing or cannot say what state the node is in."""


@dataclass
class Result:
    """One check's verdict: PASS, FAIL or SKIP, and what it found."""

    check: str
    status: str
    message: str

    def line(self) -> str:
        return f"{self.status} {self.check}: {self.message}"


class Deadline:
    """The time left of a budget; every command gets at most that."""

    def __init__(self, budget: float) -> None:
        self.end = time.monotonic() + budget
        self.budget = budget

    def left(self, cap: float) -> float:
        return max(0.0, min(cap, self.end - time.monotonic()))


@dataclass
class Output:
    """A command's exit status and output; rc None: it did not start or finish in time (the
    text says which). ``errors``: its stderr, when asked for apart."""

    rc: int | None
    text: str
    errors: str = ""


def run(argv: list[str], deadline: Deadline, cap: float, apart: bool = False
        ) -> Output | None:
    """Run ``argv`` with the time left (at most ``cap`` s); None when it is not installed.
    Its stderr goes with its stdout, or ``apart`` into ``errors``; bytes that are not
    UTF-8 are replaced, never a crash."""
    timeout = deadline.left(cap)
    if timeout <= 0:
        return Output(None, f"not run: no time left of {deadline.budget:g}s")
    env = dict(os.environ, PATH=os.environ.get("PATH") or DEFAULT_PATH, LC_ALL="C")
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE if apart else subprocess.STDOUT,
                                text=True, encoding="utf-8", errors="replace", env=env,
                                start_new_session=True)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return Output(None, f"could not be started: {exc.strerror}")
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        return _stop(proc, f"did not answer within {timeout:.1f}s")
    return Output(proc.returncode, out, err or "")


def _stop(proc: subprocess.Popen[str], why: str) -> Output:
    """Kill a tool past its time (its whole process group) and wait a moment for it; one
    that still does not end (stuck in the kernel, or its output held open by a process it
    left behind) is given up on, never waited for: the check must end within slurmd's
    budget."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    try:
        proc.communicate(timeout=KILL_GRACE_S)
    except subprocess.TimeoutExpired:
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
        return Output(None, f"hung: {why}, and did not end when killed")
    return Output(None, why)


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


# ---- parsers ---------------------------------------------------------------------------------

def parse_gpus(text: str, query: str = GPU_QUERY) -> list[dict[str, str]]:
    """Rows of ``nvidia-smi --query-gpu=QUERY --format=csv,noheader,nounits``."""
    keys = query.split(",")
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        values = [v.strip() for v in line.split(",")]
        if len(values) != len(keys):
            raise ValueError(f"unexpected nvidia-smi line {line.strip()[:80]!r}")
        rows.append({key: values[i] for i, key in enumerate(keys)})
    return rows


def bus_id(text: str) -> str:
    """A PCI address in one spelling: ``00000000:3B:00.0`` and ``0000:3b:00.0`` are one."""
    parts = text.strip().lower().split(":")
    if len(parts) == 3 and re.fullmatch(r"[0-9a-f]{1,8}", parts[0]):
        return f"{int(parts[0], 16):04x}:{parts[1]}:{parts[2]}"
    return text.strip().lower()


@dataclass(frozen=True)
class App:
    """A compute process nvidia-smi lists: its GPU's PCI address, pid and memory (MiB)."""

    bus: str
    pid: int
    used: str

    def shown(self) -> str:
        comm = _comm(self.pid)
        used = f"{self.used} MiB" if self.used.isdigit() else self.used
        return f"pid {self.pid}" + (f" ({comm}, {used})" if comm else f" ({used})")


def parse_compute_apps(text: str) -> list[App]:
    """Rows of ``nvidia-smi --query-compute-apps=APPS_QUERY --format=csv,noheader,nounits``:
    ``00000000:3B:00.0, 4242, 1024`` (none: no output, or a "No running processes found"
    line as nvidia-smi's table prints it)."""
    apps = []
    for line in text.splitlines():
        if not line.strip() or line.strip().lower().startswith("no running"):
            continue
        values = [v.strip() for v in line.split(",")]
        if len(values) != 3 or not values[1].isdigit():
            raise ValueError(f"unexpected nvidia-smi line {line.strip()[:80]!r}")
        apps.append(App(bus_id(values[0]), int(values[1]), values[2]))
    return apps


@dataclass(frozen=True)
class XidEvent:
    """One ``NVRM: Xid`` line: its kernel time stamp (seconds since boot, when printed), the
    line from ``NVRM:`` on (what identifies it, whichever log printed it), PCI address, Xid
    and message."""

    stamp: float | None
    line: str
    pci: str
    xid: int
    message: str


def parse_xid_events(text: str) -> list[XidEvent]:
    """Every ``NVRM: Xid`` event of a kernel log (dmesg, journalctl -o short-monotonic,
    syslog): the stamp is the last ``[seconds]`` before ``NVRM:``."""
    events = []
    for line in text.splitlines():
        match = _XID.search(line)
        if match:
            stamps = _STAMP.findall(line[:match.start()])
            events.append(XidEvent(float(stamps[-1]) if stamps else None,
                                   line[match.start():].strip()[:LINE_LIMIT],
                                   match.group(1).lower(), int(match.group(2)),
                                   _XID_CONTEXT.sub("", match.group(3))))
    return events


def parse_xids(text: str) -> list[tuple[str, int, str]]:
    """(PCI address, Xid, message) of every ``NVRM: Xid`` line of a kernel log."""
    return [(e.pci, e.xid, e.message) for e in parse_xid_events(text)]


def parse_port_range(text: str) -> tuple[int, int]:
    """(low, high) from ``32768 60999``, ``32768-60999`` or the sysctl line."""
    numbers = re.findall(r"\d+", text.rsplit("=", maxsplit=1)[-1])
    if len(numbers) != 2:
        raise ValueError(f"not a port range: {text.strip()!r}")
    return int(numbers[0]), int(numbers[1])


def parse_slurm_node(text: str) -> tuple[str, str | None]:
    """(State, Reason) from ``scontrol --oneliner show node NAME``."""
    line = next((ln for ln in text.splitlines() if ln.startswith("NodeName=")), "")
    state = _STATE.search(line)
    if not state:
        raise ValueError(f"no State= in scontrol output {text.strip()[:80]!r}")
    reason = _REASON.search(line)
    return state.group(1), (reason.group(1).strip() or None) if reason else None


# ---- the findings in a drain reason (a copy of gpufleet/slurm/findings.py) -------------------

def _one_line(text: str) -> str:
    """Control characters to spaces, double quotes to single, braces and brackets to
    parentheses, ``Reason=``, ``Comment=`` and ``Extra=`` to ``Reason:`` ..., runs of blanks
    to one: the text goes into a ``reason=`` argument and is read back from scontrol by
    regex, where `` [user@time]`` or `` Comment=`` would end the reason early."""
    cleaned = "".join(" " if ord(c) < 32 or ord(c) == 127 else c for c in text)
    cleaned = _SLURM_FIELD.sub(r"\1:", cleaned.translate(_PUNCTUATION))
    return " ".join(cleaned.split())


def parse_findings(reason: str | None) -> list[tuple[str, str, int]] | None:
    """(source letter, id, since) of every finding a gpufleet reason holds; None for a
    reason that is not gpufleet's."""
    if not reason:
        return None
    if reason.startswith(PREFIX):
        match = _TRAILER.search(reason)
        found = []
        for token in (match.group("body").split() if match else []):
            parsed = _TOKEN.match(token)
            if parsed and parsed.group("source") in LETTERS:
                found.append((parsed.group("source"), parsed.group("id"),
                              int(parsed.group("since"))))
        return found
    if reason.startswith(LEGACY):
        legacy = _LEGACY.match(reason)
        if legacy:
            letter = next(k for k, v in LETTERS.items() if v == legacy.group("source"))
            ident = legacy.group("id").rstrip("/")
            if letter == "d":  # drift's findings are its roles
                ident = ident.split("/", 1)[0]
            return [(letter, re.sub(r"[\s@{}]", "_", ident), 0)]
    return None


def render_reason(findings: list[tuple[str, str, int]], message: str) -> str:
    """The reason for ``findings``, the first shown with ``message``."""
    kept = findings[:MOST]
    letter, ident, _ = kept[0]
    shown = _one_line(message)[:MESSAGE_LIMIT].rstrip() or "failed"
    more = f" (+{len(findings) - 1} more)" if len(findings) > 1 else ""
    tokens = " ".join(f"{s}:{i}@{since}" for s, i, since in kept)
    return f"{PREFIX}{LABELS[letter]}{ident}: {shown}{more} {{gf1 {tokens}}}"


def message_of(reason: str | None) -> str:
    if reason and reason.startswith(LEGACY):
        parts = reason.split(": ", 2)
        return parts[2] if len(parts) == 3 else ""
    if not reason or not reason.startswith(PREFIX):
        return ""
    body = re.sub(r" \(\+\d+ more\)$", "", _TRAILER.sub("", reason))
    return body.split(": ", 1)[1] if ": " in body else ""


def reconcile_reason(reason: str | None, results: list[Result], now: float,
                     letter: str = "h", clears: str = "hpe") -> tuple[str | None, bool]:
    """The reason after this run (None: no finding left) and whether it is gpufleet's to
    change: the run's failed checks added as findings of ``letter``, the findings of the
    sources ``clears`` names (the periodic run: its own, the prolog's and the epilog's; the
    prolog and epilog: none) cleared for its passed checks, every other finding kept."""
    current = parse_findings(reason)
    if current is None and reason:
        return reason, False
    failing = {r.check: r.message for r in results if r.status == "FAIL"}
    cleared = {r.check for r in results if r.status == "PASS"} - set(failing)
    kept = [f for f in current or [] if not (f[0] in clears and f[1] in cleared)]
    known = {(f[0], f[1]) for f in kept}
    findings = kept + [(letter, c, int(now)) for c in failing if (letter, c) not in known]
    if not findings:
        return None, True
    if current is not None and findings == current:
        return reason, True  # nothing opened or cleared: the reason stays as it is
    first, ident, since = findings[0]
    if first == letter and ident in failing:
        message = failing[ident]
    elif current and current[0] == findings[0] and message_of(reason):
        message = message_of(reason)
    else:
        message = "open since " + time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime(since))
    return render_reason(findings, message), True


# ---- state files: gate.json and the job records ----------------------------------------------

def read_state(path: str) -> tuple[dict[str, Any], str]:
    """A state file's object and, when it could not be used, why: absent, over
    STATE_LIMIT bytes, not a JSON object or unreadable are all read as empty (only that
    file's history is lost)."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(STATE_LIMIT + 1)
    except FileNotFoundError:
        return {}, "absent"
    except OSError as exc:
        return {}, f"unreadable: {exc.strerror}"
    if len(raw) > STATE_LIMIT:
        return {}, f"over {STATE_LIMIT} bytes, read as empty"
    try:
        data = json.loads(raw.decode())
    except (UnicodeDecodeError, ValueError):
        return {}, "corrupt, read as empty"
    if not isinstance(data, dict):
        return {}, "not a JSON object, read as empty"
    return data, ""


def write_state(path: str, data: dict[str, Any]) -> None:
    """Write ``data`` to ``path`` atomically (a temporary file beside it, renamed over it):
    a reader sees the old file or the new one, never half of one. Raises OSError."""
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    text = json.dumps(data, sort_keys=True)
    if len(text) > STATE_LIMIT:
        raise OSError(f"{path}: {len(text)} bytes, more than {STATE_LIMIT}")
    temporary = f"{path}.{os.getpid()}.tmp"
    try:
        with open(temporary, "w") as fh:
            fh.write(text + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(temporary, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)


def gate_path(config: dict[str, Any]) -> str:
    return os.path.join(config["state_dir"], "gate.json")


def job_record_path(config: dict[str, Any], job: str) -> str:
    return os.path.join(config["state_dir"], "jobs", f"{job}.json")


def prune_records(directory: str) -> None:
    """Keep the JOBS_MOST newest job records (an epilog that never ran leaves one)."""
    with contextlib.suppress(OSError):
        names = [n for n in os.listdir(directory) if n.endswith(".json")]
        if len(names) <= JOBS_MOST:
            return
        paths = sorted((os.path.join(directory, n) for n in names), key=os.path.getmtime)
        for path in paths[:len(paths) - JOBS_MOST]:
            with contextlib.suppress(OSError):
                os.unlink(path)


def boot_id() -> str:
    try:
        with open(BOOT_ID_FILE) as fh:
            return fh.read().strip()
    except OSError:
        return "unknown"


# ---- the job and what one run's checks share -------------------------------------------------

@dataclass(frozen=True)
class Job:
    """The job a prolog or epilog runs for: its id (None when SLURM_JOB_ID is not a job
    number) and its GPUs as Slurm names them (indexes, or UUIDs)."""

    id: str | None
    gpus: tuple[str, ...]

    @property
    def name(self) -> str:
        return f"job {self.id}" if self.id else "the job"


def job_from_env(env: dict[str, str]) -> Job:
    """The job from slurmd's environment: SLURM_JOB_GPUS, else CUDA_VISIBLE_DEVICES."""
    listed = env.get("SLURM_JOB_GPUS") or env.get("CUDA_VISIBLE_DEVICES") or ""
    gpus = tuple(g.strip() for g in listed.split(",") if g.strip() and g.strip() != "NoDevFiles")
    ident = env.get("SLURM_JOB_ID", "")
    return Job(ident if _JOB_ID.match(ident) else None, gpus)


@dataclass
class GpuData:
    """One nvidia-smi GPU query: its rows, or why there are none (``missing``: no
    nvidia-smi)."""

    rows: list[dict[str, str]] | None
    error: str = ""
    missing: bool = False


@dataclass
class Run:
    """What one run's checks share: the context, configuration, deadline, the job (prolog
    and epilog), bootstrap's recorded versions (periodic) and the GPU data, asked once."""

    context: str
    config: dict[str, Any]
    deadline: Deadline
    job: Job = field(default_factory=lambda: Job(None, ()))
    recorded: dict[str, Any] | None = None
    now: float | None = None  # the time gpufleet-watch judges at (--now), else its clock
    left_behind: bool = field(default=False, init=False)  # the epilog could not kill all
    _gpus: GpuData | None = field(default=None, init=False, repr=False)

    def gpus(self, refresh: bool = False) -> GpuData:
        """The GPUs (GPU_QUERY in the periodic run, JOB_QUERY in the prolog and epilog)."""
        if self._gpus is None or refresh:
            self._gpus = self._query_gpus()
        return self._gpus

    def _query_gpus(self) -> GpuData:
        query = GPU_QUERY if self.context == "periodic" else JOB_QUERY
        out = self.smi([f"--query-gpu={query}", "--format=csv,noheader,nounits"])
        if out is None:
            return GpuData(None, "nvidia-smi not found", missing=True)
        if out.rc is None:
            return GpuData(None, f"nvidia-smi {out.text}")
        if out.rc != 0:
            return GpuData(None, f"nvidia-smi failed: {last_line(out.text)}")
        try:
            return GpuData(parse_gpus(out.text, query))
        except ValueError as exc:
            return GpuData(None, str(exc))

    def smi(self, args: list[str]) -> Output | None:
        return run(["nvidia-smi", *args], self.deadline, float(self.config["nvidia_smi_timeout_s"]))

    def job_gpus(self) -> tuple[list[dict[str, str]], list[str]]:
        """The job's GPUs' rows and the job's GPUs nvidia-smi does not list (call only with
        GPU data)."""
        rows = self.gpus().rows or []
        found, missing = [], []
        for gpu in self.job.gpus:
            row = next((r for r in rows if gpu in (r["index"], r.get("uuid"))), None)
            if row is None:
                missing.append(gpu)
            elif row not in found:
                found.append(row)
        return found, missing

    def apps(self) -> list[App] | str:
        """The compute processes on the job's GPUs, or why nvidia-smi could not list them."""
        out = self.smi([f"--query-compute-apps={APPS_QUERY}", "--format=csv,noheader,nounits"])
        if out is None:
            return "nvidia-smi not found"
        if out.rc is None:
            return f"nvidia-smi --query-compute-apps {out.text}"
        if out.rc != 0:
            return f"nvidia-smi --query-compute-apps failed: {last_line(out.text)}"
        try:
            listed = parse_compute_apps(out.text)
        except ValueError as exc:
            return str(exc)
        buses = {bus_id(r["pci.bus_id"]) for r in self.job_gpus()[0]}
        return [a for a in listed if a.bus in buses]


def _gpu(row: dict[str, str]) -> str:
    return f"GPU{row['index']} {row['pci.bus_id']}"


def _comm(pid: int) -> str:
    """A process's command name, "" when it cannot be read (gone, another namespace)."""
    try:
        with open(f"/proc/{pid}/comm") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def _job_gpus_or_skip(run: Run, check: str) -> tuple[list[dict[str, str]], Result | None]:
    """The job's GPUs' rows, or the Result that ends ``check`` first: SKIP without GPUs or
    GPU data (the gpus check says why), FAIL for a GPU of the job nvidia-smi does not list
    in the epilog (which has no gpus check)."""
    if not run.job.gpus:
        return [], Result(check, "SKIP", f"{run.job.name} has no GPUs")
    data = run.gpus()
    if data.rows is None:
        if run.context == "epilog" and check == "gpu_processes":
            return [], Result(check, "FAIL", f"cannot list {run.job.name}'s GPUs: {data.error}")
        return [], Result(check, "SKIP", "no GPU data")
    rows, missing = run.job_gpus()
    if missing and run.context == "epilog" and check == "gpu_processes":
        return [], Result(check, "FAIL", f"{run.job.name}'s GPU(s) {', '.join(missing)} not "
                                         "found by nvidia-smi")
    if not rows:
        return [], Result(check, "SKIP", "none of the job's GPUs found (see gpus)")
    return rows, None


# ---- checks ----------------------------------------------------------------------------------

def _number(value: str) -> int | None:
    return int(value) if value.isdigit() else None


def check_gpus(run: Run) -> Result:
    """nvidia-smi answers within its deadline and sees the expected GPU count (periodic),
    or every GPU of the job (prolog)."""
    if run.context == "prolog":
        return _job_gpus_found(run)
    expected = run.config["gpu_count"]
    data = run.gpus()
    if data.missing:
        if expected:
            return Result("gpus", "FAIL", f"nvidia-smi not found; {expected} GPU(s) expected")
        return Result("gpus", "SKIP", "no nvidia-smi and no GPUs expected")
    if data.rows is None:
        return Result("gpus", "FAIL", data.error)
    names = sorted({r["name"] for r in data.rows})
    found = f"{len(data.rows)} GPU(s)" + (f" ({', '.join(names)})" if names else "")
    if expected in (None, len(data.rows)):
        return Result("gpus", "PASS", found)
    return Result("gpus", "FAIL", f"{found}, expected {expected}")


def _job_gpus_found(run: Run) -> Result:
    job = run.job
    if not job.gpus:
        return Result("gpus", "SKIP", f"{job.name} has no GPUs")
    data = run.gpus()
    if data.missing:
        return Result("gpus", "FAIL", f"nvidia-smi not found; {job.name} has GPU(s) "
                                      f"{', '.join(job.gpus)}")
    if data.rows is None:
        return Result("gpus", "FAIL", data.error)
    rows, missing = run.job_gpus()
    if missing:
        return Result("gpus", "FAIL", f"{job.name}'s GPU(s) {', '.join(missing)} not found "
                                      f"(nvidia-smi lists {len(data.rows)} GPU(s))")
    return Result("gpus", "PASS", f"{job.name}'s {len(rows)} GPU(s): "
                                  + ", ".join(_gpu(r) for r in rows))


def check_ecc(run: Run) -> Result:
    """Uncorrectable ECC errors and row remapping on every GPU (periodic) or the job's."""
    if run.context == "periodic":
        rows = run.gpus().rows
        return Result("ecc", "SKIP", "no GPU data") if rows is None else ecc_result(rows)
    job_rows, ended = _job_gpus_or_skip(run, "ecc")
    return ended or ecc_result(job_rows)


def ecc_result(rows: list[dict[str, str]]) -> Result:
    """Uncorrectable ECC errors and row remapping, per GPU."""
    problems = []
    for row in rows:
        gpu = _gpu(row)
        errors = _number(row["ecc.errors.uncorrected.volatile.total"])
        if errors:
            problems.append(f"{gpu}: {errors} uncorrectable ECC error(s)")
        if row["remapped_rows.pending"] == "Yes":
            problems.append(f"{gpu}: row remapping pending")
        if row["remapped_rows.failure"] == "Yes":
            problems.append(f"{gpu}: row remapping failed")
    if problems:
        return Result("ecc", "FAIL", "; ".join(problems))
    return Result("ecc", "PASS", f"no uncorrectable ECC error on {len(rows)} GPU(s)")


def check_gpu_processes(run: Run) -> Result:
    """No compute process on the job's GPUs: before the job (prolog) a process there is
    another's; after it (epilog) what is left is killed."""
    rows, ended = _job_gpus_or_skip(run, "gpu_processes")
    if ended:
        return ended
    if run.context == "epilog":
        return _kill_leftovers(run, rows)
    apps = run.apps()
    if isinstance(apps, str):
        return Result("gpu_processes", "FAIL", apps)
    if apps:
        where = {bus_id(r["pci.bus_id"]): _gpu(r) for r in rows}
        return Result("gpu_processes", "FAIL", "compute process(es) on the job's GPUs: "
                      + "; ".join(f"{a.shown()} on {where[a.bus]}" for a in apps))
    return Result("gpu_processes", "PASS",
                  f"no compute process on {run.job.name}'s {len(rows)} GPU(s)")


def _kill_leftovers(run: Run, rows: list[dict[str, str]]) -> Result:
    """SIGTERM to every process nvidia-smi lists on the job's GPUs, SIGKILL to those still
    listed after ``epilog_kill_grace_s``; one still listed a grace later cannot be killed.
    Never pid 0 or 1, this program or its parent."""
    apps = run.apps()
    if isinstance(apps, str):
        return Result("gpu_processes", "FAIL", apps)
    if not apps:
        return Result("gpu_processes", "PASS",
                      f"no process left on {run.job.name}'s {len(rows)} GPU(s)")
    where = {bus_id(r["pci.bus_id"]): _gpu(r) for r in rows}
    shown = {a.pid: f"{a.shown()} on {where[a.bus]}" for a in apps}
    spared = {0, 1, os.getpid(), os.getppid()}
    notes: dict[int, str] = {}
    targets: list[App] = apps
    left: list[App] | str = apps
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in sorted({a.pid for a in targets} - spared):
            notes[pid] = _signal(pid, sig)
        left = _wait_gone(run, float(run.config["epilog_kill_grace_s"]))
        if isinstance(left, str) or not left:
            break
        targets = left
    if isinstance(left, str):
        run.left_behind = True
        return Result("gpu_processes", "FAIL", f"after killing: {left}")
    if left:
        run.left_behind = True
        why = {a.pid: "not signalled" if a.pid in spared else notes.get(a.pid) or
               "still listed after SIGKILL" for a in left}
        return Result("gpu_processes", "FAIL", "cannot kill " + "; ".join(
            f"{shown.get(a.pid, f'pid {a.pid}')}: {why[a.pid]}" for a in left))
    return Result("gpu_processes", "PASS", f"killed {len(shown)} leftover process(es): "
                  + "; ".join(shown[p] for p in sorted(shown)))


def _signal(pid: int, sig: int) -> str:
    """Send ``sig``; "" when sent, else why not."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return "no such process here (another PID namespace?), still listed"
    except PermissionError:
        return "not permitted"
    return ""


def _wait_gone(run: Run, grace: float) -> list[App] | str:
    """The processes still on the job's GPUs once they are all gone or ``grace`` s (or the
    budget) is spent."""
    until = time.monotonic() + grace
    while True:
        left = run.apps()
        wait = min(until - time.monotonic(), run.deadline.left(grace))
        if isinstance(left, str) or not left or wait <= 0:
            return left
        time.sleep(min(POLL_S, wait))


def check_gpu_memory(run: Run) -> Result:
    """The job's GPUs' memory is released (memory.used at most ``epilog_max_used_mib``; a
    GPU with no process still shows some), waiting up to ``epilog_kill_grace_s``."""
    rows, ended = _job_gpus_or_skip(run, "gpu_memory")
    if ended:
        return ended
    if run.left_behind:
        return Result("gpu_memory", "SKIP", "processes left on the GPUs (see gpu_processes)")
    most = int(run.config["epilog_max_used_mib"])
    until = time.monotonic() + float(run.config["epilog_kill_grace_s"])
    while True:
        data = run.gpus(refresh=True)
        if data.rows is None:
            return Result("gpu_memory", "FAIL", data.error)
        rows = run.job_gpus()[0]
        used = {_gpu(r): _number(r["memory.used"]) for r in rows}
        over = {gpu: mib for gpu, mib in used.items() if mib is not None and mib > most}
        wait = min(until - time.monotonic(), run.deadline.left(until - time.monotonic()))
        if not over or wait <= 0:
            break
        time.sleep(min(POLL_S, wait))
    if over:
        return Result("gpu_memory", "FAIL", "; ".join(f"{gpu}: {mib} MiB used"
                                                      for gpu, mib in over.items())
                      + f" (at most {most} MiB once the job ended)")
    known = [mib for mib in used.values() if mib is not None]
    if not known:
        return Result("gpu_memory", "SKIP", "nvidia-smi does not report memory.used")
    return Result("gpu_memory", "PASS", f"at most {max(known)} MiB used on {len(known)} "
                                        f"GPU(s) (limit {most} MiB)")


def check_gpu_config(run: Run) -> Result:
    """The prolog records the job's GPUs' application clocks, compute mode and MIG mode;
    the epilog compares, then removes the record."""
    if run.job.id is None:
        return Result("gpu_config", "SKIP", "no job number in SLURM_JOB_ID")
    path = job_record_path(run.config, run.job.id)
    if run.context == "epilog":
        try:
            return _compare_record(run, path)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(path)
    rows, ended = _job_gpus_or_skip(run, "gpu_config")
    if ended:
        return ended
    record = {"job": run.job.id, "time": int(time.time()),
              "gpus": {bus_id(r["pci.bus_id"]): {k: r[k] for k in ("index", *SETTINGS)}
                       for r in rows}}
    try:
        write_state(path, record)
    except OSError as exc:
        return Result("gpu_config", "SKIP", f"cannot record for the epilog: {exc}")
    prune_records(os.path.dirname(path))
    return Result("gpu_config", "PASS", f"{len(rows)} GPU(s) recorded for the epilog: "
                  + "; ".join(f"{_gpu(r)} {_settings(r)}" for r in rows))


def _settings(row: dict[str, str]) -> str:
    return (f"clocks {row['clocks.applications.graphics']}/"
            f"{row['clocks.applications.memory']} MHz, compute mode {row['compute_mode']}, "
            f"MIG {row['mig.mode.current']}")


def _compare_record(run: Run, path: str) -> Result:
    rows, ended = _job_gpus_or_skip(run, "gpu_config")
    if ended:
        return ended
    record, why = read_state(path)
    recorded = record.get("gpus")
    if not isinstance(recorded, dict):
        return Result("gpu_config", "SKIP", f"no record of {run.job.name} ({path} "
                                            f"{why or 'has no GPUs'})")
    changed = []
    for row in rows:
        was = recorded.get(bus_id(row["pci.bus_id"]))
        if not isinstance(was, dict):
            continue
        diffs = [f"{k} {row[k]}, recorded {was.get(k)}" for k in SETTINGS
                 if str(was.get(k)) != row[k]]
        if diffs:
            changed.append(f"{_gpu(row)}: " + ", ".join(diffs))
    if changed:
        return Result("gpu_config", "FAIL", "; ".join(changed))
    return Result("gpu_config", "PASS", f"as the prolog recorded on {len(rows)} GPU(s)")


def kernel_log(deadline: Deadline) -> tuple[str | None, str]:
    """The kernel log since boot (dmesg, else journalctl -k -b), or None and why not."""
    reasons = []
    for argv in (["dmesg"],
                 ["journalctl", "-k", "-b", "-q", "--no-pager", "-o", "short-monotonic"]):
        out = run(argv, deadline, 2.0)
        if out is not None and out.rc == 0:
            return out.text, ""
        reasons.append(f"{argv[0]}: " + ("not found" if out is None else last_line(out.text)))
    return None, "; ".join(reasons)


@dataclass(frozen=True)
class XidVerdict:
    """One Xid event judged in the context of the others: its action class here, the
    resolution shown (NVIDIA's immediate action, or the recovery action an Xid 154 names),
    its name, and why the class differs from the catalogue's (empty when it does not)."""

    event: XidEvent
    action: str
    resolution: str
    name: str
    why: str

    def shown(self) -> str:
        why = f": {self.why}" if self.why else ""
        return (f"Xid {self.event.xid} on {self.event.pci} ({self.name}): {self.resolution} "
                f"[{self.action}{why}]")


def xid_recovery_action(message: str) -> tuple[str, str] | None:
    """(class, action text) an Xid 154 message asks for (``... to 0x2 (Node Reboot
    Required)``): reboot; a reset, an FLR or a drain: reset; None: ignore. None when the
    message names no action."""
    match = _XID_RECOVERY.search(message)
    if not match:
        return None
    text = match.group(1).strip()
    lower = text.lower()
    if "reboot" in lower:
        return "reboot", text
    if any(word in lower for word in ("reset", "flr", "drain")):
        return "reset", text
    return ("ignore" if lower == "none" else "reset"), text


def _xid_alone(event: XidEvent) -> tuple[str, str, str, str]:
    action, resolution, name = XID_CATALOGUE.get(event.xid, XID_UNKNOWN)
    asked = xid_recovery_action(event.message) if event.xid == 154 else None
    if asked:
        return asked[0], asked[1], name, ""
    if 144 <= event.xid <= 150 and _XID_NONFATAL.match(event.message):
        return "application", resolution, name, "Nonfatal"
    return action, resolution, name, ""


def _xid_bursts(times: list[float]) -> dict[float, float]:
    """Each time's burst start: a time within XID_BURST_S of the one before joins its burst."""
    starts: dict[float, float] = {}
    for i, at in enumerate(times):
        starts[at] = starts[times[i - 1]] if i and at - times[i - 1] <= XID_BURST_S else at
    return starts


def judge_xids(events: list[XidEvent]) -> list[XidVerdict]:
    """Each event's verdict, in order: the catalogue's class, Xid 154's recovery action, an
    NVLink Xid 144-150 the driver calls Nonfatal as an application one, and an application
    Xid's XID_REPEATS-th burst on one GPU within XID_REPEAT_WINDOW_S as a reset (events
    without a stamp never escalate)."""
    judged = [(e, *_xid_alone(e)) for e in events]
    timed: dict[tuple[str, int], list[float]] = {}
    for e, action, *_ in judged:
        if action == "application" and e.stamp is not None:
            timed.setdefault((e.pci, e.xid), []).append(e.stamp)
    bursts = {key: _xid_bursts(sorted(times)) for key, times in timed.items()}
    distinct = {key: sorted(set(starts.values())) for key, starts in bursts.items()}
    verdicts = []
    for e, action, resolution, name, why in judged:
        if action == "application" and e.stamp is not None:
            start, all_starts = bursts[(e.pci, e.xid)][e.stamp], distinct[(e.pci, e.xid)]
            seen = (bisect.bisect_right(all_starts, start)
                    - bisect.bisect_right(all_starts, start - XID_REPEAT_WINDOW_S))
            if seen >= XID_REPEATS:
                verdicts.append(XidVerdict(e, "reset", resolution, name, f"{seen} times in "
                                           f"{XID_REPEAT_WINDOW_S / 3600:g} h on this GPU"))
                continue
        verdicts.append(XidVerdict(e, action, resolution, name, why))
    return verdicts


def _xid_failing(verdicts: list[XidVerdict], forced: set[int]) -> list[XidVerdict]:
    """The verdicts that drain (a reset, reboot or hardware class, or an Xid the site lists in
    critical_xids), the class needing the most first."""
    bad = []
    for v in verdicts:
        if v.action in XID_DRAINS:
            bad.append(v)
        elif v.event.xid in forced:
            bad.append(replace(v, why="; ".join(filter(None, (v.why, "in critical_xids")))))
    return sorted(bad, key=lambda v: -XID_CLASSES.index(v.action))


def check_xid(run: Run) -> Result:
    """Xid events that drain, judged by NVIDIA's catalogue in context: since boot
    (periodic), or newer than the newest a prolog saw before (prolog)."""
    text, why = kernel_log(run.deadline)
    if text is None:
        return Result("xid", "FAIL", "kernel log unreadable: " + why)
    forced = set(run.config["critical_xids"])
    events = parse_xid_events(text)
    verdicts = judge_xids(events)
    if run.context == "prolog":
        return _xid_since_gate(run.config, events, verdicts, forced)
    bad = _xid_failing(verdicts, forced)
    if bad:
        return Result("xid", "FAIL", _xid_shown(bad))
    return Result("xid", "PASS", f"no Xid that drains since boot ({len(events)} Xid event(s) "
                                 "in all)")


def _xid_shown(bad: list[XidVerdict]) -> str:
    more = f" (+{len(bad) - 1} more)" if len(bad) > 1 else ""
    return bad[0].shown() + more


def new_xid_events(events: list[XidEvent], gate: dict[str, Any], boot: str) -> list[XidEvent]:
    """The events after the newest one gate.json holds: all of them after a reboot or
    without a gate; after that event's last appearance when the log still holds it; else
    (the log rotated) those stamped later, and those without a stamp."""
    seen = gate.get("xid")
    if gate.get("boot_id") != boot or not isinstance(seen, dict):
        return events
    for i in range(len(events) - 1, -1, -1):
        if events[i].line == seen.get("line") and events[i].stamp == seen.get("stamp"):
            return events[i + 1:]
    stamp = seen.get("stamp")
    if isinstance(stamp, (int, float)) and not isinstance(stamp, bool):
        return [e for e in events if e.stamp is None or e.stamp > stamp]
    return events


def _xid_since_gate(config: dict[str, Any], events: list[XidEvent],
                    verdicts: list[XidVerdict], forced: set[int]) -> Result:
    path = gate_path(config)
    gate, why = read_state(path)
    boot = boot_id()
    new = new_xid_events(events, gate, boot)
    notes = [f"{path} {why}"] if why and why != "absent" else []
    if new:
        newest = {"stamp": new[-1].stamp, "line": new[-1].line}
        try:
            write_state(path, {"boot_id": boot, "xid": newest})
        except OSError as exc:
            notes.append(f"gate not saved: {exc}")
    note = "".join(f"; {n}" for n in notes)
    fresh = {id(e) for e in new}
    bad = _xid_failing([v for v in verdicts if id(v.event) in fresh], forced)
    if bad:
        return Result("xid", "FAIL", f"new since the last prolog: {_xid_shown(bad)}{note}")
    return Result("xid", "PASS", f"no new Xid that drains ({len(new)} new Xid event(s), "
                                 f"{len(events)} since boot){note}")


def check_fabric_ports(run: Run) -> Result:
    """Every InfiniBand/RoCE port (``fabric_ports``: those named, ``mlx5_0/1``) is ACTIVE."""
    found: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for device in sorted(os.listdir(INFINIBAND_DIR)):
            ports = os.path.join(INFINIBAND_DIR, device, "ports")
            with contextlib.suppress(OSError):
                for port in sorted(os.listdir(ports), key=lambda p: (len(p), p)):
                    found[f"{device}/{port}"] = _port_state(os.path.join(ports, port, "state"))
    wanted = run.config["fabric_ports"]
    if wanted is None and not found:
        return Result("fabric_ports", "SKIP", f"no InfiniBand/RoCE port in {INFINIBAND_DIR}")
    if not (wanted if wanted is not None else found):
        return Result("fabric_ports", "SKIP", "fabric_ports is empty")
    names = list(wanted) if wanted is not None else list(found)
    bad = [f"{n} {found.get(n, 'absent')}" for n in names if found.get(n) != "ACTIVE"]
    if bad:
        return Result("fabric_ports", "FAIL", "not ACTIVE: " + ", ".join(bad))
    return Result("fabric_ports", "PASS", f"{len(names)} port(s) ACTIVE: " + ", ".join(names))


def _port_state(path: str) -> str:
    """``ACTIVE`` from ``4: ACTIVE``; ``unreadable`` when the file cannot be read."""
    try:
        with open(path) as fh:
            return fh.read().strip().split(":")[-1].strip() or "empty"
    except OSError:
        return "unreadable"


WATCH_STATUSES = ("pending", "open", "silenced")


def parse_watch_report(text: str) -> dict[str, Any]:
    """gpufleet-watch's ``--json`` report, checked for what the watch check reads: a version
    1 object whose ``findings`` each have a string ``id`` and ``message`` and a known
    ``status``. Raises ValueError, saying what is wrong, for anything else (too long, not
    JSON, another shape)."""
    if len(text) > WATCH_LIMIT:
        raise ValueError(f"a report of {len(text)} characters, more than {WATCH_LIMIT}")
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        shown = _one_line(text)[:60]
        raise ValueError(f"not a JSON report: {shown}" if shown else "no report") from None
    if not isinstance(data, dict) or data.get("version") != 1:
        raise ValueError("not a version 1 report")
    findings = data.get("findings")
    if not isinstance(findings, list):
        raise ValueError("a report without a findings list")
    for finding in findings:
        if not (isinstance(finding, dict) and isinstance(finding.get("id"), str)
                and isinstance(finding.get("message"), str)
                and finding.get("status") in WATCH_STATUSES):
            raise ValueError(f"a finding without an id, a message or a known status: "
                             f"{_one_line(json.dumps(finding))[:80]}")
    return data


def watch_result(text: str) -> Result:
    """The watch check's verdict on a ``--json`` report: FAIL with the first open finding's
    message (and how many more are open), else PASS naming the silenced findings and when
    their silences end."""
    try:
        report = parse_watch_report(text)
    except ValueError as exc:
        return Result("watch", "FAIL", f"gpufleet-watch answered no usable report: {exc}")
    findings = report["findings"]
    opened = [f for f in findings if f["status"] == "open"]
    if opened:
        more = f" (+{len(opened) - 1} more)" if len(opened) > 1 else ""
        shown = _one_line(opened[0]["message"])[:MESSAGE_LIMIT - len(more)].rstrip()
        return Result("watch", "FAIL", (shown or opened[0]["id"]) + more)
    series = report.get("series")
    counts = [f"{series} series" if _count(series) and not isinstance(series, bool)
              else "series unknown",
              f"{sum(f['status'] == 'pending' for f in findings)} pending"]
    silenced = [f for f in findings if f["status"] == "silenced"]
    parts = [", ".join(counts)]
    if silenced:
        named = [f"{f['id']} until {_until(f.get('silenced_until'))}"
                 for f in silenced[:WATCH_SHOWN]]
        extra = f" (+{len(silenced) - WATCH_SHOWN} more)" if len(silenced) > WATCH_SHOWN else ""
        parts.append("silenced: " + ", ".join(named) + extra)
    notes = report.get("notes")
    if isinstance(notes, list) and notes:
        parts.append(f"{len(notes)} note(s): {_one_line(str(notes[0]))[:120]}")
    return Result("watch", "PASS", "; ".join(parts))


def _until(value: Any) -> str:
    """A silence's end as UTC minutes, ``unknown`` when it is not a time."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "unknown"
    try:
        return time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime(value))
    except (OverflowError, OSError, ValueError):
        return "unknown"


def check_watch(r: Run) -> Result:
    """gpufleet-watch's observation (``watch_program --config watch_config --json``, with
    all the time left of the checks' budget): FAIL while it reports an open finding."""
    program = r.config["watch_program"]
    if program is None:
        return Result("watch", "SKIP", "no watch_program configured")
    argv = [program, *(["--config", r.config["watch_config"]]
                       if r.config["watch_config"] else []), "--json"]
    if r.now is not None:
        argv += ["--now", f"{r.now:.3f}"]
    return watch_answer(program, run(argv, r.deadline, r.deadline.budget, apart=True))


def watch_answer(program: str, out: Output | None) -> Result:
    """The watch check's verdict on how the program ran and what it printed."""
    name = os.path.basename(program)
    if out is None:
        return Result("watch", "FAIL", f"{program} not found")
    if out.rc is None:
        return Result("watch", "FAIL", f"{name} {out.text}")
    if out.rc == EXIT_USAGE:
        return Result("watch", "FAIL", f"{name}: bad configuration: "
                                       f"{_one_line(last_line(out.errors))[:120]}")
    if out.rc not in (0, EXIT_FAILED) or not out.text.strip():
        return Result("watch", "FAIL", f"{name} exited {out.rc} without a report: "
                                       f"{_one_line(last_line(out.errors))[:120]}")
    return watch_result(out.text)


def check_memlock(run: Run) -> Result:
    """The prolog's RLIMIT_MEMLOCK: slurmd's, which a job gets when Slurm does not propagate
    the submitter's; RDMA (NCCL over InfiniBand) pins memory, so unlimited, or at least
    ``job_memlock_min_kib``."""
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    least = run.config["job_memlock_min_kib"]

    def shown(limit: int) -> str:
        return "unlimited" if limit == resource.RLIM_INFINITY else f"{limit // 1024} KiB"

    if soft == resource.RLIM_INFINITY:
        return Result("memlock", "PASS", "unlimited")
    if least is not None and soft >= least * 1024:
        return Result("memlock", "PASS", f"{shown(soft)}, at least {least} KiB")
    want = "unlimited" if least is None else f"at least {least} KiB"
    return Result("memlock", "FAIL", f"{shown(soft)} (hard limit {shown(hard)}), {want} "
                                     "needed: slurmd's limit, which jobs get")


def loaded_driver() -> str:
    try:
        with open(DRIVER_VERSION_FILE) as fh:
            match = _MODULE.search(fh.read())
    except OSError:
        return "absent"
    return match.group(1) if match else "absent"


def installed_nccl(deadline: Deadline) -> str | None:
    """libnccl2's installed version, ``absent``, or None when dpkg cannot say."""
    out = run(["dpkg-query", "-W", "-f=${db:Status-Abbrev} ${Version}", "libnccl2"],
              deadline, 2.0)
    if out is None or out.rc is None:
        return None
    fields = out.text.split()
    if out.rc == 0 and len(fields) == 2 and fields[0][1:2] == "i":
        return fields[1]
    return "absent"


def version_result(check: str, recorded: dict[str, Any] | None, state_file: str,
                   deadline: Deadline) -> Result:
    """The driver or NCCL version against the one bootstrap recorded."""
    if recorded is None:
        return Result(check, "SKIP", f"no recorded state ({state_file} absent: node not "
                                     "bootstrapped)")
    want = recorded.get(check)
    if want is None:
        return Result(check, "SKIP", f"no {check} version in {state_file}")
    actual = loaded_driver() if check == "driver" else installed_nccl(deadline)
    if actual is None:
        return Result(check, "FAIL", "dpkg-query did not answer in time")
    if actual == want:
        return Result(check, "PASS", f"{actual}, as recorded")
    return Result(check, "FAIL", f"{actual}, recorded {want}")


def check_versions(recorded: dict[str, Any] | None, state_file: str,
                   deadline: Deadline) -> list[Result]:
    """The driver and NCCL versions against those bootstrap recorded."""
    return [version_result(check, recorded, state_file, deadline)
            for check in ("driver", "nccl")]


def check_port_range(config: dict[str, Any], recorded: dict[str, Any] | None) -> Result:
    """The live local port range against the configured, else the recorded, range."""
    wanted = config["port_range"] or (recorded or {}).get("port_range")
    if not wanted or wanted == "absent":
        return Result("port_range", "SKIP", "no expected or recorded port range")
    try:
        with open(PORT_RANGE_FILE) as fh:
            live = parse_port_range(fh.read())
        want = parse_port_range(str(wanted))
    except (OSError, ValueError) as exc:
        return Result("port_range", "FAIL", str(exc))
    shown = f"{live[0]}-{live[1]}"
    if live != want:
        return Result("port_range", "FAIL", f"{shown}, expected {want[0]}-{want[1]}")
    return Result("port_range", "PASS", shown)


# ---- the clock (time_sync) -------------------------------------------------------------------
# chronyc's and timedatectl's readers as gpufleet/facts/parsers/timesync.py has them, in the
# form this program needs (tests/unit/test_healthcheck_time_sync.py holds them to the same
# captures); the bound's default is the slurm_healthcheck role's (held equal there too).

TIME_TOOL_S = 2.0
SYSTEMD_DIR = "/run/systemd/system"
TIMESYNC_DIR = "/run/systemd/timesync"
_CHRONY_FIELD = re.compile(r"^\s*(System time|Leap status)\s*:\s*(.*?)\s*$", re.MULTILINE)
_CHRONY_OFFSET = re.compile(r"^(\d+(?:\.\d+)?) seconds (fast|slow) of NTP time$")
_TIMESYNC_OFFSET = re.compile(r"^\s*Offset:\s*(\S.*?)\s*$", re.MULTILINE)
_TIMESPAN = re.compile(r"(\d+(?:\.\d+)?)(ns|us|\u00b5s|ms|s|min|h|d)")
_TIMESPAN_S = {"ns": 1e-9, "us": 1e-6, "\u00b5s": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0,
               "h": 3600.0, "d": 86400.0}


def parse_chronyc_tracking(text: str) -> tuple[bool, float]:
    """``chronyc tracking``: (synchronised: the leap status is not "Not synchronised", the
    offset in seconds: positive when the clock is ahead of NTP time)."""
    fields = dict(_CHRONY_FIELD.findall(text))
    offset = _CHRONY_OFFSET.match(fields.get("System time", ""))
    if offset is None or not fields.get("Leap status"):
        raise ValueError(f"not chronyc tracking's report: {last_line(text)}")
    seconds = float(offset.group(1)) * (1 if offset.group(2) == "fast" else -1)
    return fields["Leap status"] != "Not synchronised", seconds


def parse_timesync_offset(text: str) -> float | None:
    """``timedatectl timesync-status``'s Offset in seconds (``-1.087495s``, ``+1.024ms``),
    or None before its first exchange."""
    found = _TIMESYNC_OFFSET.search(text)
    if found is None:
        return None
    value = found.group(1)
    body = value.lstrip("+-").replace(" ", "")
    parts = _TIMESPAN.findall(body)
    if not body or "".join(n + u for n, u in parts) != body:
        raise ValueError(f"timesync-status: an offset that is not a time span: {value!r}")
    return (-1 if value.startswith("-") else 1) * sum(float(n) * _TIMESPAN_S[u]
                                                      for n, u in parts)


def _clock(deadline: Deadline) -> tuple[str, bool, float | None] | Result:
    """(source, synchronised, offset in seconds or None) from chronyd where it answers,
    else from systemd; a Result where neither can say."""
    chrony = run(["chronyc", "-n", "tracking"], deadline, TIME_TOOL_S)
    if chrony is not None and chrony.rc == 0:
        try:
            return ("chrony", *parse_chronyc_tracking(chrony.text))
        except ValueError as exc:
            return Result("time_sync", "FAIL", f"chronyc: {exc}")
    if os.path.isdir(SYSTEMD_DIR):
        return _systemd_clock(deadline)
    said = "no chronyc" if chrony is None else f"chronyc: {last_line(chrony.text)}"
    return Result("time_sync", "SKIP", f"no time service answers ({said}; systemd does not "
                                       "run)")


def _systemd_clock(deadline: Deadline) -> tuple[str, bool, float | None] | Result:
    """systemd's synchronised flag and, where systemd-timesyncd runs, its last offset."""
    flag = run(["timedatectl", "show", "-p", "NTPSynchronized", "--value"], deadline,
               TIME_TOOL_S)
    if flag is None or flag.rc != 0 or flag.text.strip() not in ("yes", "no"):
        said = "not found" if flag is None else last_line(flag.text)
        return Result("time_sync", "FAIL", f"timedatectl show: {said}")
    synchronised = flag.text.strip() == "yes"
    status = (run(["timedatectl", "timesync-status"], deadline, TIME_TOOL_S)
              if os.path.isdir(TIMESYNC_DIR) else None)
    if status is None or status.rc != 0:
        return "systemd", synchronised, None
    try:
        return "systemd-timesyncd", synchronised, parse_timesync_offset(status.text)
    except ValueError as exc:
        return Result("time_sync", "FAIL", str(exc))


def check_time_sync(run: Run) -> Result:
    """The clock synchronised (chronyd, else systemd-timesyncd or another daemon that sets
    the kernel's flag) and within ``time_max_offset_ms`` of its source (null: only
    synchronised). A node with neither chronyd nor systemd to ask is skipped."""
    bound = run.config["time_max_offset_ms"]
    if bound is not None and (isinstance(bound, bool) or not isinstance(bound, (int, float))
                              or bound <= 0):
        return Result("time_sync", "FAIL", f"time_max_offset_ms must be milliseconds above 0 "
                                           f"or null, got {bound!r}")
    clock = _clock(run.deadline)
    return clock if isinstance(clock, Result) else time_verdict(*clock, bound)


def time_verdict(source: str, synchronised: bool, offset: float | None,
                 bound: float | None) -> Result:
    """The clock's verdict from what its source says and the bound (ms, or None)."""
    if not synchronised:
        status, text = "FAIL", f"not synchronised ({source})"
    elif bound is None:
        status, text = "PASS", f"synchronised ({source})"
    elif offset is None:
        status, text = "FAIL", f"synchronised ({source}), with no offset to hold to {bound:g} ms"
    else:
        beyond = abs(offset) * 1000 > bound
        status = "FAIL" if beyond else "PASS"
        text = (f"{offset * 1000:+.3f} ms ({source}), {'beyond' if beyond else 'within'} "
                f"{bound:g} ms")
    return Result("time_sync", status, text)
# ---- RoCE QoS: the roce_qos role's ports keep their trust, PFC and ECN --------------------------

ROCE_QOS_CONFIG = "/etc/gpufleet/roce-qos.json"  # written by gpufleet's roce_qos role
ROCE_QOS_CAP_S = 3.0  # one port's mlnx_qos (a Python program) or dcb; the ports run at once
# What gpufleet/facts/parsers/qos.py reads of ``mlnx_qos -i PORT`` and ``dcb -j pfc show dev
# PORT``, in the compact form this program needs: the trust state and the priorities with PFC
# on (tests/unit/test_roce_qos.py holds the two copies together on the captures).
_RQ_START = re.compile(r"^\s*DCBX mode:")
_RQ_TRUST = re.compile(r"^\s*Priority trust state:\s*(\S*)\s*$")
_RQ_HEADER = re.compile(r"^\s*priority((?:\s+\d+)+)\s*$")
_RQ_ENABLED = re.compile(r"^\s*enabled\b(.*)$")


def parse_mlnx_qos(text: str) -> tuple[str, list[int]]:
    """(trust, sorted priorities with PFC on) from ``mlnx_qos -i PORT`` (the last report when
    the text holds several)."""
    lines = [line for line in text.splitlines() if line.strip()]
    starts = [i for i, line in enumerate(lines) if _RQ_START.match(line)]
    trust, header, flags = None, None, None
    for line in lines[starts[-1]:] if starts else lines:
        if match := _RQ_TRUST.match(line):
            trust = match.group(1)
        elif match := _RQ_HEADER.match(line):
            header = [int(t) for t in match.group(1).split()]
        elif match := _RQ_ENABLED.match(line):
            flags = match.group(1).split()
    if trust not in ("pcp", "dscp"):
        raise ValueError(f"mlnx_qos: no trust state pcp or dscp ({trust!r})")
    priorities = header if header is not None else list(range(8))
    if flags is None or len(flags) != len(priorities) or set(flags) - {"0", "1"}:
        raise ValueError("mlnx_qos: no PFC 'enabled' row of 0 and 1 per priority")
    return trust, sorted(p for p, f in zip(priorities, flags, strict=True) if f == "1")


def parse_dcb_pfc(text: str) -> list[int]:
    """Sorted priorities with PFC on from ``dcb -j pfc show dev PORT`` (``prio_pfc`` as a list
    by priority, a list of one-entry objects, or an object by priority)."""
    start = min((i for i in (text.find("{"), text.find("[")) if i >= 0), default=-1)
    if start < 0:
        raise ValueError(f"dcb: no JSON document: {last_line(text)!r}")
    try:
        document, _ = json.JSONDecoder().raw_decode(text[start:])
    except ValueError:
        raise ValueError(f"dcb: not JSON: {last_line(text)!r}") from None
    if isinstance(document, list) and len(document) == 1:
        document = document[0]
    value = document.get("prio_pfc") if isinstance(document, dict) else None
    if isinstance(value, list) and all(isinstance(v, dict) and len(v) == 1 for v in value):
        value = dict(next(iter(v.items())) for v in value)
    items = enumerate(value) if isinstance(value, list) else \
        value.items() if isinstance(value, dict) else None
    if items is None:
        raise ValueError("dcb: no prio_pfc")
    flags = {int(p): v for p, v in items}
    if sorted(flags) != list(range(8)) or \
            not all(v in (True, False, "on", "off") for v in flags.values()):
        raise ValueError("dcb: prio_pfc is not one flag per priority 0..7")
    return sorted(p for p, v in flags.items() if v in (True, "on"))


def run_all(argvs: list[list[str]], deadline: Deadline, cap: float) -> list[Output | None]:
    """``run`` for several commands at once: each gets the same time left (at most ``cap``
    s), so a node's ports cost one tool's time, not one per port."""
    timeout = deadline.left(cap)
    if timeout <= 0:
        return [Output(None, f"not run: no time left of {deadline.budget:g}s") for _ in argvs]
    env = dict(os.environ, PATH=os.environ.get("PATH") or DEFAULT_PATH, LC_ALL="C")
    procs: list[subprocess.Popen[str] | None] = []
    for argv in argvs:
        try:
            procs.append(subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True, env=env,
                                          start_new_session=True))
        except FileNotFoundError:
            procs.append(None)
    end = time.monotonic() + timeout
    outputs: list[Output | None] = []
    for proc in procs:
        if proc is None:
            outputs.append(None)
            continue
        wait = max(0.0, end - time.monotonic())
        if proc.poll() is not None:  # ended in time: only its output is left to read
            wait = max(wait, KILL_GRACE_S)
        try:
            out, _ = proc.communicate(timeout=wait)
            outputs.append(Output(proc.returncode, out))
        except subprocess.TimeoutExpired:
            outputs.append(_stop(proc, f"did not answer within {timeout:.1f}s"))
    return outputs


def _roce_port(port: str, out: Output | None, tool: str, want: dict[str, Any],
               root: str) -> str | None:
    """What differs on one port from the declaration, or None."""
    if out is None or out.rc is None or out.rc != 0:
        why = "not installed" if out is None else out.text.strip() if out.rc is None \
            else f"failed: {last_line(out.text)}"
        return f"{port}: {tool} {why}"
    try:
        trust, pfc = parse_mlnx_qos(out.text) if tool == "mlnx_qos" \
            else (None, parse_dcb_pfc(out.text))
    except ValueError as exc:
        return f"{port}: {exc}"
    found = []
    prio = want.get("pfc_priority")
    if want.get("trust") and tool == "mlnx_qos" and trust != want["trust"]:
        found.append(f"trust {trust}, expected {want['trust']}")
    if prio is not None and pfc != [prio]:
        found.append(f"PFC on {','.join(map(str, pfc)) or 'no priority'}, expected {prio}")
    if want.get("ecn") and prio is not None:
        for kind in ("roce_np", "roce_rp"):
            path = f"{root}/sys/class/net/{port}/ecn/{kind}/enable/{prio}"
            try:
                with open(path) as fh:
                    on = fh.read().strip() == "1"
            except OSError:
                on = False
            if not on:
                found.append(f"ECN {kind} off on priority {prio}")
    return f"{port}: {', '.join(found)}" if found else None


def check_roce_qos(run: Run) -> Result:
    """The RoCE QoS the roce_qos role declared (ROCE_QOS_CONFIG) on every one of its ports:
    trust (with mlnx_qos), PFC on the declared priority alone, ECN on it; a NIC forgets them at
    a reboot. mlnx_qos is asked, else dcb (PFC only), every port at once."""
    try:
        want = load_json(ROCE_QOS_CONFIG, "the RoCE QoS declaration")
    except ConfigError as exc:
        return Result("roce_qos", "FAIL", str(exc))
    if not want or not want.get("ports"):
        return Result("roce_qos", "SKIP", f"no RoCE QoS declared ({ROCE_QOS_CONFIG})")
    ports = [str(p) for p in want["ports"]]
    root = str(want.get("root") or "/").rstrip("/")
    tool = "mlnx_qos"
    outputs = run_all([["mlnx_qos", "-i", p] for p in ports], run.deadline, ROCE_QOS_CAP_S)
    if all(out is None for out in outputs):
        tool = "dcb"
        outputs = run_all([["dcb", "-j", "pfc", "show", "dev", p] for p in ports],
                          run.deadline, ROCE_QOS_CAP_S)
        if all(out is None for out in outputs):
            return Result("roce_qos", "FAIL", "neither mlnx_qos nor dcb is installed")
    found = [problem for port, out in zip(ports, outputs, strict=True)
             if (problem := _roce_port(port, out, tool, want, root))]
    if found:
        return Result("roce_qos", "FAIL", "; ".join(found))
    return Result("roce_qos", "PASS", f"{len(ports)} port(s) as declared ({tool})")


# ---- the catalogue ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Check:
    """One check: its name (the finding's id), the contexts it runs in, and what it does."""

    name: str
    contexts: tuple[str, ...]
    func: Callable[[Run], Result]


CATALOGUE = (
    Check("gpus", ("periodic", "prolog"), check_gpus),
    Check("gpu_processes", ("prolog", "epilog"), check_gpu_processes),
    Check("ecc", ("periodic", "prolog"), check_ecc),
    Check("gpu_memory", ("epilog",), check_gpu_memory),
    Check("xid", ("periodic", "prolog"), check_xid),
    Check("driver", ("periodic",),
          lambda r: version_result("driver", r.recorded, r.config["state_file"], r.deadline)),
    Check("nccl", ("periodic",),
          lambda r: version_result("nccl", r.recorded, r.config["state_file"], r.deadline)),
    Check("port_range", ("periodic",), lambda r: check_port_range(r.config, r.recorded)),
    Check("fabric_ports", ("prolog",), check_fabric_ports),
    Check("memlock", ("prolog",), check_memlock),
    Check("gpu_config", ("prolog", "epilog"), check_gpu_config),
    Check("watch", ("periodic",), check_watch),
    Check("time_sync", ("periodic",), check_time_sync),
    Check("roce_qos", ("periodic",), check_roce_qos),
)


def run_checks(run: Run) -> list[Result]:
    """Every check of the catalogue tagged with the run's context, in catalogue order."""
    return [check.func(run) for check in CATALOGUE if run.context in check.contexts]


# ---- configuration and recorded state --------------------------------------------------------

def load_json(path: str, what: str) -> dict[str, Any] | None:
    """A JSON object from ``path``; None when the file does not exist."""
    try:
        with open(path) as fh:
            data = json.load(fh)
    except FileNotFoundError:
        return None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path} line {exc.lineno}: {what} is not valid JSON: "
                          f"{exc.msg}") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read {what}: {exc.strerror}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: {what} must be a JSON object")
    return data


def _seconds(value: Any, least: float) -> bool:
    return isinstance(value, (int, float)) and value >= least


def _count(value: Any, optional: bool = False) -> bool:
    return (optional and value is None) or (isinstance(value, int) and value >= 0)


def _absolute(value: Any) -> bool:
    return isinstance(value, str) and value.startswith("/")


def load_config(path: str) -> dict[str, Any]:
    """The defaults overlaid with the configuration file; unknown or mistyped keys fail."""
    data = load_json(path, "the health check configuration") or {}
    config = dict(DEFAULTS)
    for key, value in data.items():
        if key.startswith("_"):
            continue
        if key not in DEFAULTS:
            raise ConfigError(f"{path}: unknown key {key!r} (known: {', '.join(DEFAULTS)})")
        config[key] = value
    ports = config["fabric_ports"]
    checks = {
        "gpu_count": _count(config["gpu_count"], optional=True),
        "critical_xids": isinstance(config["critical_xids"], list)
        and all(isinstance(x, int) for x in config["critical_xids"]),
        "port_range": config["port_range"] is None or isinstance(config["port_range"], str),
        "state_file": isinstance(config["state_file"], str),
        "nvidia_smi_timeout_s": _seconds(config["nvidia_smi_timeout_s"], 0),
        "budget_s": _seconds(config["budget_s"], 0) and config["budget_s"] > SLURM_RESERVE_S,
        "syslog_socket": config["syslog_socket"] is None
        or isinstance(config["syslog_socket"], str),
        "prolog_budget_s": _seconds(config["prolog_budget_s"], 0)
        and config["prolog_budget_s"] > JOB_RESERVE_S,
        "epilog_budget_s": _seconds(config["epilog_budget_s"], 0)
        and config["epilog_budget_s"] > JOB_RESERVE_S,
        "epilog_kill_grace_s": _seconds(config["epilog_kill_grace_s"], 0),
        "epilog_max_used_mib": _count(config["epilog_max_used_mib"]),
        "job_memlock_min_kib": _count(config["job_memlock_min_kib"], optional=True),
        "fabric_ports": ports is None or (isinstance(ports, list) and all(
            isinstance(p, str) and _PORT.match(p) for p in ports)),
        "state_dir": _absolute(config["state_dir"]),
        "watch_program": config["watch_program"] is None or _absolute(config["watch_program"]),
        "watch_config": config["watch_config"] is None or _absolute(config["watch_config"]),
    }
    for key, ok in checks.items():
        if not ok or isinstance(config[key], bool):
            raise ConfigError(f"{path}: {key} has a wrong type or value: {config[key]!r}")
    return config


def recorded_versions(state_file: str) -> dict[str, Any] | None:
    """The ``versions`` bootstrap recorded in node.json, or None without a state file."""
    state = load_json(state_file, "the recorded node state")
    if state is None:
        return None
    versions = state.get("versions")
    if not isinstance(versions, dict):
        raise ConfigError(f"{state_file}: no 'versions' object")
    return versions


# ---- drain and resume ------------------------------------------------------------------------

def node_state(node: str, deadline: Deadline) -> tuple[str, str | None]:
    """The node's Slurm state and reason."""
    out = run(["scontrol", "--oneliner", "show", "node", node], deadline, 4.0)
    if out is None:
        raise SlurmUnavailable("scontrol not found; cannot drain or resume")
    if out.rc != 0:
        raise SlurmUnavailable(f"cannot read node {node}: {last_line(out.text)}")
    try:
        return parse_slurm_node(out.text)
    except ValueError as exc:
        raise SlurmUnavailable(str(exc)) from None


def slurm_action(node: str, results: list[Result], deadline: Deadline, letter: str = "h",
                 clears: str = "hpe") -> tuple[str, bool]:
    """Keep the run's findings in the node's drain reason: drain for a new one, resume once
    no finding of anyone's is left (``clears`` empty: never); the line to print and
    whether scontrol did what was needed."""
    try:
        state, reason = node_state(node, deadline)
    except SlurmUnavailable as exc:
        return f"slurm: {exc}", False
    held = "DRAIN" in state.split("+")[1:] or state.split("+")[0] == "DOWN"
    wanted, ours = reconcile_reason(reason if held else None, results, time.time(), letter,
                                    clears)
    if not ours:
        return f"slurm: {node} left alone: drained by someone else: {reason}", True
    if wanted is None:
        if held and clears:
            return _update(node, "resume", ["state=resume"], f"was {reason}", deadline)
        return f"slurm: {node} {state}", True
    if held and reason == wanted:
        return f"slurm: {node} already drained: {reason}", True
    return _update(node, "drain", ["state=drain", f"reason={wanted}"], wanted, deadline)


def _update(node: str, verb: str, args: list[str], detail: str,
            deadline: Deadline) -> tuple[str, bool]:
    out = run(["scontrol", "update", f"nodename={node}", *args], deadline, 4.0)
    if out is None or out.rc != 0:
        why = "scontrol not found" if out is None else last_line(out.text)
        return f"slurm: could not {verb} {node}: {why}", False
    return f"slurm: {verb.rstrip('e')}ed {node}: {detail}", True


# ---- main ------------------------------------------------------------------------------------

def context_of(chosen: str | None, program: str) -> str:
    """``--context``, else the name the program was run by, else periodic."""
    return chosen or BY_NAME.get(os.path.basename(program), "periodic")


def main(argv: list[str] | None = None, program: str | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpufleet-healthcheck",
                                     description="Node-local GPU node checks for Slurm's "
                                                 "health check, prolog and epilog.")
    parser.add_argument("--config", default=CONFIG, help=f"expectations (default {CONFIG})")
    parser.add_argument("--context", choices=CONTEXTS,
                        help="which checks to run (default: from the program's name, "
                             "gpufleet-prolog or gpufleet-epilog, else periodic)")
    parser.add_argument("--drain", action="store_true",
                        help="drain this node in Slurm on failure, resume it when healthy")
    parser.add_argument("--no-drain", action="store_true",
                        help="only report, even when run by slurmd")
    parser.add_argument("--node", help="Slurm node name (default: SLURMD_NODENAME or the "
                                       "short host name)")
    parser.add_argument("--now", type=float, metavar="UNIX",
                        help="the time gpufleet-watch judges its counters at (passed on as "
                             "its --now; default: the clock)")
    args = parser.parse_args(argv)
    context = context_of(args.context, program or sys.argv[0])
    started = time.monotonic()
    try:
        config = load_config(args.config)
        recorded = recorded_versions(config["state_file"]) if context == "periodic" else None
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    budget = float(config[BUDGET_OF[context]])
    reserve = RESERVE_OF[context]
    job = job_from_env(dict(os.environ)) if context != "periodic" else Job(None, ())
    results = run_checks(Run(context, config, Deadline(budget - reserve), job, recorded,
                             args.now))
    for result in results:
        print(result.line())
    ok = True
    slurm: list[str] = []
    node = args.node or os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    failed = [r.line() for r in results if r.status == "FAIL"]
    if ((args.drain or os.environ.get("SLURMD_NODENAME")) and not args.no_drain
            and (context == "periodic" or failed)):
        left = budget - (time.monotonic() - started)
        line, ok = slurm_action(node, results, Deadline(max(left, reserve)),
                                LETTER_OF[context], "hpe" if context == "periodic" else "")
        print(line)
        slurm.append(line)
    counts = {s: sum(r.status == s for r in results) for s in ("FAIL", "PASS", "SKIP")}
    subject = f"{node} {job.name}" if context != "periodic" else node
    verdict = (f"{LABEL_OF[context]} {subject}: {counts['FAIL']} failed, {counts['PASS']} "
               f"passed, {counts['SKIP']} skipped in {time.monotonic() - started:.2f}s")
    print(verdict)
    if config["syslog_socket"]:
        log_verdict(config["syslog_socket"], "; ".join([verdict, *failed, *slurm]),
                    bool(failed) or not ok, TAG_OF[context])
    return EXIT_FAILED if counts["FAIL"] or not ok else 0


def log_verdict(address: str, message: str, error: bool, tag: str = SYSLOG_TAG) -> None:
    """The run's verdict to syslog (facility daemon, tag gpufleet-healthcheck,
    gpufleet-prolog or gpufleet-epilog, priority err when a check failed, else info), as
    one datagram; slurmd discards the program's output, so this is where an operator finds
    every run. A missing syslog socket costs nothing."""
    priority = SYSLOG_FACILITY * 8 + (SYSLOG_ERR if error else SYSLOG_INFO)
    text = _one_line(message).encode()[:SYSLOG_LIMIT].decode(errors="ignore")
    packet = f"<{priority}>{tag}[{os.getpid()}]: {text}".encode()
    with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as out:
        out.settimeout(0.5)
        out.sendto(packet, address)


if __name__ == "__main__":
    sys.exit(main())
