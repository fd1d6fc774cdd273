"""gpufleet-gang-check (gpufleet/node/gang_check.py), the opt-in first step of a multi-node job:
Slurm's hostlists, the job from srun's environment, the verdicts as pure functions of what
the ranks reported, the drain reason against gpufleet/slurm/findings.py, and real runs of
2 and 3 ranks over gloo on 127.0.0.1 (forked from this process, which has imported torch once,
so a run costs no torch import), among them a rank that never joins and one that joins but
never starts the AllReduce."""

from __future__ import annotations

import ast
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from ClusterShell.NodeSet import NodeSet

from gpufleet.node import gang_check as gang
from gpufleet.node.gang_check import Failure, RankResult
from gpufleet.slurm import findings
from gpufleet.slurm.findings import Finding
from tests.conftest import stand_in

PROGRAM = Path(gang.__file__)
NODES3 = ["node01", "node02", "node03"]
T0 = 1764590000


# ---- the program as a file -------------------------------------------------------------------

def test_program_needs_only_the_standard_library_torch_and_python_3_9() -> None:
    tree = ast.parse(PROGRAM.read_text(), feature_version=(3, 9))
    roots = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
             for alias in node.names}
    roots |= {node.module.split(".")[0] for node in ast.walk(tree)
              if isinstance(node, ast.ImportFrom) and node.module}
    assert roots - set(sys.stdlib_module_names) == {"torch"}


def test_the_file_runs_alone_and_refuses_a_run_outside_srun(tmp_path: Path) -> None:
    """As a node runs it: a file, no gpufleet on the path; bad usage exits 2 before torch."""
    copy = tmp_path / "gpufleet-gang-check"
    copy.write_text(PROGRAM.read_text())
    env = {"PATH": os.environ["PATH"]}
    helped = subprocess.run([sys.executable, str(copy), "--help"], capture_output=True,
                            text=True, env=env, cwd=tmp_path, timeout=60, check=False)
    assert helped.returncode == 0 and "--min-busbw-gbps" in helped.stdout
    alone = subprocess.run([sys.executable, "-X", "importtime", str(copy)], capture_output=True,
                           text=True, env=env, cwd=tmp_path, timeout=60, check=False)
    assert alone.returncode == 2
    assert "SLURM_PROCID is not set: run it as a job step" in alone.stderr
    assert not re.search(r"\|\s+torch\b", alone.stderr)


# ---- Slurm hostlists -------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "hosts"), [
    ("node01", ["node01"]),
    ("node[01-03,07],gpu5", ["node01", "node02", "node03", "node07", "gpu5"]),
    ("gpu[8-11]", ["gpu8", "gpu9", "gpu10", "gpu11"]),
    ("gpu[008-010]", ["gpu008", "gpu009", "gpu010"]),
    ("a[1-2]b", ["a1b", "a2b"]),
    ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
    ("dgx-h200-[1,3],dgx-b200-07", ["dgx-h200-1", "dgx-h200-3", "dgx-b200-07"]),
    ("n[3],n1 n2", ["n3", "n1", "n2"]),
    ("node[09-10],login.example.org", ["node09", "node10", "login.example.org"]),
])
def test_a_slurm_hostlist_expands_in_its_order(text: str, hosts: list[str]) -> None:
    assert gang.expand_hostlist(text) == hosts


@pytest.mark.parametrize("text", ["node[01-03,07],gpu5", "gpu[008-012],gpu[1-3]",
                                  "r[1-3]n[01-02]", "x[0-99]"])
def test_the_expander_agrees_with_clustershell(text: str) -> None:
    assert set(gang.expand_hostlist(text)) == set(NodeSet(text))


@pytest.mark.parametrize(("text", "why"), [
    ("", "empty hostlist"),
    ("node[01-03", "unbalanced brackets"),
    ("node01-03]", "unbalanced brackets"),
    ("node[[1]]", "unbalanced brackets"),
    ("node[3-1]", "bad range '3-1'"),
    ("node[a-b]", "bad range 'a-b'"),
    ("node[]", "bad range ''"),
    ("node[0-99999]", "range '0-99999' in 'node[0-99999]' names more than 65536 hosts"),
    ("a[0-40000],b[0-40000]", "hostlist 'a[0-40000],b[0-40000]' names more than 65536 hosts"),
])
def test_a_bad_hostlist_is_refused(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=re.escape(why)):
        gang.expand_hostlist(text)


# ---- the job and the command line ------------------------------------------------------------

SRUN = {"SLURM_PROCID": "1", "SLURM_NTASKS": "3", "SLURM_JOB_NODELIST": "node[01-03]",
        "SLURM_JOB_ID": "4711", "SLURMD_NODENAME": "node02"}


def test_the_job_is_what_srun_describes() -> None:
    job = gang.job_from_environ(SRUN, gang.parse_args([]))
    assert (job.rank, job.world, job.node, job.master, job.nodelist) == (
        1, 3, "node02", "node01", "node[01-03]")
    assert job.port == 29501 + 4711 % 16 == 29508
    assert {gang.derived_port(str(i)) for i in range(100)} == set(range(29501, 29517))
    step = dict(SRUN, SLURM_STEP_NODELIST="gpu[1-3]", SLURM_STEP_NUM_TASKS="3",
                SLURM_NTASKS="6", SLURMD_NODENAME="gpu2")
    job = gang.job_from_environ(step, gang.parse_args(["--port", "29400",
                                                       "--master-addr", "10.0.0.1"]))
    assert (job.nodes, job.node, job.master, job.port) == (["gpu1", "gpu2", "gpu3"], "gpu2",
                                                           "10.0.0.1", 29400)


@pytest.mark.parametrize(("change", "why"), [
    ({"SLURM_PROCID": None}, "SLURM_PROCID is not set: run it as a job step"),
    ({"SLURM_NTASKS": "x"}, "SLURM_NTASKS='x' is not a number"),
    ({"SLURM_JOB_NODELIST": None}, "SLURM_STEP_NODELIST or SLURM_JOB_NODELIST is not set"),
    ({"SLURM_JOB_NODELIST": "node[01-03"}, "unbalanced brackets"),
    ({"SLURM_NTASKS": "6"}, "6 task(s) on 3 node(s) (node[01-03]): run one task per node"),
    ({"SLURM_PROCID": "3"}, "SLURM_PROCID 3 is outside 0-2"),
    ({"SLURMD_NODENAME": "node03"}, "rank 1 runs on node03, not on node02"),
    ({"SLURM_JOB_ID": None}, "SLURM_JOB_ID is not set (or not a number) and no --port"),
])
def test_a_job_it_cannot_check_is_bad_usage(monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str],
                                            change: dict[str, str | None], why: str) -> None:
    for key in ("SLURM_STEP_NODELIST", "SLURM_STEP_NUM_TASKS", "SLURM_NODELIST"):
        monkeypatch.delenv(key, raising=False)
    for key, value in {**SRUN, **change}.items():
        if value is None:
            monkeypatch.delenv(key, raising=False)
        else:
            monkeypatch.setenv(key, value)
    assert gang.main([]) == gang.EXIT_USAGE
    assert why in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--timeout", "0.5"], ["--timeout", "nan"],
                                  ["--size-mb", "0"], ["--size-mb", "1.5"],
                                  ["--min-busbw-gbps", "-1"], ["--backend", "mpi"],
                                  ["--port", "70000"], ["--port", "x"], ["--wat"]])
def test_bad_flags_exit_2(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        gang.parse_args(argv)
    assert exited.value.code == gang.EXIT_USAGE


def test_the_flags_defaults() -> None:
    args = gang.parse_args([])
    assert (args.timeout, args.size_mb, args.min_busbw_gbps, args.backend, args.drain) == (
        60.0, 64, None, "auto", False)


# ---- verdicts: pure functions of what the ranks reported --------------------------------------

def test_the_nodes_that_never_joined_are_named() -> None:
    assert gang.join_failures(NODES3, "node[01-03]", {0, 1}, 30.0) == [
        Failure("rendezvous", "node03", "did not join within 30.0s (rank 2)")]
    assert gang.join_failures(NODES3, "node[01-03]", {1, 2}, 30.0) == [
        Failure("rendezvous", "node01", "did not join within 30.0s (rank 0)")]
    assert gang.join_failures(NODES3, "node[01-03]", {0, 1, 2}, 30.0) == []


def test_when_no_other_node_joined_none_is_blamed() -> None:
    """The first node's port closed to the others looks the same from rank 0 as every
    other node broken: it is reported, never drained."""
    alone = gang.join_failures(NODES3, "node[01-03]", {0}, 30.0, "node01:29516")
    assert alone == [Failure("rendezvous", "node[01-03]", "no other node joined within 30.0s: "
                             "can they reach node01:29516 (a firewall?), or did they all fail?",
                             attributed=False)]
    two = gang.join_failures(NODES3[:2], "node[01-02]", {0}, 30.0)
    assert [(f.node, f.attributed) for f in two] == [("node02", False)]


def test_the_backend_every_node_uses() -> None:
    assert gang.backend_plan(NODES3, {0: 0, 1: 0, 2: 0}, "auto") == ("gloo", [])
    assert gang.backend_plan(NODES3, {0: 8, 1: 8, 2: 8}, "auto") == ("nccl", [])
    assert gang.backend_plan(NODES3, {0: 8, 1: 8, 2: 8}, "gloo") == ("gloo", [])
    assert gang.backend_plan(NODES3, {0: 8, 1: 0, 2: 8}, "auto") == ("nccl", [
        Failure("gpu", "node02", "torch sees no GPU while 2 other node(s) do")])
    assert gang.backend_plan(NODES3[:1], {0: 0}, "nccl") == ("nccl", [
        Failure("gpu", "node01", "torch sees no GPU and --backend nccl needs one")])


def test_who_held_the_collective_up() -> None:
    def stalled(joined: set[int], ready: set[int], done: set[int]) -> list[tuple[str, str]]:
        found = gang.stall_failures(NODES3, "node[01-03]", joined, ready=ready, done=done,
                                    waited_s=60.0)
        return [(f.check, f.node) for f in found]

    everyone = {0, 1, 2}
    assert stalled({0, 2}, {0, 2}, set()) == [("rendezvous", "node02")]
    assert stalled(everyone, {0, 1}, set()) == [("collective", "node03")]
    assert stalled(everyone, everyone, {0, 2}) == [("collective", "node02")]
    assert stalled(everyone, everyone, everyone) == []
    fabric = gang.stall_failures(NODES3, "node[01-03]", everyone, ready=everyone, done=set(),
                                 waited_s=60.0)
    assert [(f.node, f.attributed) for f in fabric] == [("node[01-03]", False)]
    assert "every node entered the AllReduce and none finished within 60.0s" in \
        fabric[0].message


def right(world: int) -> dict[int, RankResult]:
    return {rank: RankResult(0, None, 0.01) for rank in range(world)}


def test_a_right_sum_passes_and_a_wrong_one_names_its_node() -> None:
    values = gang.fill_values(3)
    assert values == [1, 2, 3]
    assert gang.result_failures(NODES3, "node[01-03]", right(3), values) == []
    one = {**right(3), 2: RankResult(17, 5.0, 0.01)}
    assert gang.result_failures(NODES3, "node[01-03]", one, values) == [
        Failure("result", "node03", "17 element(s) of its sum wrong (first 5, expected 6; "
                                    "rank 2)")]


@pytest.mark.parametrize(("got", "node", "what"), [
    (4.0, "node02", "its contribution is missing from every node's sum (4, expected 6; rank 1)"),
    (9.0, "node03", "its contribution is counted twice in every node's sum (9, expected 6; "
                    "rank 2)"),
])
def test_the_rank_whose_contribution_every_sum_misses_is_named(got: float, node: str,
                                                                 what: str) -> None:
    every = {rank: RankResult(1024, got, 0.01) for rank in range(3)}
    assert gang.result_failures(NODES3, "node[01-03]", every, [1, 2, 3]) == [
        Failure("result", node, what)]


def test_a_sum_wrong_everywhere_and_in_no_telling_way_names_the_job() -> None:
    every = {rank: RankResult(3, 6.5, 0.01) for rank in range(3)}
    assert gang.result_failures(NODES3, "node[01-03]", every, [1, 2, 3]) == [
        Failure("result", "node[01-03]", "every node's sum is wrong (3 element(s) on rank 0, "
                                         "first 6.5, expected 6)", attributed=False)]
    big = gang.fill_values(gang.DISTINCT_MAX + 1)
    assert set(big) == {1}   # past 4096 ranks no rank's value tells it apart


def test_bus_bandwidth_and_its_gate() -> None:
    algbw, busbw = gang.bandwidth(64 * 2**20, 0.01, 4)
    assert algbw == pytest.approx(6.7108864) and busbw == pytest.approx(algbw * 1.5)
    assert gang.bandwidth(2**20, 0.01, 1)[1] == 0.0
    assert gang.bandwidth_failure("node[01-04]", busbw, None, 4) is None
    assert gang.bandwidth_failure("node[01-04]", busbw, 10.0, 4) is None
    assert gang.bandwidth_failure("node01", 0.0, 10.0, 1) is None   # one node: no link
    assert gang.bandwidth_failure("node[01-04]", busbw, 400.0, 4) == Failure(
        "busbw", "node[01-04]", "10.07 GB/s, below --min-busbw-gbps 400", attributed=False)


def test_a_failure_line_names_the_node_and_the_summary_the_first_few() -> None:
    assert Failure("rendezvous", "node03", "did not join within 30.0s (rank 2)").line() == \
        "gf gang/rendezvous: node03: did not join within 30.0s (rank 2)"
    job = gang.job_from_environ(dict(SRUN, SLURM_JOB_NODELIST="n[1-12]", SLURM_NTASKS="12",
                                     SLURMD_NODENAME="n2"), gang.parse_args([]))
    missing = gang.join_failures(job.nodes, job.nodelist, {0, 1}, 30.0)
    assert gang.fail_line(missing, job, 30.04) == (
        "gf gang: FAIL: rendezvous n3, rendezvous n4, rendezvous n5, rendezvous n6, "
        "rendezvous n7, rendezvous n8, rendezvous n9, rendezvous n10 (+2 more); "
        "12 node(s) (n[1-12]), 30.0s")


# ---- the drain reason: the findings format ---------------------------------------------------

def test_gang_is_a_source_of_findings() -> None:
    assert (findings.SOURCES["gang"], findings.LABELS["gang"]) == (gang.LETTER, gang.LABEL)
    reason = findings.render([Finding("gang", "rendezvous", T0)], "did not join within 30.0s")
    assert reason == f"gf gang/rendezvous: did not join within 30.0s {{gf1 g:rendezvous@{T0}}}"
    assert findings.parse(reason) == [Finding("gang", "rendezvous", T0)]
    assert (gang.PREFIX, gang.MESSAGE_LIMIT, gang.MOST) == (
        findings.PREFIX, findings.MESSAGE_LIMIT, findings.MOST)


PREVIOUS = [
    None,
    findings.render([Finding("conformance", "gpu/health", T0)], "GPU0: 2 uncorrectable ECC"),
    findings.render([Finding("healthcheck", "xid", T0), Finding("drift", "nccl_env", T0)],
                    "Xid 79 on 0000:3b:00"),
    findings.render([Finding("gang", "collective", T0)], "did not finish"),
    findings.render([Finding("gang", "rendezvous", T0), Finding("drift", "nccl_env", T0)],
                    "did not join within 10.0s"),
    findings.render([Finding("drift", "nccl_env", T0), Finding("gang", "rendezvous", T0)],
                    "file /etc/nccl.conf differs"),
    findings.render([Finding("drift", f"role{i}", T0) for i in range(40)], "many"),
    f"gf drift/nccl_env:  {{gf1 d:nccl_env@{T0}}}",
]


@pytest.mark.parametrize("previous", PREVIOUS)
def test_the_program_drains_as_the_controller_would(previous: str | None) -> None:
    message = 'did not join within 30.0s [root@x] Comment="y"'
    ours = gang.drain_reason(previous, "rendezvous", message, T0 + 60)
    merged = findings.reconcile(findings.parse(previous) or [], "gang", {"rendezvous": message},
                                [], now=T0 + 60)
    assert ours == findings.reason_for(merged, "gang", {"rendezvous": message}, previous)


def test_an_operators_reason_is_left_alone_and_unknown_findings_are_kept() -> None:
    assert gang.drain_reason("replacing a fan (OPS-12)", "rendezvous", "x", T0) is None
    assert gang.drain_reason("gpufleet: drift/nccl_env: differs", "rendezvous", "x", T0) is None
    other = f"gf prolog/gpus: 7 GPU(s), expected 8 {{gf1 p:gpus@{T0}}}"
    assert gang.drain_reason(other, "collective", "x", T0 + 1) == (
        f"gf prolog/gpus: 7 GPU(s), expected 8 (+1 more) {{gf1 p:gpus@{T0} "
        f"g:collective@{T0 + 1}}}")


SHOW = ("NodeName={node} Arch=x86_64 CoresPerSocket=4 CPUAlloc=4 CPUTot=4 "
        "State={state} ThreadsPerCore=1 Partitions=lab {reason}")


def scontrol(tmp_path: Path, states: dict[str, tuple[str, str]]) -> Path:
    """A stand-in scontrol: ``show node`` answers from ``states``, ``update`` is recorded."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    cases = "".join(f'  *" {node}") echo \'{SHOW.format(node=node, state=s, reason=r)}\' ;;\n'
                    for node, (s, r) in states.items())
    stand_in(bin_dir, "scontrol",
             f'if [ "$1" = update ]; then printf "%s\\n" "$*" >> {tmp_path}/updates; exit 0; fi\n'
             f'case "$*" in\n{cases}  *) echo "Node $4 not found"; exit 1 ;;\nesac\n')
    return bin_dir


def test_drain_adds_the_finding_and_leaves_an_operators_drain(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kept = findings.render([Finding("conformance", "gpu/health", T0)], "ECC")
    bin_dir = scontrol(tmp_path, {
        "node02": ("ALLOCATED", ""),
        "node03": ("MIXED+DRAIN", f"Reason={kept} [root@2026-01-01T00:00:00]"),
        "node04": ("ALLOCATED+DRAIN", "Reason=replacing a fan [ops@2026-01-01T00:00:00]"),
    })
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    failures = [Failure("collective", "node02", "did not finish"),
                Failure("result", "node02", "second failure of the same node"),
                Failure("rendezvous", "node03", "did not join"),
                Failure("rendezvous", "node04", "did not join"),
                Failure("rendezvous", "node05", "did not join"),
                Failure("busbw", "node[01-05]", "slow", attributed=False)]
    lines = gang.drain(failures, 20.0, T0)
    assert lines == [
        f"gf gang: node02 drained: gf gang/collective: did not finish {{gf1 g:collective@{T0}}}",
        f"gf gang: node03 drained: gf gpu/health: ECC (+1 more) {{gf1 c:gpu/health@{T0} "
        f"g:rendezvous@{T0}}}",
        "gf gang: node04 left alone: drained by someone else: replacing a fan",
        "gf gang: node05 not drained: Node node05 not found"]
    assert (tmp_path / "updates").read_text().splitlines() == [
        f"update nodename=node02 state=drain reason=gf gang/collective: did not finish "
        f"{{gf1 g:collective@{T0}}}",
        f"update nodename=node03 state=drain reason={lines[1].split(' drained: ', 1)[1]}"]


def test_drain_without_scontrol_or_time_says_so(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    failure = [Failure("rendezvous", "node03", "did not join")]
    assert gang.drain(failure, 5.0, T0) == ["gf gang: node03 not drained: scontrol not found"]
    assert gang.drain(failure, 0.0, T0) == [
        "gf gang: node03 not drained: no time left of 0s"]


# ---- real runs: gloo on 127.0.0.1, one forked process per rank --------------------------------

@dataclass
class Ended:
    code: int
    output: str
    seconds: float


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def ranks(tmp_path: Path, world: int, argv: Sequence[str], started: Sequence[int], *,
          extra_env: dict[str, str] | None = None,
          target: Callable[[Sequence[str]], object] = gang.main,
          odd: dict[int, Callable[[Sequence[str]], object]] | None = None,
          limit_s: float = 60.0) -> dict[int, Ended]:
    """Run ranks ``started`` of a ``world``-node job, each a child forked from this process
    (torch is imported here once) with srun's variables (``odd``: another program for some
    ranks), and wait for them; a child still there ``limit_s`` after the start, or one
    second after rank 0 ended, is killed."""
    import torch.distributed  # noqa: F401 - imported once here, before the children fork

    port = free_port()
    nodelist = f"node[01-{world:02d}]"
    children: dict[int, tuple[int, Path]] = {}
    begin = time.monotonic()
    for rank in started:
        out = tmp_path / f"rank{rank}.out"
        pid = os.fork()
        if pid == 0:
            code = 70
            try:
                fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
                os.dup2(fd, 1)
                os.dup2(fd, 2)
                sys.stdout = sys.stderr = open(1, "w", closefd=False)  # noqa: SIM115
                os.environ.update({"SLURM_PROCID": str(rank), "SLURM_NTASKS": str(world),
                                   "SLURM_JOB_NODELIST": nodelist, "SLURM_JOB_ID": "4711",
                                   "SLURMD_NODENAME": f"node{rank + 1:02d}", **(extra_env or {})})
                run = (odd or {}).get(rank, target)
                run([*argv, "--master-addr", "127.0.0.1", "--port", str(port)])
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 70
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                os._exit(code)
        children[rank] = (pid, out)
    ended: dict[int, Ended] = {}
    while len(ended) < len(children):
        for rank, (pid, out) in children.items():
            if rank in ended:
                continue
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                ended[rank] = Ended(os.waitstatus_to_exitcode(status), out.read_text(),
                                    time.monotonic() - begin)
            elif time.monotonic() - begin > limit_s or (
                    0 in ended and time.monotonic() - begin > ended[0].seconds + 1.0):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        time.sleep(0.02)
    return ended


def gang_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("gf gang")]


@pytest.mark.parametrize("world", [2, 3])
def test_a_healthy_gang_passes(tmp_path: Path, world: int) -> None:
    ended = ranks(tmp_path, world, ["--timeout", "60", "--size-mb", "1",
                                    "--min-busbw-gbps", "0.0001"], range(world))
    assert [e.code for e in ended.values()] == [0] * world, ended
    summary = gang_lines(ended[0].output)
    assert len(summary) == 1
    assert summary[0].startswith(f"gf gang: PASS: {world} node(s) (node[01-{world:02d}]): "
                                 "AllReduce of 1 MiB summed right, busbw ")
    assert "gloo, 5 timed" in summary[0]
    assert all(gang_lines(ended[rank].output) == [] for rank in range(1, world))


def test_a_gang_below_its_bandwidth_fails_naming_the_job(tmp_path: Path) -> None:
    ended = ranks(tmp_path, 2, ["--timeout", "60", "--size-mb", "1",
                                "--min-busbw-gbps", "100000"], range(2))
    assert [e.code for e in ended.values()] == [1, 1]
    lines = gang_lines(ended[0].output)
    assert lines[0].startswith("gf gang/busbw: node[01-02]: ")
    assert lines[0].endswith("GB/s, below --min-busbw-gbps 100000")
    assert lines[1].startswith("gf gang: FAIL: busbw node[01-02]; 2 node(s)")
    assert gang_lines(ended[1].output) == [lines[0]]


def test_a_node_that_never_joins_is_named_and_drained(tmp_path: Path) -> None:
    """Rank 2 of three never starts: rank 0 names node03 when half of --timeout is over,
    rank 1 prints the same line, and with --drain rank 0 drains node03 alone."""
    bin_dir = scontrol(tmp_path, {"node03": ("ALLOCATED", "")})
    ended = ranks(tmp_path, 3, ["--timeout", "5", "--size-mb", "1", "--drain"], [0, 1],
                  extra_env={"PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert (ended[0].code, ended[1].code) == (1, 1)
    assert ended[0].seconds < 5.0, ended[0]
    lines = gang_lines(ended[0].output)
    assert re.fullmatch(r"gf gang/rendezvous: node03: did not join within 2\.\d+s \(rank 2\)",
                        lines[0]), lines
    assert lines[1].startswith("gf gang: FAIL: rendezvous node03; 3 node(s) (node[01-03]), ")
    assert re.fullmatch(r"gf gang: node03 drained: gf gang/rendezvous: did not join within "
                        r"2\.\d+s \(rank 2\) \{gf1 g:rendezvous@\d+\}", lines[2]), lines
    assert gang_lines(ended[1].output) == [lines[0]]
    assert (tmp_path / "updates").read_text().count("nodename=node03") == 1


def joins_then_hangs(argv: Sequence[str]) -> None:
    """A rank that joins the rendezvous and then never starts the AllReduce."""
    args = gang.parse_args(argv)
    job = gang.job_from_environ(os.environ, args)
    store = gang.connect(job, time.monotonic() + 30, master=False)
    gang.join(store, job, 0)
    time.sleep(60)


def test_a_node_that_joins_but_hangs_is_named_by_the_watchdog(tmp_path: Path) -> None:
    """Rank 0 waits in the process group for node02, which joined and went quiet: at
    --timeout the watchdog reads the store, names node02 and ends the process."""
    ended = ranks(tmp_path, 2, ["--timeout", "5", "--size-mb", "1"], [0, 1],
                  odd={1: joins_then_hangs}, limit_s=20.0)
    assert ended[0].code == 1
    assert 5.0 <= ended[0].seconds < 5.0 + gang.BYE_S + 2.0, ended[0]
    lines = gang_lines(ended[0].output)
    assert re.fullmatch(r"gf gang/collective: node02: joined but did not start the AllReduce "
                        r"within 5\.\d+s \(rank 1\)", lines[0]), lines
    assert lines[1].startswith("gf gang: FAIL: collective node02; 2 node(s) (node[01-02]), ")
    assert ended[1].code == -signal.SIGKILL   # the stand-in sleeps until it is killed
    assert gang_lines(ended[1].output) == []
