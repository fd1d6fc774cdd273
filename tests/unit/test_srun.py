"""The srun launcher's pieces against stand-ins: which nodes an allocation takes (from real
``scontrol show node`` output) and salloc's words, a step's start mark, srun's own lines
taken out of stderr, and a step that never started. The real thing runs in
tests/lab/test_slurm.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gpufleet.connect.connection import Unreachable
from gpufleet.inventory.model import Host
from gpufleet.slurm.client import Slurm, SlurmError, parse_show_node
from gpufleet.slurm.launcher import Allocation, SrunConnection, unusable
from tests.conftest import FIXTURES, stand_in

SLURM = FIXTURES / "slurm"


@pytest.fixture
def bin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """scontrol answering from $FAKE_SHOW, salloc granting job 77, srun running the command
    here; each logs its argv."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "argv.log"
    record = f"python3 -c 'import json, sys; print(json.dumps(sys.argv[1:]))' \"$@\" >> {log}\n"
    stand_in(bin_dir, "scontrol", record + 'cat "$FAKE_SHOW"\n')
    stand_in(bin_dir, "salloc", record + 'echo "salloc: Granted job allocation 77" >&2\n')
    stand_in(bin_dir, "scancel", record)
    stand_in(bin_dir, "srun", record + 'while [ "${1#--}" != "$1" ]; do shift; done\n'
              'exec "$@"\n')
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SHOW", str(SLURM / "scontrol_show_node.txt"))
    return bin_dir


def _calls(bin_dir: Path, name: str) -> list[list[str]]:
    lines = (bin_dir.parent / "argv.log").read_text().splitlines()
    return [c for c in map(json.loads, lines) if c and (name != "salloc" or "--no-shell" in c)]


def _hosts(*names: str) -> list[Host]:
    return [Host(n, {"ansible_host": "127.0.0.1"}, frozenset({"all"})) for n in names]


def test_drained_down_and_busy_nodes_are_left_out_with_the_reason() -> None:
    nodes = {n.name: n for n in parse_show_node((SLURM / "scontrol_show_node.txt").read_text())}
    assert unusable(nodes["node01"]) == (
        f"IDLE+DRAIN in Slurm: {nodes['node01'].reason}")
    assert unusable(nodes["node04"]) == "busy in Slurm (MIXED): another job runs on it"
    assert unusable(nodes["node05"]).startswith("DOWN in Slurm: gpufleet: ")
    idle = parse_show_node((SLURM / "scontrol_show_node_allocatable.txt").read_text())
    assert [unusable(n) for n in idle] == [None, None, "IDLE+DRAIN in Slurm: bad fan (OPS-12)"]


def test_the_allocation_takes_the_usable_nodes_whole(bin_dir: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_SHOW", str(SLURM / "scontrol_show_node_allocatable.txt"))
    hosts = _hosts("node01", "node02", "node03", "gpu99")
    allocation = Allocation.open(hosts, Slurm(), partition="lab", time_limit_s=3600)
    assert allocation.job_id == "77"
    assert list(allocation.nodes) == ["node01", "node02"]
    assert allocation.left_out == {
        "node03": "not allocated: IDLE+DRAIN in Slurm: bad fan (OPS-12)",
        "gpu99": "not allocated: no Slurm node named 'gpu99'"}
    assert _calls(bin_dir, "salloc")[-1] == [
        "--no-shell", "--exclusive", "--immediate=60", "--job-name=gpufleet-conformance",
        "--nodes=2", "--nodelist=node01,node02", "--time=61", "--partition=lab"]
    assert allocation.step_argv("node02") == [
        "srun", "--jobid=77", "--nodelist=node02", "--nodes=1", "--ntasks=1", "--overlap",
        "--quiet", "--kill-on-bad-exit=0", "--export=NONE", "--gres=gpu:2"]
    with pytest.raises(Unreachable, match="node03: not allocated: IDLE\\+DRAIN in Slurm"):
        allocation.connect(hosts[2]).run("true")
    allocation.release()
    assert _calls(bin_dir, "scancel")[-1] == ["77"]
    other = Allocation.open(hosts[:1], Slurm(), partition="gpu", time_limit_s=60)
    assert other.job_id is None
    assert other.left_out == {"node01": "not allocated: node01 is not in partition gpu"}


def test_salloc_refusing_is_a_clear_error(bin_dir: Path, monkeypatch: pytest.MonkeyPatch
                                          ) -> None:
    monkeypatch.setenv("FAKE_SHOW", str(SLURM / "scontrol_show_node_allocatable.txt"))
    stand_in(bin_dir, "salloc", "echo 'salloc: error: Unable to allocate resources: "
                                 "Requested node configuration is not available' >&2\nexit 1\n")
    with pytest.raises(SlurmError, match=r"^salloc could not allocate the nodes: salloc: error: "
                                         r"Unable to allocate resources: Requested node"):
        Allocation.open(_hosts("node01"), Slurm(), partition=None, time_limit_s=60)


def _connection(bin_dir: Path, monkeypatch: pytest.MonkeyPatch) -> SrunConnection:
    monkeypatch.setenv("FAKE_SHOW", str(SLURM / "scontrol_show_node_allocatable.txt"))
    allocation = Allocation.open(_hosts("node01"), Slurm(), partition=None, time_limit_s=60)
    return allocation.connect(_hosts("node01")[0])


def test_a_step_gives_the_commands_output_and_status_without_srun_lines(
        bin_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    conn = _connection(bin_dir, monkeypatch)
    result = conn.run("echo out; printf 'err\\nsrun: error: node01: task 0: Exited with exit "
                      "code 3\\n' >&2; exit 3")
    assert (result.rc, result.stdout, result.stderr) == (3, "out\n", "err\n")
    assert conn.run("cat | wc -c", stdin=b"x" * 200_000).stdout.strip() == "200000"
    conn.put(str(bin_dir.parent / "put" / "file"), b"hello\n", backup=False)
    assert (bin_dir.parent / "put" / "file").read_text() == "hello\n"
    assert _calls(bin_dir, "srun")[-1][:3] == ["--jobid=77", "--nodelist=node01", "--nodes=1"]


def test_a_partial_line_that_cannot_be_srun_is_passed_on_at_once(
        bin_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stream = _connection(bin_dir, monkeypatch)._stream("sleep 5")
    try:
        assert stream._filter(b"[sudo] password: ", ended=False) == b"[sudo] password: "
        assert stream._filter(b"sru", ended=False) == b""
        assert stream._filter(b"n: error: node01: task 0: Killed\nnext", ended=False) == b"next"
    finally:
        stream.stop()


def test_a_step_that_never_started_makes_the_node_unreachable(
        bin_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    conn = _connection(bin_dir, monkeypatch)
    stand_in(bin_dir, "srun", "echo 'srun: error: Unable to create step for job 77: Job/step "
                               "already completing or completed' >&2\nexit 1\n")
    with pytest.raises(Unreachable, match=r"^node01: no job step started: srun: error: Unable "
                                          r"to create step for job 77"):
        conn.run("true")
