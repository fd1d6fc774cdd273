"""Launch a probe with torchrun on one or many nodes over SSH (rendezvous on the first
node's port), collect the JSON lines every rank printed, kill everything on timeout, and
name the phase that hung. One process per GPU; gloo processes on nodes without GPUs.

Every probe process is killed and its files removed on every way out of a launch: a
normal end, a timeout, an error or an interrupt. The clean-up has a budget of its own, so
it still reaches a node whose run budget is spent; launches still running when the run
ends (``cleanup_active``) are cleaned up the same way."""

from __future__ import annotations

import contextlib
import json
import re
import shlex
import threading
import time
import uuid
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from gpufleet.conformance import container
from gpufleet.conformance.checks.nccl_log import condense
from gpufleet.conformance.container import ContainerSettings
from gpufleet.conformance.session import Node
from gpufleet.conformance.suites.common import Probe
from gpufleet.connect.connection import Budget, keeps_node_local
from gpufleet.errors import GpufleetError
from gpufleet.ports import RENDEZVOUS_PORT
from gpufleet.roles import training_python

PROBES = resources.files("gpufleet.suites.probes")
SHARED = "probe_common.py"  # shipped beside every probe that imports it

PHASES = ("start", "rendezvous_done", "first_collective_done", "done")
PHASE_ALIASES = {"first_step_done": "first_collective_done"}
HUNG_IN = {None: "rendezvous (torchrun agents; no worker started)",
           "start": "rendezvous (process group init)", "rendezvous_done": "the first collective",
           "first_collective_done": "the measurements", "done": "shutdown"}
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
            "NVSHMEM_DISABLE_NVLS": "1"}
RC_MARK = "@@gpufleet-probe-rc="
CLEANUP_BUDGET_S = 30.0
_ACTIVE: dict[str, list[Node]] = {}
_ACTIVE_LOCK = threading.Lock()


@dataclass
class NodeOutput:
    """What one node's torchrun printed and how it ended."""

    rc: int | None
    events: list[dict[str, Any]]
    stderr_tail: str
    nccl_log: list[str] = field(default_factory=list)  # condensed (nccl_log.condense)

    def last_phase(self) -> str | None:
        """The earliest phase any of the node's ranks got stuck after (slowest rank)."""
        by_rank: dict[int, int] = {}
        for event in self.events:
            phase = PHASE_ALIASES.get(event.get("phase", ""), event.get("phase"))
            if event.get("event") == "phase" and phase in PHASES:
                rank = int(event.get("rank", -1))
                by_rank[rank] = max(by_rank.get(rank, 0), PHASES.index(phase))
        return PHASES[min(by_rank.values())] if by_rank else None


@dataclass
class ProbeRun:
    """One probe run over some nodes."""

    nodes: list[str]
    outputs: dict[str, NodeOutput] = field(default_factory=dict)
    timed_out: bool = False
    duration: float = 0.0
    leftovers: dict[str, str] = field(default_factory=dict)

    @property
    def results(self) -> list[dict[str, Any]]:
        return [e for o in self.outputs.values() for e in o.events if e.get("event") == "result"]

    @property
    def summary(self) -> dict[str, Any] | None:
        for output in self.outputs.values():
            for event in output.events:
                if event.get("event") == "summary":
                    return event
        return None

    @property
    def largest(self) -> dict[str, Any] | None:
        return max(self.results, key=lambda r: int(r["size"]), default=None)

    @property
    def wrong(self) -> int:
        return sum(int(r.get("wrong") or 0) for r in self.results)

    def error(self) -> str | None:
        """Why the run failed (hang with its phase, a node's exit status, wrong sums)."""
        if self.timed_out:
            stuck = []
            for name in self.nodes:
                output = self.outputs.get(name)
                phase = output.last_phase() if output else None
                if phase != "done":
                    stuck.append(f"{name} hung in {HUNG_IN[phase]}")
            return f"timed out after {self.duration:.0f}s: " + "; ".join(stuck or ["unknown"])
        for name in self.nodes:
            output = self.outputs.get(name)
            if output is None or output.rc != 0:
                rc = output.rc if output else None
                tail = output.stderr_tail if output else "no output"
                return f"{name}: torchrun exited with {rc}: {tail}"
        if self.wrong:
            return f"{self.wrong} reduced elements were wrong"
        if not self.results:
            return "the probe reported no result"
        return None

    def to_dict(self) -> dict[str, Any]:
        return {"nodes": self.nodes, "ok": self.error() is None, "error": self.error(),
                "duration_s": round(self.duration, 3), "results": self.results,
                "summary": self.summary, "leftover_processes": self.leftovers,
                "nccl_log": {name: o.nccl_log for name, o in self.outputs.items()
                             if o.nccl_log}}


def socket_ifname(node: Node) -> str | None:
    """The interface that carries the node's inventory address (for GLOO/NCCL sockets)."""
    configured = node.var("gloo_socket_ifname") or (node.var("nccl_env") or {}).get(
        "NCCL_SOCKET_IFNAME")
    if configured:
        return str(configured)
    for iface in (node.facts.get("interfaces") if node.facts else None) or []:
        if any(a.split("/")[0] == node.host.address for a in iface.get("addresses", [])):
            return str(iface["name"])
    return None


def rendezvous_port(node: Node) -> int:
    """The port torchrun's rendezvous listens on: ``allreduce_port``, else the firewall's
    rendezvous port."""
    settings = node.typed(Probe)
    port = settings.allreduce_port
    return port if port is not None else settings.firewall_rendezvous_port


def processes_per_node(node: Node) -> int:
    """One process per GPU; ``allreduce_cpu_procs`` (default 1) on nodes without GPUs."""
    gpus = node.facts.get("gpus") if node.facts else None
    return len(gpus) if gpus else node.typed(Probe).allreduce_cpu_procs


def _torchrun(node: Node) -> str:
    """torchrun beside the training interpreter, else the one on PATH."""
    python = training_python(node.host)
    return str(Path(python).with_name("torchrun")) if "/" in python else "torchrun"


def _command(node: Node, *, rank: int, nodes: list[Node], probe: str, args: list[str],
             timeout_s: float, port: int, nproc: int | None,
             extra_env: Mapping[str, str] | None = None) -> str:
    env = dict(SAFE_ENV, OMP_NUM_THREADS="1", TMPDIR=str(Path(probe).parent))
    ifname = socket_ifname(node)
    if ifname:
        env.update(GLOO_SOCKET_IFNAME=ifname, NCCL_SOCKET_IFNAME=ifname)
    env.update({k: v for k, v in (extra_env or {}).items() if k not in SAFE_ENV})
    rundir = str(Path(probe).parent)
    torchrun = ([node.typed(ContainerSettings).container_python, "-m", "torch.distributed.run"]
                if container.image(node) else [_torchrun(node)])
    launch = [*torchrun, f"--nproc-per-node={nproc or processes_per_node(node)}"]
    if len(nodes) == 1:
        launch += ["--standalone", "--nnodes=1"]
    else:
        launch += [f"--nnodes={len(nodes)}", f"--node-rank={rank}",
                   f"--master-addr={nodes[0].host.address}", f"--master-port={port}"]
    limit = ["timeout", "-k", "10", str(int(timeout_s))]
    if container.image(node):
        inner = shlex.join([*limit, *container.run_argv(node, rundir, [*launch, probe, *args],
                                                        env)])
    else:
        inner = shlex.join(["env", *(f"{k}={v}" for k, v in env.items()), *limit, *launch,
                            probe, *args])
    return f"cd {shlex.quote(rundir)} && {inner}; echo \"{RC_MARK}$?\""


def _exit_status(lines: list[str]) -> int | None:
    """The probe's exit status from the shell's own last line: a probe that prints the
    marker itself, earlier or malformed, can neither set nor break it."""
    last = next((line.strip() for line in reversed(lines) if line.strip()), "")
    status = last.removeprefix(RC_MARK)
    return int(status) if last.startswith(RC_MARK) and re.fullmatch(r"\d{1,3}", status) \
        else None


def _parse(stdout: str, stderr: str) -> NodeOutput:
    events: list[dict[str, Any]] = []
    lines = stdout.splitlines()
    rc = _exit_status(lines)
    for raw in lines:
        line = raw.strip()
        if line.startswith("{"):
            try:
                events.append(json.loads(line))
            except (json.JSONDecodeError, RecursionError):
                continue  # not one of the probe's lines
    tail = " | ".join(stderr.strip().splitlines()[-3:])[-400:]
    nccl = [line.strip() for line in (stdout + "\n" + stderr).splitlines()
            if " NCCL INFO " in line or " NCCL WARN " in line]
    return NodeOutput(rc, events, tail, condense(nccl))


def run_probe(probe_name: str, nodes: list[Node], args: list[str], timeout_s: float, *,
              port: int = RENDEZVOUS_PORT, nproc: int | None = None,
              env: Mapping[str, str] | None = None) -> ProbeRun:
    """Run ``conformance/probes/<probe_name>.py`` under torchrun on ``nodes`` together
    (``nproc`` processes per node, default one per GPU; ``env`` over the launch's own,
    never over NVLink multicast's off switches); every process is gone when this returns
    or raises."""
    run = ProbeRun([n.name for n in nodes])
    rundir = f"/tmp/gpufleet-probe-{uuid.uuid4().hex[:12]}"
    probe = f"{rundir}/{probe_name}.py"
    start = time.monotonic()
    with _ACTIVE_LOCK:
        _ACTIVE[rundir] = list(nodes)

    def one(indexed: tuple[int, Node]) -> tuple[str, NodeOutput]:
        rank, node = indexed
        try:
            _ship(node, rundir, probe_name)
            command = _command(node, rank=rank, nodes=nodes, probe=probe, args=args,
                               timeout_s=timeout_s, port=port, nproc=nproc, extra_env=env)
            result = node.run(command, timeout=timeout_s + 60)
        except GpufleetError as exc:
            return node.name, NodeOutput(None, [], str(exc))
        return node.name, _parse(result.stdout, result.stderr)

    try:
        with ThreadPoolExecutor(max_workers=max(1, len(nodes))) as pool:
            run.outputs = dict(pool.map(keeps_node_local(one), enumerate(nodes)))
        run.duration = time.monotonic() - start
        run.timed_out = any(o.rc in (124, 137) for o in run.outputs.values())
    finally:
        run.leftovers = clean_up(rundir, nodes)
    return run


def clean_up(rundir: str, nodes: list[Node]) -> dict[str, str]:
    """Kill every process of the launch in ``rundir`` on ``nodes`` and remove the directory;
    node -> what was still running afterwards (or why the clean-up failed)."""
    # The pattern and the glob match the probe's path, but this command line does not
    # contain that path literally, so pkill cannot match its own shell.
    pattern = shlex.quote("[/]" + rundir.lstrip("/") + "/")
    glob = shlex.quote(rundir[:-1]) + f"[{rundir[-1]}]"
    processes = f"pkill -KILL -f {pattern}; sleep 0.5; pgrep -af {pattern}; rm -rf {glob}; true"

    def one(node: Node) -> tuple[str, str]:
        command = (f"{container.removal(node, rundir)}; {processes}" if container.image(node)
                   else processes)
        if not node.budget.spent:
            with contextlib.suppress(GpufleetError):
                return node.name, node.run(command, timeout=CLEANUP_BUDGET_S).stdout.strip()
        conn = node.connector(node.host, node.connect_options, Budget(CLEANUP_BUDGET_S))
        try:
            return node.name, conn.run(command, timeout=CLEANUP_BUDGET_S - 5).stdout.strip()
        except GpufleetError as exc:
            return node.name, f"cleanup failed: {exc}"
        finally:
            conn.close()

    try:
        with ThreadPoolExecutor(max_workers=max(1, min(64, len(nodes)))) as pool:
            return {name: left for name, left in pool.map(keeps_node_local(one), nodes)
                    if left}
    finally:
        with _ACTIVE_LOCK:
            _ACTIVE.pop(rundir, None)


def cleanup_active() -> dict[str, dict[str, str]]:
    """Clean up every launch that has not ended (the run is being stopped)."""
    with _ACTIVE_LOCK:
        active = dict(_ACTIVE)
    return {rundir: clean_up(rundir, nodes) for rundir, nodes in active.items()}


def run_script(node: Node, probe_name: str, args: list[str], timeout_s: float, *,
               in_image: bool = False) -> NodeOutput:
    """Run a single-process probe (``conformance/probes/<probe_name>.py``) on one node with
    its training interpreter, or (``in_image``, when the node has an image) in a container
    of its image with the image's interpreter; the probe's files (and the container) are
    removed afterwards."""
    rundir = f"/tmp/gpufleet-probe-{uuid.uuid4().hex[:12]}"
    probe = f"{rundir}/{probe_name}.py"
    removal = f"rm -rf {shlex.quote(rundir)}"
    if in_image and container.image(node):
        python = node.typed(ContainerSettings).container_python
        argv = container.run_argv(node, rundir, [python, probe, *args], SAFE_ENV)
        launch = shlex.join(["timeout", "-k", "10", str(int(timeout_s)), *argv])
        removal = f"{container.removal(node, rundir)}; {removal}"
    else:
        env = " ".join(f"{k}={v}" for k, v in SAFE_ENV.items())
        launch = f"env {env} {shlex.join([training_python(node.host), probe, *args])}"
    command = f"trap {shlex.quote(removal)} EXIT; {launch}; echo \"{RC_MARK}$?\""
    try:
        _ship(node, rundir, probe_name)
        result = node.run(command, timeout=timeout_s + 30)
    except GpufleetError:
        with contextlib.suppress(GpufleetError):
            node.run(removal, timeout=CLEANUP_BUDGET_S)
        raise
    return _parse(result.stdout, result.stderr)


def _ship(node: Node, rundir: str, probe_name: str) -> None:
    """Copy the probe and the module every probe shares into ``rundir`` on the node."""
    for name in (f"{probe_name}.py", SHARED):
        node.conn.put(f"{rundir}/{name}", (PROBES / name).read_bytes(), backup=False)
