#!/usr/bin/python3
"""gpufleet-healthcheck: the fast node-local checks, suitable as Slurm's HealthCheckProgram.

Runs on the node with the standard library only (no gpufleet install), in under 10 s:

  gpus        nvidia-smi answers within its deadline and sees the expected GPU count
  ecc         no uncorrectable ECC error since the driver loaded, no row remapping pending
              or failed
  xid         no critical Xid event in the kernel log since boot
  driver      the loaded NVIDIA kernel module is the version bootstrap recorded
  nccl        the installed libnccl2 is the version bootstrap recorded
  port_range  net.ipv4.ip_local_port_range is the expected (or recorded) range

It prints one line per check (PASS, FAIL or SKIP) and exits 1 when a check failed, 2 on a
bad configuration. The checks get ``budget_s`` (9 s) less 3 s, which stay for scontrol,
so a hung nvidia-smi still leaves time to drain the node.

With --drain, or when slurmd runs it (SLURMD_NODENAME is set), it keeps its findings in
the node's drain reason, beside gpufleet's other findings (a failed conformance check, a
drifted role) in the format of gpufleet/slurm/findings.py, which this program carries a
copy of: a failed check adds its finding (the reason then starts ``gf hc/<check>: ...``),
a check that passes again clears only its own, and the node is resumed once no finding of
anyone's is left. A node that an operator drained is left alone.

Expectations come from a JSON file (default /etc/gpufleet/healthcheck.json, written by
gpufleet's slurm_healthcheck role) and the node's recorded state /etc/gpufleet/node.json
(written by bootstrap).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

CONFIG = "/etc/gpufleet/healthcheck.json"
DEFAULTS: dict[str, Any] = {
    "gpu_count": None,
    "critical_xids": [48, 56, 57, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 140],
    "port_range": None,
    "state_file": "/etc/gpufleet/node.json",
    "nvidia_smi_timeout_s": 4.0,
    "budget_s": 9.0,
    "syslog_socket": "/dev/log",
}
DRIVER_VERSION_FILE = "/proc/driver/nvidia/version"
PORT_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
GPU_QUERY = ("index,pci.bus_id,name,ecc.errors.uncorrected.volatile.total,"
             "remapped_rows.pending,remapped_rows.failure")
SLURM_RESERVE_S = 3.0
KILL_GRACE_S = 0.5  # after SIGKILL: a tool still not ended by then is left behind
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
           "p": "prolog", "e": "epilog"}
LABELS = {"c": "", "d": "drift/", "h": "hc/", "b": "bootstrap/", "p": "prolog/",
          "e": "epilog/"}
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
_MODULE = re.compile(r"Kernel Module(?:\s+for\s+\S+)?\s+(\d+(?:\.\d+)+)")
_STATE = re.compile(r"(?:^|\s)State=(\S+)")
_REASON = re.compile(r"\sReason=(.*?)(?: \[[^\]\s]*@[^\]\s]+\])?(?: (?:Comment|Extra)=.*)?$")


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
    """A command's exit status and output; rc None: it did not finish in time (the text
    says so)."""

    rc: int | None
    text: str


def run(argv: list[str], deadline: Deadline, cap: float) -> Output | None:
    """Run ``argv`` with the time left (at most ``cap`` s); None when it is not installed."""
    timeout = deadline.left(cap)
    if timeout <= 0:
        return Output(None, f"not run: no time left of {deadline.budget:g}s")
    env = dict(os.environ, PATH=os.environ.get("PATH") or DEFAULT_PATH, LC_ALL="C")
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, env=env,
                                start_new_session=True)
    except FileNotFoundError:
        return None
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        return _stop(proc, f"did not answer within {timeout:.1f}s")
    return Output(proc.returncode, out)


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
        if proc.stdout is not None:
            proc.stdout.close()
        return Output(None, f"hung: {why}, and did not end when killed")
    return Output(None, why)


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


# ---- parsers ---------------------------------------------------------------------------------

def parse_gpus(text: str) -> list[dict[str, str]]:
    """Rows of ``nvidia-smi --query-gpu=GPU_QUERY --format=csv,noheader,nounits``."""
    keys = GPU_QUERY.split(",")
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        values = [v.strip() for v in line.split(",")]
        if len(values) != len(keys):
            raise ValueError(f"unexpected nvidia-smi line {line.strip()[:80]!r}")
        rows.append({key: values[i] for i, key in enumerate(keys)})
    return rows


def parse_xids(text: str) -> list[tuple[str, int, str]]:
    """(PCI address, Xid, message) of every ``NVRM: Xid`` line of a kernel log."""
    events = []
    for line in text.splitlines():
        match = _XID.search(line)
        if match:
            events.append((match.group(1).lower(), int(match.group(2)),
                           _XID_CONTEXT.sub("", match.group(3))))
    return events


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


def reconcile_reason(reason: str | None, results: list[Result], now: float
                     ) -> tuple[str | None, bool]:
    """The reason after this run (None: no finding left) and whether it is gpufleet's to
    change: the health check's failed checks added, its passed checks cleared, every other
    finding kept."""
    current = parse_findings(reason)
    if current is None and reason:
        return reason, False
    failing = {r.check: r.message for r in results if r.status == "FAIL"}
    passed = {r.check for r in results if r.status == "PASS"}
    kept = [f for f in current or [] if not (f[0] == "h" and f[1] in passed - set(failing))]
    known = {(f[0], f[1]) for f in kept}
    findings = kept + [("h", c, int(now)) for c in failing if ("h", c) not in known]
    if not findings:
        return None, True
    if current is not None and findings == current:
        return reason, True  # nothing opened or cleared: the reason stays as it is
    letter, ident, since = findings[0]
    if letter == "h" and ident in failing:
        message = failing[ident]
    elif current and current[0] == findings[0] and message_of(reason):
        message = message_of(reason)
    else:
        message = "open since " + time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime(since))
    return render_reason(findings, message), True


# ---- checks ----------------------------------------------------------------------------------

def _number(value: str) -> int | None:
    return int(value) if value.isdigit() else None


def check_gpus(config: dict[str, Any], deadline: Deadline) -> tuple[Result, list[Result]]:
    """The gpus check, and the ecc check from the same nvidia-smi answer."""
    expected = config["gpu_count"]
    cap = float(config["nvidia_smi_timeout_s"])
    out = run(["nvidia-smi", f"--query-gpu={GPU_QUERY}", "--format=csv,noheader,nounits"],
              deadline, cap)
    if out is None:
        if expected:
            return Result("gpus", "FAIL", f"nvidia-smi not found; {expected} GPU(s) "
                                          "expected"), [Result("ecc", "SKIP", "no GPU data")]
        return Result("gpus", "SKIP", "no nvidia-smi and no GPUs expected"), \
            [Result("ecc", "SKIP", "no GPU data")]
    if out.rc is None:
        return Result("gpus", "FAIL", f"nvidia-smi {out.text}"), \
            [Result("ecc", "SKIP", "no GPU data")]
    if out.rc != 0:
        return Result("gpus", "FAIL", f"nvidia-smi failed: {last_line(out.text)}"), \
            [Result("ecc", "SKIP", "no GPU data")]
    try:
        rows = parse_gpus(out.text)
    except ValueError as exc:
        return Result("gpus", "FAIL", str(exc)), [Result("ecc", "SKIP", "no GPU data")]
    names = sorted({r["name"] for r in rows})
    found = f"{len(rows)} GPU(s)" + (f" ({', '.join(names)})" if names else "")
    gpus = Result("gpus", "PASS", found) if expected in (None, len(rows)) else \
        Result("gpus", "FAIL", f"{found}, expected {expected}")
    return gpus, [ecc_result(rows)]


def ecc_result(rows: list[dict[str, str]]) -> Result:
    """Uncorrectable ECC errors and row remapping, per GPU."""
    problems = []
    for row in rows:
        gpu = f"GPU{row['index']} {row['pci.bus_id']}"
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


def check_xid(config: dict[str, Any], deadline: Deadline) -> Result:
    """Critical Xid events in the kernel log since boot (dmesg, else journalctl -k -b)."""
    reasons = []
    for argv in (["dmesg"], ["journalctl", "-k", "-b", "-q", "--no-pager", "-o", "short"]):
        out = run(argv, deadline, 2.0)
        if out is not None and out.rc == 0:
            critical = set(config["critical_xids"])
            events = parse_xids(out.text)
            bad = [e for e in events if e[1] in critical]
            if bad:
                pci, xid, message = bad[0]
                more = f" (+{len(bad) - 1} more)" if len(bad) > 1 else ""
                return Result("xid", "FAIL", f"Xid {xid} on {pci}: {message}{more}")
            return Result("xid", "PASS", f"no critical Xid since boot ({len(events)} Xid "
                                         "event(s) in all)")
        reasons.append(f"{argv[0]}: " + ("not found" if out is None else last_line(out.text)))
    return Result("xid", "FAIL", "kernel log unreadable: " + "; ".join(reasons))


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


def check_versions(recorded: dict[str, Any] | None, state_file: str,
                   deadline: Deadline) -> list[Result]:
    """The driver and NCCL versions against those bootstrap recorded."""
    if recorded is None:
        why = f"no recorded state ({state_file} absent: node not bootstrapped)"
        return [Result("driver", "SKIP", why), Result("nccl", "SKIP", why)]
    results = []
    for check, actual in (("driver", loaded_driver()), ("nccl", installed_nccl(deadline))):
        want = recorded.get(check)
        if want is None:
            results.append(Result(check, "SKIP", f"no {check} version in {state_file}"))
        elif actual is None:
            results.append(Result(check, "FAIL", "dpkg-query did not answer in time"))
        elif actual == want:
            results.append(Result(check, "PASS", f"{actual}, as recorded"))
        else:
            results.append(Result(check, "FAIL", f"{actual}, recorded {want}"))
    return results


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
    checks = {
        "gpu_count": config["gpu_count"] is None or (isinstance(config["gpu_count"], int)
                                                     and config["gpu_count"] >= 0),
        "critical_xids": isinstance(config["critical_xids"], list)
        and all(isinstance(x, int) for x in config["critical_xids"]),
        "port_range": config["port_range"] is None or isinstance(config["port_range"], str),
        "state_file": isinstance(config["state_file"], str),
        "nvidia_smi_timeout_s": isinstance(config["nvidia_smi_timeout_s"], (int, float)),
        "budget_s": isinstance(config["budget_s"], (int, float))
        and config["budget_s"] > SLURM_RESERVE_S,
        "syslog_socket": config["syslog_socket"] is None
        or isinstance(config["syslog_socket"], str),
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


def slurm_action(node: str, results: list[Result], deadline: Deadline) -> tuple[str, bool]:
    """Keep the health check's findings in the node's drain reason: drain for a new one,
    resume once no finding of anyone's is left; the line to print and whether scontrol did
    what was needed."""
    try:
        state, reason = node_state(node, deadline)
    except SlurmUnavailable as exc:
        return f"slurm: {exc}", False
    held = "DRAIN" in state.split("+")[1:] or state.split("+")[0] == "DOWN"
    wanted, ours = reconcile_reason(reason if held else None, results, time.time())
    if not ours:
        return f"slurm: {node} left alone: drained by someone else: {reason}", True
    if wanted is None:
        if held:
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

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpufleet-healthcheck",
                                     description="Fast node-local GPU node checks.")
    parser.add_argument("--config", default=CONFIG, help=f"expectations (default {CONFIG})")
    parser.add_argument("--drain", action="store_true",
                        help="drain this node in Slurm on failure, resume it when healthy")
    parser.add_argument("--no-drain", action="store_true",
                        help="only report, even when run by slurmd")
    parser.add_argument("--node", help="Slurm node name (default: SLURMD_NODENAME or the "
                                       "short host name)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        config = load_config(args.config)
        recorded = recorded_versions(config["state_file"])
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    budget = float(config["budget_s"])
    deadline = Deadline(budget - SLURM_RESERVE_S)
    gpus, ecc = check_gpus(config, deadline)
    results = [gpus, *ecc, check_xid(config, deadline),
               *check_versions(recorded, config["state_file"], deadline),
               check_port_range(config, recorded)]
    for result in results:
        print(result.line())
    ok = True
    slurm: list[str] = []
    node = args.node or os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    if (args.drain or os.environ.get("SLURMD_NODENAME")) and not args.no_drain:
        left = budget - (time.monotonic() - started)
        line, ok = slurm_action(node, results, Deadline(max(left, SLURM_RESERVE_S)))
        print(line)
        slurm.append(line)
    counts = {s: sum(r.status == s for r in results) for s in ("FAIL", "PASS", "SKIP")}
    verdict = (f"healthcheck {node}: {counts['FAIL']} failed, {counts['PASS']} passed, "
               f"{counts['SKIP']} skipped in {time.monotonic() - started:.2f}s")
    print(verdict)
    failed = [r.line() for r in results if r.status == "FAIL"]
    if config["syslog_socket"]:
        log_verdict(config["syslog_socket"], "; ".join([verdict, *failed, *slurm]),
                    bool(failed) or not ok)
    return EXIT_FAILED if counts["FAIL"] or not ok else 0


def log_verdict(address: str, message: str, error: bool) -> None:
    """The run's verdict to syslog (facility daemon, tag gpufleet-healthcheck, priority err
    when a check failed, else info), as one datagram; slurmd discards the program's output,
    so this is where an operator finds every run. A missing syslog socket costs nothing."""
    priority = SYSLOG_FACILITY * 8 + (SYSLOG_ERR if error else SYSLOG_INFO)
    text = _one_line(message).encode()[:SYSLOG_LIMIT].decode(errors="ignore")
    packet = f"<{priority}>{SYSLOG_TAG}[{os.getpid()}]: {text}".encode()
    with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as out:
        out.settimeout(0.5)
        out.sendto(packet, address)


if __name__ == "__main__":
    sys.exit(main())
