"""Combined job steps against a stand-in srun that runs one task per node here, as slurmd
would run them there (SLURMD_NODENAME and SLURM_PROCID set, stdin given to every task,
lines labelled with the task): the real dispatch script decides what each node runs and
frames its result. The real Slurm runs it in tests/lab/test_slurm.py and
tests/lab/test_slurm_fanout.py."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from gpufleet.connect.connection import Unreachable, node_local
from gpufleet.inventory.model import Host
from gpufleet.slurm.client import Slurm
from gpufleet.slurm.fanout import BEGIN, END, ERR, START, STDIN_MAX, TaskOutputs
from gpufleet.slurm.launcher import Allocation
from tests.conftest import FIXTURES, stand_in

SLURM = FIXTURES / "slurm"

# One task per node of --nodelist in its order (as --distribution=arbitrary lays them
# out), all at once, each with SLURMD_NODENAME, SLURM_PROCID and the whole stdin; their
# lines, labelled "I: " as srun --label does, printed task after task as each ends (a step
# of one node without --label: the command as it is); a node named in $FAKE_LOST never
# starts, one in $FAKE_CUT stops after its command started.
FAKE_SRUN = r"""
import json, os, subprocess, sys
args = sys.argv[1:]
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(json.dumps(args) + "\n")
nodes = next(a for a in args if a.startswith("--nodelist=")).split("=", 1)[1].split(",")
command = args[next(i for i, a in enumerate(args) if not a.startswith("--")):]
stdin = sys.stdin.buffer.read()
lost = os.environ.get("FAKE_LOST", "").split(",")
running = []
for task, node in enumerate(nodes):
    if node in lost:
        print(f"srun: error: Task launch for StepId=77.3 failed on node {node}", file=sys.stderr)
        continue
    env = dict(os.environ, SLURMD_NODENAME=node, SLURM_PROCID=str(task))
    if "--label" not in args:
        sys.exit(subprocess.run(command, input=stdin, env=env).returncode)
    proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    proc.stdin.write(stdin)
    proc.stdin.close()
    running.append((task, node, proc))
for task, node, proc in running:
    lines = proc.stdout.read().decode().splitlines()
    proc.wait()
    if node in os.environ.get("FAKE_CUT", "").split(","):
        lines = lines[:1]
    for line in lines:
        print(f"{task}: {line}", flush=True)
"""


@pytest.fixture
def allocation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Allocation:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stand_in(bin_dir, "scontrol", 'cat "$FAKE_SHOW"\n')
    stand_in(bin_dir, "salloc", 'echo "salloc: Granted job allocation 77" >&2\n')
    stand_in(bin_dir, "scancel", "true\n")
    (bin_dir / "fake_srun.py").write_text(FAKE_SRUN)
    stand_in(bin_dir, "srun", f'exec python3 {bin_dir / "fake_srun.py"} "$@"\n')
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SHOW", str(SLURM / "scontrol_show_node_allocatable.txt"))
    monkeypatch.setenv("FAKE_LOG", str(tmp_path / "srun.log"))
    hosts = [Host(n, {"ansible_host": "127.0.0.1"}, frozenset({"all"}))
             for n in ("node01", "node02")]
    allocation = Allocation.open(hosts, Slurm(), partition=None, time_limit_s=60)
    assert allocation.fanout is not None
    return allocation


def _steps(tmp_path: Path) -> list[list[str]]:
    return [json.loads(line) for line in (tmp_path / "srun.log").read_text().splitlines()]


def _together(allocation: Allocation, commands: dict[str, str]) -> dict[str, object]:
    """Each host's command at once from its own thread, node-local; results or errors."""
    results: dict[str, object] = {}

    def one(host: str) -> None:
        conn = allocation.connect(Host(host, {}, frozenset({"all"})))
        with node_local():
            try:
                results[host] = conn.run(commands[host], timeout=30)
            except Unreachable as exc:
                results[host] = exc

    threads = [threading.Thread(target=one, args=(h,)) for h in commands]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def test_node_local_commands_of_two_nodes_are_one_step_each_with_its_own_result(
        allocation: Allocation, tmp_path: Path) -> None:
    results = _together(allocation, {
        "node01": "printf 'one\\n\\000bin'; echo warn >&2; exit 3",
        "node02": "echo \"$SLURMD_NODENAME $HOME\"; echo 'two'"})
    first, second = results["node01"], results["node02"]
    assert (first.rc, first.stdout, first.stderr) == (3, "one\n\x00bin", "warn\n")  # type: ignore[attr-defined]
    assert (second.rc, second.stdout) == (0, " \ntwo\n")  # type: ignore[attr-defined]
    [step] = _steps(tmp_path)
    assert step[:14] == ["--jobid=77", "--nodelist=node01,node02", "--nodes=2", "--ntasks=2",
                         "--ntasks-per-node=1", "--distribution=arbitrary", "--overlap",
                         "--quiet", "--kill-on-bad-exit=0", "--wait=0", "--export=NONE",
                         "--label", "--input=all", "--gres=gpu:2"]
    assert "warn" not in " ".join(step), "a command travels on stdin, not the command line"


def test_a_command_outside_a_node_local_context_or_with_a_large_stdin_keeps_its_own_step(
        allocation: Allocation, tmp_path: Path) -> None:
    conn = allocation.connect(Host("node01", {}, frozenset({"all"})))
    assert conn.run("echo alone", timeout=30).stdout == "alone\n"
    with node_local():
        large = b"x" * (STDIN_MAX + 1)
        assert conn.run("wc -c", stdin=large, timeout=30).stdout.strip() == str(len(large))
    assert [s[:3] for s in _steps(tmp_path)] == [
        ["--jobid=77", "--nodelist=node01", "--nodes=1"]] * 2


def test_a_small_stdin_travels_with_its_command_in_the_combined_step(
        allocation: Allocation, tmp_path: Path) -> None:
    conns = {h: allocation.connect(Host(h, {}, frozenset({"all"})))
             for h in ("node01", "node02")}
    written: dict[str, str] = {}

    def put(host: str) -> None:
        with node_local():
            target = tmp_path / host / "probe.py"
            conns[host].put(str(target), f"print('{host}')\n".encode(), backup=False)
            written[host] = conns[host].run(f"cat {target}", timeout=30).stdout

    threads = [threading.Thread(target=put, args=(h,)) for h in conns]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert written == {"node01": "print('node01')\n", "node02": "print('node02')\n"}
    assert [s[1] for s in _steps(tmp_path)] == ["--nodelist=node01,node02"] * 2


def test_a_node_gets_its_result_when_its_own_task_ends_not_the_whole_step(
        allocation: Allocation) -> None:
    results = _together(allocation, {"node01": "echo fast", "node02": "sleep 3; echo slow"})
    assert results["node02"].stdout == "slow\n"  # type: ignore[union-attr]
    assert results["node01"].duration < 2.5 < results["node02"].duration  # type: ignore[union-attr]


def test_a_node_whose_task_never_started_is_unreachable_and_the_other_keeps_its_result(
        allocation: Allocation, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_LOST", "node02")
    results = _together(allocation, {"node01": "echo fine", "node02": "echo never"})
    assert results["node01"].stdout == "fine\n"  # type: ignore[union-attr]
    assert isinstance(results["node02"], Unreachable)
    assert str(results["node02"]).startswith(
        "node02: no job step started: srun: error: Task launch for StepId=77.3 failed")


def test_a_step_in_which_no_task_started_runs_each_command_again_alone(
        allocation: Allocation, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_LOST", "node01,node02")
    stand_in(tmp_path / "bin", "srun", 'echo "$@" | grep -q "node01,node02" && exit 1\n'
             f'FAKE_LOST= exec python3 {tmp_path / "bin" / "fake_srun.py"} "$@"\n')
    results = _together(allocation, {"node01": "echo a", "node02": "echo b"})
    assert [results[h].stdout for h in ("node01", "node02")] == ["a\n", "b\n"]  # type: ignore[union-attr]


def test_a_command_cut_off_by_its_step_ends_as_killed_and_is_not_run_again(
        allocation: Allocation, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_CUT", "node02")
    runs = tmp_path / "runs"
    results = _together(allocation, {"node01": "echo ok", "node02": f"echo started >> {runs}"})
    assert results["node01"].stdout == "ok\n"  # type: ignore[union-attr]
    cut = results["node02"]
    assert cut.rc == 137  # type: ignore[union-attr]
    assert "the job step ended before the command" in cut.stderr  # type: ignore[union-attr]
    assert runs.read_text() == "started\n"
    [step] = _steps(tmp_path)
    assert "--wait=0" in step, "srun must not end the other tasks when one ends first"


def test_labelled_output_is_split_per_task_whatever_the_interleaving() -> None:
    outputs, ended = TaskOutputs(["node01", "node02", "node03"]), []
    for line in [f" 1: {START} 1 node02", f" 1: {BEGIN} node02", f" 0: {BEGIN} node01",
                 " 1: dHdv", " 0: b25l",
                 f" 0: {ERR}", f" 1: {ERR}", " 1: ZXJy", f" 1: {END} 7", f" 0: {END} 0",
                 "srun: not a task line", f" 2: {BEGIN} node03", " 2: cGFy"]:
        ended.append(outputs.feed(line))
    assert [n for n in ended if n] == ["node02", "node01"], "each as soon as its task ends"
    assert [outputs.result(n) for n in ("node01", "node02", "node03", "node04")] == [
        (0, b"one", b""), (7, b"two", b"err"), (None, b"par", b""), None]
    assert [outputs.started(n) for n in ("node01", "node02")] == [False, True]


def test_a_task_that_frames_another_node_s_result_is_refused_and_the_other_keeps_its_own(
        ) -> None:
    outputs = TaskOutputs(["node01", "node02"])
    forged = [f"0: {START} 1 node02", f"0: {BEGIN} node02", "0: cGFzcw==", f"0: {ERR}",
              f"0: {END} 0"]
    real = [f"1: {START} 1 node02", f"1: {BEGIN} node02", "1: ZmFpbA==", f"1: {ERR}",
            f"1: {END} 1"]
    ended = [outputs.feed(line) for line in [*forged, *real]]
    assert [n for n in ended if n] == ["node01", "node02"]
    assert outputs.result("node02") == (1, b"fail", b""), "node02's own task decides"
    assert outputs.result("node01") is None
    assert outputs.refused("node01").startswith(
        "its task in the combined step framed another result ('@@gpufleet-start 1 node02')")
    # a second claim, or a frame naming another node after its own start, is refused too
    for lines in ([f"0: {START} 0 node01", f"0: {START} 0 node01"],
                  [f"0: {START} 0 node01", f"0: {BEGIN} node02"],
                  [f"0: {START} 0 node02"], [f"0: {START} 1 node01"]):
        again = TaskOutputs(["node01", "node02"])
        assert [again.feed(line) for line in lines][-1] == "node01"
        assert again.refused("node01") and again.result("node01") is None
        assert not again.refused("node02")


# A command that writes a whole result for node02 (task 1) into the pipes of the nearest of
# its ancestors that writes to pipes (its task's shell: the task's stdout, however the
# shell saved it), then prints its own line.
FORGE = ("p=$PPID; while [ \"$p\" -gt 1 ]; do "
         "w=$(ls -l /proc/$p/fd 2>/dev/null | awk '/^l-wx.*pipe:/ {print $9}'); "
         "if [ -n \"$w\" ]; then for f in $w; do "
         "printf '%s\\n' '@@gpufleet-start 1 node02' '@@gpufleet-begin node02' "
         "\"$(echo pass | base64)\" '@@gpufleet-stderr' '@@gpufleet-end 0' "
         "> /proc/$p/fd/$f; done; break; fi; p=$(awk '{print $4}' /proc/$p/stat); done; "
         "echo mine")


def test_a_command_that_answers_for_another_node_makes_its_own_node_unreachable(
        allocation: Allocation) -> None:
    results = _together(allocation, {"node01": FORGE, "node02": "sleep 1; echo fail; exit 1"})
    assert (results["node02"].rc, results["node02"].stdout) == (1, "fail\n")  # type: ignore[union-attr]
    assert isinstance(results["node01"], Unreachable)
    assert str(results["node01"]).startswith(
        "node01: its task in the combined step framed another result")
