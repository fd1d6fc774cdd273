"""Slurm from the controller: node state from ``scontrol``/``sinfo``, drain and resume.

The parsers are pure functions over the commands' text output. The commands run as
argument lists (never through a shell) with a timeout on every call; ``SLURM_CONF`` is
passed through the environment when a configuration file is given.

gpufleet keeps every open finding of a node in its drain reason (gpufleet/slurm/findings.py)
and resumes the node only once none is left: a node an operator drained stays drained, and
a run never lifts another run's finding.
"""

from __future__ import annotations

import os
import random
import re
import subprocess
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpufleet.errors import GpufleetError, ParseError
from gpufleet.slurm import findings
from gpufleet.slurm.config import SlurmConfig, parse_show_config

UPDATE_ATTEMPTS = 4
SETTLE_S = 0.5  # longer than another run's read-then-write of one reason
DEFAULT_TIMEOUT = 20.0
SINFO_FORMAT = "%N|%P|%T|%c|%G|%E"
INSTALL_HINT = "install Slurm's client commands (Debian/Ubuntu: apt-get install slurm-client)"

_NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*\Z")
_KEY = re.compile(r"\s+(?=[A-Za-z][A-Za-z0-9_]*=)")
_FREE_TEXT = re.compile(r"(?:^|\s)(Reason|Comment|Extra)=")
_REASON_MARK = re.compile(r"^(?P<text>.*?) \[(?P<user>[^@\]\s]*)@(?P<time>[^\]\s]+)\](?P<rest>.*)$")
_NOT_ANSWERING = ("Unable to contact slurm controller", "Zero Bytes were transmitted",
                  "Socket timed out", "Connection refused", "Communication connection failure")
_GPU_GRES = re.compile(r"(?:^|,)\s*gpu(?::(?P<type>[^:(,]+))?:(?P<count>\d+)")


class SlurmError(GpufleetError):
    """A Slurm command is missing, slurmctld does not answer, or Slurm refused a request."""


@dataclass(frozen=True)
class SlurmNode:
    """One node as ``scontrol show node -o`` describes it."""

    name: str
    address: str
    hostname: str
    state: str
    cpus: int | None
    gres: str
    features: tuple[str, ...]
    partitions: tuple[str, ...]
    reason: str | None = None
    reason_user: str | None = None
    reason_time: str | None = None

    @property
    def base_state(self) -> str:
        """``IDLE``, ``ALLOCATED``, ``MIXED``, ``DOWN``, ``UNKNOWN`` ... without flags."""
        return self.state.split("+")[0]

    @property
    def flags(self) -> frozenset[str]:
        """``DRAIN``, ``NOT_RESPONDING``, ``INVALID_REG`` ... after the base state."""
        return frozenset(self.state.split("+")[1:])

    @property
    def drained(self) -> bool:
        """Drained or draining: Slurm starts no new job on it."""
        return "DRAIN" in self.flags

    @property
    def held(self) -> bool:
        """Drained, draining or down: Slurm starts no new job on it."""
        return self.drained or self.base_state == "DOWN"

    @property
    def drained_by_gpufleet(self) -> bool:
        return self.held and findings.parse(self.reason) is not None

    @property
    def gpus(self) -> int:
        """GPUs in the node's configured GRES (``gpu:8``, ``gpu:h200:8(S:0-1)``)."""
        return sum(count for _, count in self.gpu_types)

    @property
    def gpu_types(self) -> tuple[tuple[str | None, int], ...]:
        """Each ``gpu`` entry of the node's GRES as its type (None where untyped) and
        count: ``gpu:a100:4(S:0),gpu:v100:4(S:1)`` is ``(("a100", 4), ("v100", 4))``."""
        return tuple((match["type"], int(match["count"]))
                     for match in _GPU_GRES.finditer(self.gres))


@dataclass(frozen=True)
class SlurmPartition:
    """One partition as ``scontrol show partition -o`` describes it."""

    name: str
    nodes: str
    state: str
    default: bool


@dataclass(frozen=True)
class SinfoNode:
    """One line of ``sinfo --Node --format=SINFO_FORMAT``: a node in one partition."""

    name: str
    partition: str
    default_partition: bool
    state: str
    cpus: int | None
    gres: str
    reason: str | None


@dataclass(frozen=True)
class Action:
    """What ``drain`` or ``resume`` did to a node: drained, resumed, unchanged, left alone."""

    node: str
    action: str
    detail: str

    def __str__(self) -> str:
        return f"{self.node}: {self.action}: {self.detail}"


# ---- parsers ---------------------------------------------------------------------------------

def _pairs(text: str, what: str) -> dict[str, str]:
    """``Key=value`` fields of one line; values may hold spaces (``OS=Linux 6.1 #1 SMP``)."""
    fields: dict[str, str] = {}
    for token in _KEY.split(text.strip()):
        key, sep, value = token.partition("=")
        if not sep:
            raise ParseError(f"{what}: expected Key=value fields, got {token!r}")
        fields[key] = value.strip()
    return fields


def _optional(value: str | None) -> str | None:
    return None if value in (None, "", "(null)", "N/A", "none") else value


def _count(value: str | None) -> int | None:
    return int(value) if value and value.isdigit() else None


def _items(value: str | None) -> tuple[str, ...]:
    text = _optional(value)
    return tuple(v for v in text.split(",") if v) if text else ()


def _node_line(line: str) -> SlurmNode:
    marker = _FREE_TEXT.search(line)
    structured, free = (line[:marker.start()], line[marker.start():].strip()) if marker \
        else (line, "")
    fields = _pairs(structured, "scontrol show node")
    reason = user = when = None
    if free.startswith("Reason="):
        body = free.removeprefix("Reason=")
        mark = _REASON_MARK.match(body)
        reason, user, when = (mark["text"], mark["user"], mark["time"]) if mark \
            else (re.split(r" (?:Comment|Extra)=", body)[0], None, None)
    if "NodeName" not in fields or "State" not in fields:
        raise ParseError(f"scontrol show node: no NodeName/State in {line[:80]!r}")
    return SlurmNode(
        name=fields["NodeName"],
        address=_optional(fields.get("NodeAddr")) or fields["NodeName"],
        hostname=_optional(fields.get("NodeHostName")) or fields["NodeName"],
        state=fields["State"],
        cpus=_count(fields.get("CPUTot")),
        gres=_optional(fields.get("Gres")) or "",
        features=_items(fields.get("AvailableFeatures")),
        partitions=_items(fields.get("Partitions")),
        reason=_optional(reason.strip()) if reason is not None else None,
        reason_user=user or None,
        reason_time=when,
    )


def parse_show_node(text: str) -> list[SlurmNode]:
    """Nodes from ``scontrol --oneliner show node`` (one ``NodeName=...`` line each)."""
    lines = [line for line in text.splitlines() if line.strip()]
    if lines == ["No nodes in the system"]:
        return []
    bad = [line for line in lines if not line.startswith("NodeName=")]
    if bad:
        raise ParseError(f"scontrol show node: expected NodeName=... lines, got {bad[0][:80]!r}")
    return [_node_line(line) for line in lines]


def parse_show_partition(text: str) -> list[SlurmPartition]:
    """Partitions from ``scontrol --oneliner show partition``."""
    lines = [line for line in text.splitlines() if line.strip()]
    if lines == ["No partitions in the system"]:
        return []
    partitions = []
    for line in lines:
        if not line.startswith("PartitionName="):
            raise ParseError(f"scontrol show partition: expected PartitionName=... lines, "
                             f"got {line[:80]!r}")
        fields = _pairs(line, "scontrol show partition")
        partitions.append(SlurmPartition(fields["PartitionName"],
                                         _optional(fields.get("Nodes")) or "",
                                         fields.get("State", ""), fields.get("Default") == "YES"))
    return partitions


def parse_sinfo(text: str) -> list[SinfoNode]:
    """Lines of ``sinfo --noheader --Node --format='%N|%P|%T|%c|%G|%E'``; the reason is last,
    so a ``|`` inside it is kept."""
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split("|", 5)
        if len(parts) != 6 or not parts[0]:
            raise ParseError(f"sinfo: expected NODE|PARTITION|STATE|CPUS|GRES|REASON, "
                             f"got {line[:80]!r}")
        name, partition, state, cpus, gres, reason = parts
        rows.append(SinfoNode(name, partition.rstrip("*"), partition.endswith("*"), state,
                              _count(cpus), _optional(gres) or "", _optional(reason)))
    return rows


@dataclass(frozen=True)
class RunFindings:
    """What one run of ``source`` found on a node: ``failed`` (finding id -> message) and
    the ids it checked again and ``passed``."""

    source: str
    failed: Mapping[str, str] = field(default_factory=dict)
    passed: Collection[str] = ()


# ---- commands --------------------------------------------------------------------------------

def _node_name(name: str) -> str:
    if not _NODE_NAME.match(name):
        raise SlurmError(f"invalid Slurm node name {name!r} (one node, no hostlist)")
    return name


@dataclass(frozen=True)
class Slurm:
    """Slurm's commands on the controller; ``conf`` sets ``SLURM_CONF`` for them."""

    conf: Path | None = None
    timeout: float = DEFAULT_TIMEOUT
    settle_s: float = field(default_factory=lambda: SETTLE_S)

    def environment(self) -> dict[str, str]:
        """The environment for Slurm's commands (``SLURM_CONF`` when ``conf`` is given)."""
        env = dict(os.environ)
        if self.conf is not None:
            env["SLURM_CONF"] = str(self.conf)
        return env

    def run(self, argv: Sequence[str]) -> str:
        """Run one Slurm command and return its output; SlurmError says why it failed."""
        env = self.environment()
        shown = " ".join(argv[:3])
        try:
            proc = subprocess.run(list(argv), capture_output=True, text=True, env=env,
                                  timeout=self.timeout, check=False)
        except FileNotFoundError:
            raise SlurmError(f"{argv[0]} not found on this machine: {INSTALL_HINT}") from None
        except subprocess.TimeoutExpired:
            raise SlurmError(f"`{shown}` did not finish within {self.timeout:.0f}s: "
                             "slurmctld does not answer, or Slurm finds no configuration "
                             "(SLURM_CONF, /etc/slurm/slurm.conf)") from None
        if proc.returncode != 0:
            lines = (proc.stderr or proc.stdout).strip().splitlines()
            last = lines[-1] if lines else f"exit code {proc.returncode}"
            if any(text in last for text in _NOT_ANSWERING):
                raise SlurmError(f"slurmctld does not answer `{shown}`: {last}")
            raise SlurmError(f"`{shown}` failed: {last}")
        return proc.stdout

    def nodes(self) -> list[SlurmNode]:
        """Every node slurmctld knows."""
        return parse_show_node(self.run(["scontrol", "--all", "--oneliner", "show", "node"]))

    def node(self, name: str) -> SlurmNode:
        """One node; SlurmError when slurmctld has no node of that name."""
        try:
            out = self.run(["scontrol", "--oneliner", "show", "node", _node_name(name)])
        except SlurmError as exc:
            if "not found" in str(exc) or "Invalid node name" in str(exc):
                raise SlurmError(f"no Slurm node named {name!r}") from None
            raise
        found = [n for n in parse_show_node(out) if n.name == name]
        if not found:
            raise SlurmError(f"no Slurm node named {name!r}")
        return found[0]

    def config(self) -> SlurmConfig:
        """The configuration slurmctld runs with (``scontrol show config``)."""
        return parse_show_config(self.run(["scontrol", "show", "config"]))

    def partitions(self) -> list[SlurmPartition]:
        """Every partition slurmctld knows."""
        return parse_show_partition(self.run(["scontrol", "--oneliner", "show", "partition"]))

    def sinfo(self) -> list[SinfoNode]:
        """One row per node and partition, with state, CPUs, GRES and reason."""
        return parse_sinfo(self.run(["sinfo", "--noheader", "--Node",
                                     f"--format={SINFO_FORMAT}"]))

    def update(self, node: str, runs: Sequence[RunFindings]) -> Action:
        """Merge ``runs`` into the node's findings (its drain reason): drain it while any
        finding is open, resume it once none is left. A node drained by anyone else is left
        alone. After writing, the reason is read again ``settle_s`` (plus jitter) later;
        when another run wrote over it meanwhile, the merge is done again on what that run
        wrote, so two controllers updating one node at once both keep their findings."""
        name = _node_name(node)
        done: Action | None = None
        for attempt in range(UPDATE_ATTEMPTS + 1):
            current = self.node(name)
            found = findings.parse(current.reason) if current.held else []
            if found is None:
                return done or Action(node, "left alone", "drained by "
                                      f"{current.reason_user or 'someone'} else: "
                                      f"{current.reason or 'no reason'}")
            if done is not None and all(findings.holds(found, r.source, r.failed, r.passed)
                                        for r in runs):
                return done
            if attempt == UPDATE_ATTEMPTS:
                break
            merged, reason = list(found), None
            previous = current.reason if current.held else None
            for run in runs:
                merged = findings.reconcile(merged, run.source, run.failed, run.passed)
                if merged:
                    reason = findings.reason_for(merged, run.source, run.failed, previous)
                    previous = reason
            if not merged:
                if not current.held:
                    return done or Action(node, "unchanged", f"not drained ({current.state})")
                self.run(["scontrol", "update", f"nodename={name}", "state=resume"])
                done = done or Action(node, "resumed", f"was {current.state}: {current.reason}")
            else:
                assert reason is not None
                if current.drained and (current.reason == reason or merged == found):
                    return done or Action(node, "unchanged",
                                          f"already drained: {current.reason}")
                self.run(["scontrol", "update", f"nodename={name}", "state=drain",
                          f"reason={reason}"])
                done = Action(node, "drained", reason)
            time.sleep(self.settle_s * (1 + random.random()))  # noqa: S311 - jitter only
        assert done is not None
        return Action(node, done.action, f"{done.detail} (other runs kept changing the reason; "
                                         "the last write is kept)")
