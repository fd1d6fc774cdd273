#!/opt/gpufleet/venv/bin/python
"""gpufleet-gang-check: one short AllReduce among a multi-node job's nodes, run as the job's
first step, that names the node that fails.

    srun --ntasks-per-node=1 /opt/gpufleet/venv/bin/python /usr/local/sbin/gpufleet-gang-check \\
        [--timeout 60] [--size-mb 64] [--min-busbw-gbps X] [--backend auto|nccl|gloo] [--drain] \\
        || exit 1

It runs on the node with the standard library and torch only (no gpufleet install). One rank
per node: the rank is SLURM_PROCID, the world SLURM_NTASKS, rank i the i-th node of the step's
node list (SLURM_STEP_NODELIST, else SLURM_JOB_NODELIST, expanded here), whose first node
holds the rendezvous (a TCPStore) on --port, by default ``PORT_BASE + SLURM_JOB_ID % PORT_SPAN``
(29501-29516), so two jobs that share a first node rarely meet and the job's own torchrun
keeps 29500.

Every rank leaves marks in the store as it goes (``joined/<rank>``, ``ready/<rank>`` before
the AllReduce, ``done/<rank>`` after it), so the node that never came, or never reached or
finished the collective, is named by the others even though it says nothing itself. Checks:

  rendezvous  every node joins within half of --timeout
  gpu         with the NCCL backend, torch sees a GPU on every node
  collective  every node reaches and finishes the AllReduce before --timeout
  result      the sum of the ranks' values is right on every node
  busbw       the bus bandwidth (algbw * 2(n-1)/n) is at least --min-busbw-gbps, when given

A failure prints ``gf gang/<check>: <node>: <message>``: rank 0 one line per failure, then
the summary ``gf gang: PASS ...`` or ``gf gang: FAIL ...``; every other rank that ends in
failure one line (its own node's failure, else the first). With --drain, rank 0 drains each
node a failure names, keeping the node's other findings, in the reason format of
gpufleet/slurm/findings.py (source ``gang``, letter ``g``, shown ``gang/<check>``).

The whole run is bounded: the store and the process group get the time left of --timeout, a
watchdog thread reports what the store shows at --timeout and a second one ends the process
(os._exit) ``GRACE_S`` later (plus ``DRAIN_BUDGET_S`` on rank 0 with --drain).

Exit status: 0 every check passed, 1 a check failed, 2 bad usage.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from collections.abc import Collection, Mapping, Sequence

    from torch._C._distributed_c10d import Store

PROG = "gpufleet-gang-check"
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
PORT_BASE = 29501
PORT_SPAN = 16
JOIN_SHARE = 0.5  # of --timeout: the rendezvous; the AllReduce and the verdict get the rest
GRACE_S = 5.0  # after --timeout: for the report, then the process ends whatever it does
DRAIN_BUDGET_S = 20.0  # rank 0 with --drain: every scontrol call together
SCONTROL_TIMEOUT_S = 5.0
BYE_S = 2.0  # rank 0 keeps its store up this long for the others to read the verdict
STORE_OP_S = 2.0  # the watchdog's store reads
ITERS = 5  # timed AllReduces after the checked one
SHOWN = 8  # failures the summary line names
DISTINCT_MAX = 4096  # ranks fill rank+1 up to here: exact sums in float32, and a culprit
MAX_HOSTS = 65536
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# NVLink multicast stays off, as in gpufleet's probes: on some hosts it takes GPUs out of service.
SAFE_ENVIRONMENT = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                    "NVSHMEM_DISABLE_NVLS": "1"}
# The reason format of gpufleet/slurm/findings.py (tests/unit/test_gang_check.py holds the
# two together). Findings of sources this copy does not know are kept as they are.
PREFIX = "gf "
LETTER = "g"
LABEL = "gang/"
MESSAGE_LIMIT = 160
MOST = 40
_TRAILER = re.compile(r" \{gf1 (?P<body>[^{}]*)\}$")
_TOKEN = re.compile(r"^(?P<source>[a-z]):(?P<id>[^\s@{}]+)@(?P<since>\d+)$")
_MORE = re.compile(r" \(\+\d+ more\)$")
_PUNCTUATION = str.maketrans({'"': "'", "{": "(", "}": ")", "[": "(", "]": ")"})
_SLURM_FIELD = re.compile(r"\b(Reason|Comment|Extra)=")
_STATE = re.compile(r"(?:^|\s)State=(\S+)")
_REASON = re.compile(r"\sReason=(.*?)(?: \[[^\]\s]*@[^\]\s]+\])?(?: (?:Comment|Extra)=.*)?$")
_BRACKET = re.compile(r"^(?P<head>[^\[\]]*)\[(?P<ranges>[^\[\]]*)\](?P<tail>.*)$")
_RANGE = re.compile(r"([0-9]+)(?:-([0-9]+))?")
_PRINTING = threading.Lock()


class UsageError(Exception):
    """The command line or the job's environment cannot be used."""


# ---- Slurm hostlists ---------------------------------------------------------------------------

def expand_hostlist(text: str) -> list[str]:
    """Every host of a Slurm hostlist, in its order: ``node[01-03,07],gpu5`` is node01,
    node02, node03, node07, gpu5; a range keeps its low end's width; several brackets in one
    name (``r[1-2]n[1-2]``) expand the first slowest."""
    hosts: list[str] = []
    for item in _items(text):
        hosts.extend(_expand(item))
        if len(hosts) > MAX_HOSTS:
            raise ValueError(f"hostlist {text[:80]!r} names more than {MAX_HOSTS} hosts")
    if not hosts:
        raise ValueError(f"empty hostlist {text!r}")
    return hosts


def _items(text: str) -> list[str]:
    """The hostlist's names, split at commas and blanks outside brackets."""
    items, current, depth = [], "", 0
    for char in text:
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth not in (0, 1):
            raise ValueError(f"unbalanced brackets in hostlist {text!r}")
        if depth == 0 and (char == "," or char.isspace()):
            items.append(current)
            current = ""
        else:
            current += char
    if depth:
        raise ValueError(f"unbalanced brackets in hostlist {text!r}")
    return [item for item in [*items, current] if item]


def _expand(item: str) -> list[str]:
    match = _BRACKET.match(item)
    if match is None:
        if "[" in item or "]" in item:
            raise ValueError(f"unbalanced brackets in {item!r}")
        return [item]
    tails = _expand(match["tail"]) if match["tail"] else [""]
    return [match["head"] + value + tail for value in _values(match["ranges"], item)
            for tail in tails]


def _values(ranges: str, item: str) -> list[str]:
    values: list[str] = []
    for part in ranges.split(","):
        found = _RANGE.fullmatch(part.strip())
        if found is None:
            raise ValueError(f"bad range {part!r} in {item!r}")
        low = found[1]
        first, last = int(low), int(found[2] or low)
        if last < first:
            raise ValueError(f"bad range {part!r} in {item!r}")
        if last - first >= MAX_HOSTS:
            raise ValueError(f"range {part!r} in {item!r} names more than {MAX_HOSTS} hosts")
        values.extend(str(n).zfill(len(low)) for n in range(first, last + 1))
    return values


# ---- the job ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Job:
    """Where this process sits: its rank among one rank per node, and how to meet the others."""

    rank: int
    world: int
    local_rank: int
    nodes: list[str]
    nodelist: str  # as Slurm wrote it (hostlist form), to name the whole job
    job_id: str
    master: str
    port: int

    @property
    def node(self) -> str:
        return self.nodes[self.rank]


def derived_port(job_id: str) -> int:
    """The rendezvous port of a job without --port: 29501-29516 by its job id."""
    return PORT_BASE + int(job_id) % PORT_SPAN


def _env_int(environ: Mapping[str, str], names: Sequence[str]) -> int:
    for name in names:
        if environ.get(name, "").strip():
            value = environ[name].strip()
            if not value.isdigit():
                raise UsageError(f"{name}={value!r} is not a number")
            return int(value)
    raise UsageError(f"{' or '.join(names)} is not set: run it as a job step, "
                     "srun --ntasks-per-node=1 ...")


def job_from_environ(environ: Mapping[str, str], args: argparse.Namespace) -> Job:
    """The job as srun describes it to each task; one task per node, or a UsageError."""
    rank = _env_int(environ, ["SLURM_PROCID"])
    world = _env_int(environ, ["SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"])
    local_rank = _env_int(environ, ["SLURM_LOCALID"]) if environ.get("SLURM_LOCALID") else 0
    nodelist = next((environ[k] for k in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST",
                                          "SLURM_NODELIST") if environ.get(k)), "")
    if not nodelist:
        raise UsageError("SLURM_STEP_NODELIST or SLURM_JOB_NODELIST is not set: run it as a "
                         "job step, srun --ntasks-per-node=1 ...")
    try:
        nodes = expand_hostlist(nodelist)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if world != len(nodes):
        raise UsageError(f"{world} task(s) on {len(nodes)} node(s) ({nodelist}): run one task "
                         "per node, srun --ntasks-per-node=1 ...")
    if not 0 <= rank < world:
        raise UsageError(f"SLURM_PROCID {rank} is outside 0-{world - 1}")
    here = environ.get("SLURMD_NODENAME")
    if here and here != nodes[rank]:
        raise UsageError(f"rank {rank} runs on {here}, not on {nodes[rank]}, the node of its "
                         "rank in the node list: run one task per node, srun "
                         "--ntasks-per-node=1 ...")
    job_id = environ.get("SLURM_JOB_ID", "").strip()
    if args.port is None and not job_id.isdigit():
        raise UsageError("SLURM_JOB_ID is not set (or not a number) and no --port is given")
    port = args.port if args.port is not None else derived_port(job_id)
    return Job(rank, world, local_rank, nodes, nodelist, job_id or "0",
               args.master_addr or nodes[0], port)


# ---- verdicts: pure functions of what the ranks reported ----------------------------------------

@dataclass(frozen=True)
class Failure:
    """One failed check and the node it names; ``attributed`` False when no single node can
    be blamed (``node`` is then the job's node list, or the node whose port was taken):
    such a failure is never drained."""

    check: str
    node: str
    message: str
    attributed: bool = True

    def line(self) -> str:
        return f"gf gang/{self.check}: {self.node}: {self.message}"


@dataclass(frozen=True)
class RankResult:
    """What one rank's AllReduce gave: elements off the expected sum, the first such
    element's value, and its seconds per timed AllReduce."""

    wrong: int
    got: float | None
    seconds: float


def join_failures(nodes: Sequence[str], nodelist: str, joined: Collection[int],
                  waited_s: float, store_at: str = "the first node's store") -> list[Failure]:
    """The nodes whose rank never left its ``joined`` mark. When none but the first node's
    did, no node is named: the others may all have been unable to reach the store (a
    firewall on the first node, a wrong address) rather than all broken."""
    missing = [rank for rank in range(len(nodes)) if rank not in joined]
    if missing and set(joined) <= {0}:
        named = nodes[missing[0]] if len(missing) == 1 else nodelist
        return [Failure("rendezvous", named, f"no other node joined within {waited_s:.1f}s: "
                        f"can they reach {store_at} (a firewall?), or did they all fail?",
                        attributed=False)]
    return [Failure("rendezvous", nodes[rank], f"did not join within {waited_s:.1f}s "
                                               f"(rank {rank})") for rank in missing]


def backend_plan(nodes: Sequence[str], gpus: Mapping[int, int], requested: str
                 ) -> tuple[str, list[Failure]]:
    """The backend every rank uses, and the nodes that cannot: ``auto`` is NCCL when any node
    sees a GPU (then a node that sees none fails), else gloo."""
    seeing = [rank for rank in range(len(nodes)) if gpus.get(rank, 0) > 0]
    if requested == "gloo" or (requested == "auto" and not seeing):
        return "gloo", []
    why = (f"torch sees no GPU while {len(seeing)} other node(s) do" if seeing
           else "torch sees no GPU and --backend nccl needs one")
    return "nccl", [Failure("gpu", node, why) for rank, node in enumerate(nodes)
                    if rank not in seeing]


def stall_failures(nodes: Sequence[str], nodelist: str, joined: Collection[int], *,
                   ready: Collection[int], done: Collection[int], waited_s: float
                   ) -> list[Failure]:
    """Who held the run up, from the marks in the store: a node that never joined, that
    joined but never started the AllReduce (its process group included), or that did not
    finish it while others did. When
    every node entered and none finished, no one node can be named. Empty when every node
    finished."""
    missing = join_failures(nodes, nodelist, joined, waited_s)
    if missing:
        return missing
    unready = [Failure("collective", node, f"joined but did not start the AllReduce within "
                                           f"{waited_s:.1f}s (rank {rank})")
               for rank, node in enumerate(nodes) if rank not in ready]
    if unready:
        return unready
    if not done:
        return [Failure("collective", nodelist, f"every node entered the AllReduce and none "
                        f"finished within {waited_s:.1f}s: a link or the fabric, not one node",
                        attributed=False)]
    return [Failure("collective", node, f"did not finish the AllReduce within {waited_s:.1f}s "
                                        f"while {len(done)} other node(s) did (rank {rank})")
            for rank, node in enumerate(nodes) if rank not in done]


def fill_values(world: int) -> list[int]:
    """Each rank's value: rank + 1, so a sum that misses one rank's contribution names it;
    all 1 past DISTINCT_MAX ranks, where rank + 1 would leave float32's exact integers."""
    return [rank + 1 if world <= DISTINCT_MAX else 1 for rank in range(world)]


def result_failures(nodes: Sequence[str], nodelist: str, results: Mapping[int, RankResult],
                    values: Sequence[int]) -> list[Failure]:
    """The nodes whose AllReduce gave a wrong sum. When every node got the same wrong value
    and it is the right sum less (or plus) one rank's value, that rank's node is named;
    otherwise every node that got a wrong sum, or the whole job when all did."""
    expected = sum(values)
    wrong = {rank: r for rank, r in sorted(results.items()) if r.wrong}
    if not wrong:
        return []
    gots = {_value(r.got) for r in wrong.values()}
    if len(wrong) == len(nodes) and len(gots) == 1 and len(set(values)) == len(values):
        got = gots.pop()
        owner = {float(v): rank for rank, v in enumerate(values)}
        for delta, what in ((expected - got, "is missing from"), (got - expected,
                                                                   "is counted twice in")):
            if delta in owner:
                return [Failure("result", nodes[owner[delta]],
                                f"its contribution {what} every node's sum ({got:g}, "
                                f"expected {expected}; rank {owner[delta]})")]
    if len(wrong) == len(nodes):
        first = next(iter(wrong.values()))
        return [Failure("result", nodelist, f"every node's sum is wrong ({first.wrong} "
                        f"element(s) on rank 0, first {_value(first.got):g}, expected "
                        f"{expected})", attributed=False)]
    return [Failure("result", nodes[rank], f"{r.wrong} element(s) of its sum wrong (first "
                                           f"{_value(r.got):g}, expected {expected}; rank "
                                           f"{rank})")
            for rank, r in wrong.items()]


def _value(got: float | None) -> float:
    return math.nan if got is None else got


def bandwidth(size_bytes: int, seconds: float, world: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (1e9 bytes) of one AllReduce, as nccl-tests defines them."""
    algbw = size_bytes / seconds / 1e9 if seconds > 0 else math.inf
    return algbw, algbw * 2 * (world - 1) / world


def bandwidth_failure(nodelist: str, busbw: float, minimum: float | None, world: int
                      ) -> Failure | None:
    """The busbw check: none without a minimum or with one node (nothing crosses a link).
    A slow AllReduce is the job's, not one node's."""
    if minimum is None or world < 2 or busbw >= minimum:
        return None
    return Failure("busbw", nodelist, f"{busbw:.2f} GB/s, below --min-busbw-gbps {minimum:g}",
                   attributed=False)


def fail_line(failures: Sequence[Failure], job: Job, seconds: float) -> str:
    """Rank 0's summary of a failed run: the checks and nodes, the first SHOWN of them."""
    named = ", ".join(f"{f.check} {f.node}" for f in failures[:SHOWN])
    more = f" (+{len(failures) - SHOWN} more)" if len(failures) > SHOWN else ""
    return (f"gf gang: FAIL: {named}{more}; {job.world} node(s) ({job.nodelist}), "
            f"{seconds:.1f}s")


# ---- the drain reason (the format of gpufleet/slurm/findings.py) --------------------------------

def one_line(text: str) -> str:
    """As findings.one_line: the text cannot end the reason early when read back."""
    cleaned = "".join(" " if ord(c) < 32 or ord(c) == 127 else c for c in text)
    cleaned = _SLURM_FIELD.sub(r"\1:", cleaned.translate(_PUNCTUATION))
    return " ".join(cleaned.split())


def drain_reason(previous: str | None, check: str, message: str, now: int) -> str | None:
    """The reason with the finding ``g:<check>`` added to those of ``previous`` (the reason of
    a node that is drained already, None for one that is not); None when ``previous`` is not
    in gpufleet's current format (an operator's reason, or an older gpufleet's), which is
    left alone. The first finding keeps its message unless it is this one."""
    ident = re.sub(r"[\s@{}]", "_", check) or "check"
    shown = one_line(message)[:MESSAGE_LIMIT].rstrip() or "failed"
    fresh = f"{PREFIX}{LABEL}{ident}: {shown} {{gf1 {LETTER}:{ident}@{now}}}"
    if not previous:
        return fresh
    if not previous.startswith(PREFIX):
        return None
    trailer = _TRAILER.search(previous)
    tokens = [t for t in (trailer["body"].split() if trailer else []) if _TOKEN.match(t)]
    if trailer is None or not tokens:
        return fresh
    keys = [t.rsplit("@", 1)[0] for t in tokens]
    mine = f"{LETTER}:{ident}"
    if mine not in keys:
        tokens.append(f"{mine}@{now}")
    if keys[0] == mine:
        head = f"{PREFIX}{LABEL}{ident}: {shown}"
    else:
        label, _, kept = _MORE.sub("", previous[:trailer.start()]).partition(": ")
        since = int(tokens[0].rsplit("@", 1)[1])
        kept = one_line(kept)[:MESSAGE_LIMIT].rstrip() or \
            "open since " + time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime(since))
        head = f"{label}: {kept}"
    more = f" (+{len(tokens) - 1} more)" if len(tokens) > 1 else ""
    return f"{head}{more} {{gf1 {' '.join(tokens[:MOST])}}}"


def parse_slurm_node(text: str) -> tuple[str, str | None]:
    """(State, Reason) from ``scontrol --oneliner show node NAME``."""
    line = next((ln for ln in text.splitlines() if ln.startswith("NodeName=")), "")
    state = _STATE.search(line)
    if not state:
        raise ValueError(f"no State= in scontrol's answer {text.strip()[:80]!r}")
    reason = _REASON.search(line)
    return state[1], (reason[1].strip() or None) if reason else None


def _scontrol(args: list[str], timeout: float) -> tuple[bool, str]:
    env = dict(os.environ, PATH=os.environ.get("PATH") or DEFAULT_PATH, LC_ALL="C")
    try:
        done = subprocess.run(["scontrol", *args], stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, env=env, timeout=timeout,
                              check=False)
    except FileNotFoundError:
        return False, "scontrol not found"
    except subprocess.TimeoutExpired:
        return False, f"scontrol did not answer within {timeout:.1f}s"
    text = (done.stdout + done.stderr).strip()
    return done.returncode == 0, text.splitlines()[-1] if done.returncode and text else text


def drain(failures: Sequence[Failure], budget_s: float, now: int) -> list[str]:
    """Drain each node an attributed failure names (its first failure becomes the finding),
    within ``budget_s`` for every scontrol call together; a line per node."""
    end = time.monotonic() + budget_s
    first: dict[str, Failure] = {}
    for failure in failures:
        if failure.attributed:
            first.setdefault(failure.node, failure)
    lines = []
    for node, failure in first.items():
        left = min(SCONTROL_TIMEOUT_S, end - time.monotonic())
        if left <= 0:
            lines.append(f"gf gang: {node} not drained: no time left of {budget_s:g}s")
            continue
        ok, text = _scontrol(["--oneliner", "show", "node", node], left)
        try:
            state, reason = parse_slurm_node(text) if ok else ("", None)
        except ValueError as exc:
            ok, text = False, str(exc)
        if not ok:
            lines.append(f"gf gang: {node} not drained: {text}")
            continue
        held = "DRAIN" in state.split("+")[1:] or state.split("+")[0] == "DOWN"
        wanted = drain_reason(reason if held else None, failure.check, failure.message, now)
        if wanted is None:
            lines.append(f"gf gang: {node} left alone: drained by someone else: {reason}")
        elif held and wanted == reason:
            lines.append(f"gf gang: {node} already drained: {reason}")
        else:
            ok, text = _scontrol(["update", f"nodename={node}", "state=drain",
                                  f"reason={wanted}"],
                                 max(0.1, min(SCONTROL_TIMEOUT_S, end - time.monotonic())))
            lines.append(f"gf gang: {node} drained: {wanted}" if ok else
                         f"gf gang: {node} not drained: {text}")
    return lines


# ---- the run ------------------------------------------------------------------------------------

def say(line: str) -> None:
    """One line on stdout in a single write, whichever thread prints."""
    with _PRINTING:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def _left(deadline: float) -> datetime.timedelta:
    """The time left until ``deadline``, never zero (which torch reads as no timeout)."""
    return datetime.timedelta(seconds=max(0.01, deadline - time.monotonic()))


class Run:
    """One rank's run: the job, its deadlines, and what the watchdog needs to report."""

    def __init__(self, job: Job, args: argparse.Namespace, started: float) -> None:
        self.job = job
        self.args = args
        self.started = started
        self.phase = "starting"
        self.watch_store: Store | None = None  # the watchdog's own connection to the store
        self.joined_at = started
        self.store_up = 0.0  # seconds from the start until this rank reached the store
        self.join_deadline = started + args.timeout * JOIN_SHARE
        self.deadline = started + args.timeout
        extra = DRAIN_BUDGET_S if job.rank == 0 and args.drain else 0.0
        self.hard_deadline = self.deadline + GRACE_S + extra
        self.claimed = threading.Event()
        self._lock = threading.Lock()

    def claim(self) -> bool:
        """Whether this thread ends the run (the first to ask does)."""
        with self._lock:
            if self.claimed.is_set():
                return False
            self.claimed.set()
            return True

    def waited(self) -> float:
        return time.monotonic() - self.started


def connect(job: Job, deadline: float, master: bool) -> Store:
    """This job's keys in the store on the first node (``master``: hold it there)."""
    import torch.distributed as dist  # noqa: PLC0415 - torch only once the command line is good

    store = dist.TCPStore(job.master, job.port, None, master,  # type: ignore[attr-defined]
                          _left(deadline), wait_for_workers=False)
    prefixed: Store = dist.PrefixStore(f"gf-gang/{job.job_id}/", store)  # type: ignore[attr-defined]
    return prefixed


def present(store: Store, mark: str, world: int) -> set[int]:
    """The ranks that left ``mark/<rank>`` in the store."""
    return {rank for rank in range(world) if store.check([f"{mark}/{rank}"])}


def join(store: Store, job: Job, gpus: int) -> None:
    """Leave this rank's mark and count it; the last to come says everyone is there."""
    store.set(f"joined/{job.rank}", json.dumps({"node": job.node, "gpus": gpus}))
    if store.add("joined", 1) == job.world:
        store.set("all_joined", "1")


def store_view(run: Run, store: Store) -> list[Failure]:
    """Who held the run up, as the store shows it; the first node when its store is gone."""
    job = run.job
    try:
        store.set_timeout(datetime.timedelta(seconds=STORE_OP_S))
        failures = stall_failures(job.nodes, job.nodelist, present(store, "joined", job.world),
                                  ready=present(store, "ready", job.world),
                                  done=present(store, "done", job.world),
                                  waited_s=run.waited())
    except Exception as exc:
        return [Failure("collective", job.nodes[0], f"its store went away after "
                        f"{run.waited():.1f}s ({_short(exc)}): rank 0 ended or its node failed")]
    if failures:
        return failures
    return [Failure("collective", job.nodes[0], f"every node finished but rank 0 gave no "
                                                f"verdict within {run.waited():.1f}s")]


def _short(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:200]


def finish(run: Run, store: Store | None, failures: list[Failure], summary: str = "",
           joined: int | None = None) -> NoReturn:
    """End the run: rank 0 posts the verdict, prints every failure and the summary, drains
    with --drain and keeps its store up until the others read it; another rank prints one
    line when the run failed. Only the first thread to get here reports."""
    if not run.claim():
        threading.Event().wait()  # the other thread reports and ends the process
    job = run.job
    code = EXIT_FAILED if failures else EXIT_OK
    if job.rank == 0:
        with contextlib.suppress(Exception):
            if store is not None:
                store.set("verdict", json.dumps([asdict(f) for f in failures]))
        for failure in failures:
            say(failure.line())
        say(fail_line(failures, job, run.waited()) if failures else f"gf gang: PASS: {summary}")
        if run.args.drain and failures:
            for line in drain(failures, DRAIN_BUDGET_S, int(time.time())):
                say(line)
        _await_byes(store, (job.world if joined is None else joined) - 1)
    else:
        if failures:
            mine = [f for f in failures if f.node == job.node] or failures
            more = f" (+{len(failures) - 1} more)" if len(failures) > 1 else ""
            say(mine[0].line() + more)
        with contextlib.suppress(Exception):
            if store is not None:
                store.add("bye", 1)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _await_byes(store: Store | None, others: int) -> None:
    end = time.monotonic() + BYE_S
    with contextlib.suppress(Exception):
        while store is not None and others > 0 and time.monotonic() < end:
            if store.add("bye", 0) >= others:
                return
            time.sleep(0.02)


def watch(run: Run) -> None:
    """At --timeout, report what the store shows, unless the run has ended by then."""
    if run.claimed.wait(max(0.0, run.deadline - time.monotonic())):
        return
    job = run.job
    if run.watch_store is None:
        blamed = job.nodes[0] if run.phase == "connecting to the store" and job.rank else job.node
        failures = [Failure("rendezvous", blamed, f"rank {job.rank} on {job.node} was still "
                                                  f"{run.phase} after {run.waited():.1f}s")]
    else:
        failures = store_view(run, run.watch_store)
    finish(run, run.watch_store, failures)


def kill_at_hard_deadline(run: Run) -> None:
    """The last resort: end the process ``GRACE_S`` after --timeout, whatever it is doing."""
    time.sleep(max(0.0, run.hard_deadline - time.monotonic()))
    say(f"gf gang/timeout: {run.job.node}: rank {run.job.rank} ended after "
        f"{run.waited():.1f}s, {run.phase}")
    sys.stdout.flush()
    os._exit(EXIT_FAILED)


def execute(job: Job, args: argparse.Namespace, started: float) -> NoReturn:
    """The whole run of one rank, bounded by the watchdogs; it ends the process."""
    run = Run(job, args, started)
    threading.Thread(target=watch, args=(run,), daemon=True).start()
    threading.Thread(target=kill_at_hard_deadline, args=(run,), daemon=True).start()
    for key, value in SAFE_ENVIRONMENT.items():
        os.environ.setdefault(key, value)
    run.phase = "importing torch"
    import torch  # noqa: PLC0415 - torch only once the command line is good

    run.phase = "asking torch for GPUs"
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    run.phase = "connecting to the store"
    try:
        store = connect(job, run.join_deadline, master=job.rank == 0)
        run.watch_store = connect(job, run.join_deadline, master=False)
        run.store_up = run.waited()
    except Exception as exc:
        if job.rank == 0:
            finish(run, None, [Failure("rendezvous", job.node, f"cannot hold the store on port "
                                       f"{job.port}: {_short(exc)}", attributed=False)])
        finish(run, None, [Failure("rendezvous", job.nodes[0], f"its store {job.master}:"
                                   f"{job.port} did not answer within {run.waited():.1f}s: "
                                   f"{_short(exc)}")])
    run.phase = "waiting for the other nodes"
    backend = rendezvous(run, store, gpus)
    run.joined_at = time.monotonic()
    run.phase = "in the AllReduce"
    try:
        allreduce(run, store, backend)
    except Exception as exc:
        failures = [Failure(f.check, f.node, f"{f.message}: {_short(exc)}", f.attributed)
                    if f.node == job.node else f
                    for f in store_view(run, run.watch_store or store)]
        finish(run, store, failures)
    verdict(run, store, backend)


def rendezvous(run: Run, store: Store, gpus: int) -> str:
    """Join, wait for everyone and agree on the backend (rank 0 decides); the backend, or the
    run ends naming who did not come."""
    job = run.job
    join(store, job, gpus)
    if job.rank == 0:
        try:
            store.wait(["all_joined"], _left(run.join_deadline))
        except Exception:
            joined = present(store, "joined", job.world)
            failures = join_failures(job.nodes, job.nodelist, joined, run.waited(),
                                     f"{job.master}:{job.port} (up after {run.store_up:.1f}s)")
            with contextlib.suppress(Exception):
                store.set("plan", json.dumps({"failures": [asdict(f) for f in failures]}))
            finish(run, store, failures, joined=len(joined))
        counts = {rank: int(json.loads(store.get(f"joined/{rank}"))["gpus"])
                  for rank in range(job.world)}
        backend, failures = backend_plan(job.nodes, counts, run.args.backend)
        store.set("plan", json.dumps({"backend": backend,
                                      "failures": [asdict(f) for f in failures]}))
        if failures:
            finish(run, store, failures)
        return backend
    try:
        store.wait(["plan"], _left(run.deadline))
        plan = json.loads(store.get("plan"))
    except Exception:
        finish(run, store, store_view(run, run.watch_store or store))
    if plan["failures"]:
        finish(run, store, [Failure(**f) for f in plan["failures"]])
    return str(plan["backend"])


def allreduce(run: Run, store: Store, backend: str) -> None:
    """One checked AllReduce of --size-mb, then ITERS timed ones; this rank's result goes to
    the store."""
    import torch  # noqa: PLC0415 - imported already; torch only once the command line is good
    import torch.distributed as dist  # noqa: PLC0415

    job = run.job
    device = torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(job.local_rank)
        device = torch.device("cuda", job.local_rank)
    store.set(f"ready/{job.rank}", "1")
    dist.init_process_group(backend, store=dist.PrefixStore("pg/", store),  # type: ignore[attr-defined]
                            rank=job.rank,
                            world_size=job.world,
                            timeout=_left(run.deadline + GRACE_S))
    values = fill_values(job.world)
    count = max(1, run.args.size_mb * 2**20 // 4)
    buf = torch.full((count,), float(values[job.rank]), dtype=torch.float32, device=device)
    dist.all_reduce(buf)
    expected = float(sum(values))
    bad = buf != expected
    wrong = int(bad.sum().item())
    got = float(buf[bad.nonzero()[0]].item()) if wrong else None
    buf.zero_()
    _sync(device)
    start = time.perf_counter()
    for _ in range(ITERS):
        dist.all_reduce(buf)
    _sync(device)
    result = RankResult(wrong, got, (time.perf_counter() - start) / ITERS)
    store.set(f"done/{job.rank}", json.dumps(asdict(result)))
    if store.add("done", 1) == job.world:
        store.set("all_done", "1")


def _sync(device: Any) -> None:
    import torch  # noqa: PLC0415 - imported already

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def verdict(run: Run, store: Store, backend: str) -> NoReturn:
    """Rank 0 judges every rank's result; the others wait for its verdict."""
    job = run.job
    run.phase = "waiting for the verdict"
    if job.rank != 0:
        try:
            store.wait(["verdict"], _left(run.deadline))
            failures = [Failure(**f) for f in json.loads(store.get("verdict"))]
        except Exception:
            failures = store_view(run, run.watch_store or store)
        finish(run, store, failures)
    try:
        store.wait(["all_done"], _left(run.deadline))
        results = {rank: RankResult(**json.loads(store.get(f"done/{rank}")))
                   for rank in range(job.world)}
    except Exception:
        finish(run, store, store_view(run, run.watch_store or store))
    values = fill_values(job.world)
    size = max(1, run.args.size_mb * 2**20 // 4) * 4
    seconds = max(r.seconds for r in results.values())
    algbw, busbw = bandwidth(size, seconds, job.world)
    failures = result_failures(job.nodes, job.nodelist, results, values)
    slow = bandwidth_failure(job.nodelist, busbw, run.args.min_busbw_gbps, job.world)
    measured = (f"busbw {busbw:.2f} GB/s (algbw {algbw:.2f} GB/s, {backend}, {ITERS} timed)"
                if job.world > 1 else f"busbw n/a (one node, {backend})")
    summary = (f"{job.world} node(s) ({job.nodelist}): AllReduce of {run.args.size_mb} MiB "
               f"summed right, {measured}, {run.waited():.1f}s (start and join "
               f"{run.joined_at - run.started:.1f}s)")
    finish(run, store, failures + ([slow] if slow else []), summary)


# ---- the command line ---------------------------------------------------------------------------

def _seconds(text: str) -> float:
    value = _number(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 (seconds), got {text}")
    return value


def _gbps(text: str) -> float:
    value = _number(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {text}")
    return value


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"not a finite number: {text!r}")
    return value


def _mib(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of MiB, at least 1, got "
                                         f"{text!r}")
    return int(text)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line; argparse exits 2 on a bad one."""
    parser = argparse.ArgumentParser(
        prog=PROG, description="One short AllReduce among a multi-node job's nodes (one task "
        "per node), naming the node that fails. Exit 0 pass, 1 a check failed, 2 bad usage.")
    parser.add_argument("--timeout", type=_seconds, default=60.0,
                        help="seconds for the whole check; the rendezvous gets half (default 60)")
    parser.add_argument("--size-mb", type=_mib, default=64,
                        help="MiB of float32 each node contributes (default 64)")
    parser.add_argument("--min-busbw-gbps", type=_gbps,
                        help="fail below this bus bandwidth in GB/s (default: no bandwidth check)")
    parser.add_argument("--backend", choices=("auto", "nccl", "gloo"), default="auto",
                        help="auto: nccl when a node's torch sees a GPU, else gloo")
    parser.add_argument("--port", type=_port,
                        help=f"the rendezvous port on the first node (default {PORT_BASE} + "
                        f"SLURM_JOB_ID %% {PORT_SPAN})")
    parser.add_argument("--master-addr",
                        help="address of the first node (default: its name in the node list)")
    parser.add_argument("--drain", action="store_true",
                        help="rank 0 drains every node a failure names (needs a Slurm operator)")
    return parser.parse_args(argv)


def _port(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"not a TCP port: {text!r}")
    return int(text)


def main(argv: Sequence[str] | None = None) -> int:
    """Check the command line and the job, then run (the run ends the process itself)."""
    started = time.monotonic()
    args = parse_args(argv)
    try:
        job = job_from_environ(os.environ, args)
    except UsageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    execute(job, args, started)


if __name__ == "__main__":
    sys.exit(main())
