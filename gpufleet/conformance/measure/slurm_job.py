"""slurm_job: what a Slurm job step gets on a node, read from the controller with Slurm's
client. The job view probe (``conformance/probes/job_view.py``) runs as one short step on
the node: a job of its own (``srun --nodelist=NODE --gres=gpu:N --time --immediate``,
after ``scontrol show node`` says Slurm would start one there now), or, under
``--launcher slurm``, a step of the run's allocation (``srun --jobid=J --overlap``), which
holds the node whole so that no job of its own could start there. The step runs in an
environment as plain as the launcher's (``--export=NONE``: nothing of the controller's
environment but the limits Slurm propagates), its output read up to a bound and within a
time limit; srun is asked to end its step (SIGTERM) before it is killed. The node as Slurm
knows it and Slurm's configuration come from the same client.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from importlib import resources

from gpufleet.conformance.checks.slurm_job import PROBE_MAX_BYTES, StepView, parse_view
from gpufleet.conformance.session import Node
from gpufleet.connect.local import ProcessStream
from gpufleet.errors import GpufleetError
from gpufleet.slurm.client import INSTALL_HINT, Slurm, SlurmNode
from gpufleet.slurm.config import SlurmConfig
from gpufleet.slurm.drain import slurm_name, slurm_of
from gpufleet.slurm.launcher import STEP_PATH, Allocation, SrunConnection, unusable

JOB_NAME = "gpufleet-job-view"
PROBE = "job_view.py"
STDERR_MAX = 16 * 1024
STOP_GRACE_S = 3.0
NO_SLURM = ("no Slurm for this node: set gpufleet_scheduler: slurm (and gpufleet_slurm_conf "
            "where Slurm's own lookup does not find the cluster's configuration), or run with "
            "--launcher slurm")
_TASK_EXIT = re.compile(r"^srun: error: \S+: tasks? [0-9,-]+: "
                        r"(?:Exited with exit code \d+|Killed|Terminated)\s*$")


@dataclass(frozen=True)
class JobSlurm:
    """How the suite reaches Slurm for one node: the cluster's client, the node's name in
    Slurm, and the run's allocation under ``--launcher slurm`` (None: a job of its own)."""

    slurm: Slurm
    node: str
    allocation: Allocation | None = None

    @property
    def own_job(self) -> bool:
        return self.allocation is None


def job_slurm(node: Node, launcher: str) -> JobSlurm | str:
    """How to reach Slurm for ``node``, or why it cannot be reached (its checks skip)."""
    if launcher != "ssh":
        conn = node.conn
        if isinstance(conn, SrunConnection) and node.name in conn.allocation.nodes:
            allocation = conn.allocation
            return JobSlurm(allocation.slurm, allocation.nodes[node.name].name, allocation)
    slurm = slurm_of(node.host)
    if slurm is None:
        return NO_SLURM
    missing = [tool for tool in ("scontrol", "srun") if shutil.which(tool) is None]
    if missing:
        return f"{' and '.join(missing)} not found on this machine: {INSTALL_HINT}"
    return JobSlurm(slurm, slurm_name(node.host))


@dataclass(frozen=True)
class Read:
    """What Slurm said of a node (``node``) and of its configuration (``config``), or why it
    could not be read."""

    node: SlurmNode | None = None
    config: SlurmConfig | None = None
    error: str | None = None


def read_node(where: JobSlurm) -> Read:
    """The node as slurmctld knows it (``scontrol show node``)."""
    try:
        return Read(node=where.slurm.node(where.node))
    except GpufleetError as exc:
        return Read(error=str(exc))


def read_config(slurm: Slurm) -> Read:
    """Slurm's configuration as slurmctld reports it (``scontrol show config``)."""
    try:
        return Read(config=slurm.config())
    except GpufleetError as exc:
        return Read(error=str(exc))


def probe_text() -> str:
    """The job view probe's source, run with ``python3 -c``."""
    return (resources.files("gpufleet.suites.probes") / PROBE).read_text()


def probe_argv(where: JobSlurm, gpus: int, timeout_s: float,
               partitions: tuple[str, ...] = ()) -> list[str]:
    """srun's words for the probe's step on the node: asking for ``gpus`` GPUs (none at
    0), ended by Slurm after ``timeout_s`` (a job of its own waits at most half of it for
    the node)."""
    if where.allocation is not None:
        argv = ["srun", f"--jobid={where.allocation.job_id}", f"--nodelist={where.node}",
                "--nodes=1", "--ntasks=1", "--overlap", "--kill-on-bad-exit=0"]
    else:
        argv = ["srun", f"--nodelist={where.node}", "--nodes=1", "--ntasks=1",
                f"--time={max(1, math.ceil(timeout_s / 60))}",
                f"--immediate={max(1, int(timeout_s // 2))}"]
        if partitions:
            argv.append(f"--partition={','.join(partitions)}")
    argv += [f"--job-name={JOB_NAME}", "--quiet", "--export=NONE"]
    if gpus:
        argv.append(f"--gres=gpu:{gpus}")
    return [*argv, "/usr/bin/env", f"PATH={STEP_PATH}", "python3", "-c", probe_text()]


def step_failure(stderr: str, rc: int) -> str:
    """Why a step failed, from srun's and slurmstepd's messages (srun's report of the
    task's exit status left out), else its exit status."""
    lines = [line.strip() for line in stderr.splitlines()
             if line.strip() and not _TASK_EXIT.match(line.strip())]
    return "; ".join(lines[-2:])[-400:] if lines else f"exit status {rc}"


@dataclass
class JobView:
    """The probe's step on a node: what it reported (``view``), or why the checks skip
    (``skip``) or cannot know (``error``); the srun command line without the probe's text."""

    view: StepView | None = None
    skip: str | None = None
    error: str | None = None
    command: list[str] = field(default_factory=list)
    duration_s: float = 0.0


def job_view(node: Node, where: JobSlurm, slurm_node: SlurmNode | None, *, gpus: int,
             timeout_s: float, partition: str | None = None) -> JobView:
    """Run the probe as a step on the node and read what it reports. A job of its own runs
    only where Slurm would start one now (``slurm_node``: not drained, down or busy)."""
    partitions: tuple[str, ...] = (partition,) if partition else ()
    if where.own_job and slurm_node is not None:
        why = unusable(slurm_node)
        if why:
            return JobView(skip=f"Slurm starts no job on {where.node} now: {why}")
        partitions = partitions or slurm_node.partitions
    try:
        node.budget.admit("the job view probe's step")
    except GpufleetError as exc:
        return JobView(error=str(exc))
    limit, _ = node.budget.clip(timeout_s)
    argv = probe_argv(where, gpus, limit, partitions)
    shown = [*argv[:argv.index("-c")], "<job_view.py>"]
    start = time.monotonic()
    try:
        rc, out, err, why = run_bounded(argv, where.slurm.environment(), limit,
                                        PROBE_MAX_BYTES)
    except FileNotFoundError:
        return JobView(error=f"srun not found on this machine: {INSTALL_HINT}", command=shown)
    found = JobView(command=shown, duration_s=time.monotonic() - start)
    stderr = err.decode("utf-8", "replace")
    if why is not None:
        found.error = f"the job view step on {where.node} {why}" + (
            f" ({step_failure(stderr, -1)})" if stderr.strip() else "")
    elif rc:
        found.error = (f"the job view step on {where.node} failed: "
                       f"{step_failure(stderr, rc)}")
    else:
        try:
            found.view = parse_view(out.decode("utf-8", "replace"))
        except GpufleetError as exc:
            found.error = f"{exc}"
    return found


def run_bounded(argv: list[str], env: dict[str, str], timeout_s: float, cap: int
                ) -> tuple[int | None, bytes, bytes, str | None]:
    """A command on the controller with nothing on its stdin, its stdout read up to ``cap``
    bytes (its stderr up to STDERR_MAX) within ``timeout_s``: its exit status, stdout,
    stderr, and why it was stopped (None when it ended by itself)."""
    stream = ProcessStream(argv, set(), threading.Lock(), env)
    out, err = bytearray(), bytearray()
    why: str | None = None
    deadline = time.monotonic() + timeout_s
    try:
        stream.close_stdin()
        while not stream.finished():
            left = deadline - time.monotonic()
            if left <= 0:
                why = f"did not finish within {timeout_s:.0f}s"
                break
            more, errors = stream.poll(min(left, 0.5))
            out += more
            err += errors[:max(0, STDERR_MAX - len(err))]
            if len(out) > cap:
                why = f"printed more than {cap} bytes"
                break
        rc = None if why else stream.status()
    finally:
        _terminate(stream)
    return rc, bytes(out), bytes(err), why


def _terminate(stream: ProcessStream) -> None:
    """srun ends its step on SIGTERM; whatever is left after a grace is killed."""
    if stream.proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(stream.proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            stream.proc.wait(STOP_GRACE_S)
    stream.stop()
