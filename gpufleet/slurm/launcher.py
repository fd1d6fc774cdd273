"""Reaching nodes through Slurm instead of SSH (``--launcher slurm``).

One allocation holds the run's nodes (``salloc --no-shell --exclusive``, so no other job
shares them while they are measured); every command is a job step on its node (``srun
--jobid J --nodelist NODE --overlap``, the node's GPUs requested for the step), so checks
on one node run side by side as they do over SSH. Node-local commands of many nodes
(the facts round trip, node-local checks) go together as one step across the nodes
(``gpufleet.slurm.fanout``) unless each is asked for as a step of its own
(``--launcher slurm-per-node``). A step runs in an environment as plain
as an SSH session's (``--export=NONE``, ``env -i PATH=...``: nothing of the controller's
environment reaches the node) and prints a start mark before the command: a step that
never started (the node is down, the allocation was revoked) makes the node unreachable,
whereas the command's own failure is just its exit status. srun's report of a task's exit
status is left out of the command's stderr.

Nodes that Slurm cannot give whole now (drained, down, not responding, running another
job, outside the partition, unknown to Slurm) are left out of the allocation with the
reason, and fail every check as unreachable; the others are measured.
"""

from __future__ import annotations

import contextlib
import re
import shlex
import signal
import subprocess
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field

from gpufleet.connect.connection import (
    Budget,
    CommandResult,
    ConnectOptions,
    Stream,
    Unreachable,
    in_node_local,
)
from gpufleet.connect.local import ProcessRunner, ProcessStream
from gpufleet.inventory.model import Host
from gpufleet.slurm.client import Slurm, SlurmError, SlurmNode
from gpufleet.slurm.drain import slurm_name
from gpufleet.slurm.fanout import STDIN_MAX, FanoutStream, StepFanout

STEP_MARK = b"@@gpufleet-step@@\n"
STEP_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
JOB_NAME = "gpufleet-conformance"
STOP_GRACE_S = 3.0
UNUSABLE_FLAGS = frozenset({"DRAIN", "FAIL", "MAINT", "NOT_RESPONDING", "POWERED_DOWN",
                            "POWERING_DOWN", "REBOOT_REQUESTED", "REBOOT_ISSUED"})
UNUSABLE_STATES = frozenset({"DOWN", "FUTURE", "UNKNOWN"})
BUSY_STATES = frozenset({"ALLOCATED", "MIXED", "COMPLETING"})
_GRANTED = re.compile(r"Granted job allocation (\d+)")
_TASK_EXIT = re.compile(rb"^srun: error: \S+: tasks? [0-9,-]+: "
                        rb"(?:Exited with exit code \d+|Killed|Terminated)\s*$")


def unusable(node: SlurmNode) -> str | None:
    """Why Slurm cannot give this whole node to a job now, or None."""
    if node.base_state in UNUSABLE_STATES or node.flags & UNUSABLE_FLAGS:
        return f"{node.state} in Slurm" + (f": {node.reason}" if node.reason else "")
    if node.base_state in BUSY_STATES:
        return f"busy in Slurm ({node.state}): another job runs on it"
    return None


@dataclass
class Allocation:
    """The run's Slurm job: which host is which node, and the hosts left out (and why)."""

    slurm: Slurm
    job_id: str | None
    nodes: dict[str, SlurmNode] = field(default_factory=dict)
    left_out: dict[str, str] = field(default_factory=dict)
    fanout: StepFanout | None = None

    @classmethod
    def open(cls, hosts: Sequence[Host], slurm: Slurm, *, partition: str | None,
             time_limit_s: float, wait_s: float = 60.0, combine: bool = True
             ) -> Allocation:
        """Allocate every host Slurm can give now, whole (``--exclusive``), for at most
        ``time_limit_s``; waiting longer than ``wait_s`` for busy nodes is an error.
        ``combine``: node-local commands of many nodes share one step."""
        known = {n.name: n for n in slurm.nodes()}
        allocation = cls(slurm, None)
        if combine:
            allocation.fanout = StepFanout(allocation, STEP_PATH)
        for host in hosts:
            node = known.get(slurm_name(host))
            if node is None:
                why: str | None = f"no Slurm node named {slurm_name(host)!r}"
            elif partition and partition not in node.partitions:
                why = f"{node.name} is not in partition {partition}"
            else:
                why = unusable(node)
            if node is None or why:
                allocation.left_out[host.name] = f"not allocated: {why}"
            else:
                allocation.nodes[host.name] = node
        if not allocation.nodes:
            return allocation
        minutes = max(1, int(time_limit_s // 60) + 1)
        argv = ["salloc", "--no-shell", "--exclusive", f"--immediate={int(wait_s)}",
                f"--job-name={JOB_NAME}", f"--nodes={len(allocation.nodes)}",
                f"--nodelist={','.join(n.name for n in allocation.nodes.values())}",
                f"--time={minutes}"]
        if partition:
            argv.append(f"--partition={partition}")
        out = _salloc(slurm, argv, wait_s + 30)
        granted = _GRANTED.search(out)
        if granted is None:
            raise SlurmError(f"salloc granted no allocation: {out.strip()[-300:]}")
        allocation.job_id = granted.group(1)
        return allocation

    def step_argv(self, host: str) -> list[str]:
        """srun's words for one command on ``host``'s node, inside the allocation."""
        node = self.nodes[host]
        argv = ["srun", f"--jobid={self.job_id}", f"--nodelist={node.name}", "--nodes=1",
                "--ntasks=1", "--overlap", "--quiet", "--kill-on-bad-exit=0", "--export=NONE"]
        if node.gpus:
            argv.append(f"--gres=gpu:{node.gpus}")
        return argv

    def connect(self, host: Host, options: ConnectOptions | None = None,
                budget: Budget | None = None) -> SrunConnection:
        """A connection to ``host`` through job steps (a ``Connector``; SSH's options do
        not apply); every command on a host left out is unreachable."""
        return SrunConnection(host, self, budget)

    def release(self) -> None:
        """Cancel the job (every step still running ends with it)."""
        if self.job_id is not None:
            with contextlib.suppress(SlurmError):
                self.slurm.run(["scancel", self.job_id])
            self.job_id = None


def _salloc(slurm: Slurm, argv: list[str], timeout: float) -> str:
    """salloc's messages (it prints the grant on stderr), or SlurmError with Slurm's."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              env=slurm.environment(), check=False)
    except FileNotFoundError:
        raise SlurmError("salloc not found on this machine: install Slurm's client commands "
                         "(Debian/Ubuntu: apt-get install slurm-client)") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"salloc did not answer within {timeout:.0f}s") from None
    text = proc.stderr + proc.stdout
    if proc.returncode != 0:
        lines = text.strip().splitlines()
        raise SlurmError(f"salloc could not allocate the nodes: "
                         f"{lines[-1] if lines else f'exit code {proc.returncode}'}")
    return text


class SrunStream(ProcessStream):
    """One command as a job step: the start mark is taken out of stdout, srun's task exit
    reports out of stderr; no mark by the end means the step never ran."""

    def __init__(self, argv: list[str], register: set[subprocess.Popen[bytes]],
                 lock: threading.Lock, env: dict[str, str], node: str) -> None:
        super().__init__(argv, register, lock, env)
        self.node = node
        self._started = False
        self._out = bytearray()
        self._err = bytearray()
        self._srun_said: list[str] = []

    def poll(self, wait: float) -> tuple[bytes, bytes]:
        out, err = super().poll(wait)
        if not self._started:
            self._out += out
            out = b""
            if STEP_MARK in self._out:
                self._started = True
                out = bytes(self._out[self._out.index(STEP_MARK) + len(STEP_MARK):])
                self._out.clear()
        return out, self._filter(err, ended=super().finished())

    def _filter(self, err: bytes, *, ended: bool) -> bytes:
        """stderr without srun's task exit reports; a partial line is held back only while
        it may still become one of srun's lines (a sudo prompt has no newline)."""
        self._err += err
        cut = self._err.rfind(b"\n") + 1
        partial = bytes(self._err[cut:])
        if ended or not (partial.startswith(b"srun: ") or b"srun: ".startswith(partial)):
            cut = len(self._err)
        complete, self._err = bytes(self._err[:cut]), self._err[cut:]
        kept = []
        for line in complete.splitlines(keepends=True):
            if _TASK_EXIT.match(line.rstrip(b"\n")):
                continue
            if line.startswith(b"srun: "):
                self._srun_said.append(line.decode(errors="replace").strip())
            kept.append(line)
        return b"".join(kept)

    def finished(self) -> bool:
        return super().finished() and not self._err

    def status(self) -> int:
        rc = super().status()
        if not self._started:
            said = "; ".join(self._srun_said[-2:]) or f"srun exit status {rc}"
            raise Unreachable(f"{self.node}: no job step started: {said}")
        return rc

    def stop(self) -> None:
        if self.proc.poll() is None:  # srun ends its step on SIGTERM; SIGKILL would not
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(STOP_GRACE_S)
        super().stop()


class SrunConnection(ProcessRunner):
    """Commands on a host as job steps of the run's allocation."""

    def __init__(self, host: Host, allocation: Allocation, budget: Budget | None = None
                 ) -> None:
        self.allocation = allocation
        self._combined = threading.local()
        self._carried: weakref.WeakSet[FanoutStream] = weakref.WeakSet()
        super().__init__(host, budget)

    def close(self) -> None:
        """Stop whatever still runs, a command waiting in a combined step included."""
        with self._lock:
            carried = list(self._carried)
        for stream in carried:
            stream.cancel()
        super().close()

    def run(self, command: str, *, timeout: float = 120.0, stdin: bytes | None = None,
            become: bool | None = None) -> CommandResult:
        """The command as a step of its own, or in a combined step when it is node-local,
        its stdin small and it needs no become password."""
        combined = self.allocation.fanout is not None and in_node_local() \
            and len(stdin or b"") <= STDIN_MAX and self._become(become)[1] is None
        self._combined.value = combined
        try:
            return super().run(command, timeout=timeout, stdin=stdin, become=become)
        finally:
            self._combined.value = False

    def _stream(self, line: str) -> Stream:
        left_out = self.allocation.left_out.get(self.host.name)
        if left_out:
            raise Unreachable(f"{self.host.name}: {left_out}")
        node = self.allocation.nodes[self.host.name]
        fanout = self.allocation.fanout
        if fanout is not None and getattr(self._combined, "value", False):
            stream = FanoutStream(fanout, node.name, line, node.gpus)
            with self._lock:
                self._carried.add(stream)
            return stream
        argv = [*self.allocation.step_argv(self.host.name), "/usr/bin/env", "-i",
                f"PATH={STEP_PATH}", "/bin/sh", "-c",
                f"printf '%s\\n' {shlex.quote(STEP_MARK.decode().strip())} && exec {line}"]
        return SrunStream(argv, self._running, self._lock, self.allocation.slurm.environment(),
                          self.allocation.nodes[self.host.name].name)

    def reopen(self) -> SrunConnection:
        """Another connection to the same host, under the same budget."""
        self.budget.admit("reconnect")
        return SrunConnection(self.host, self.allocation, self.budget)

    def _stop(self, proc: subprocess.Popen[bytes]) -> None:
        """srun ends its step on SIGTERM."""
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
