"""gpufleet tune's pure parts: the variables checked before any host, the candidates, the
winner only beyond the noise, the table, and the nccl_env diff, which git apply takes: it
changes the candidate's key in the group file's own nccl_env as written, and says where the
nodes' nccl_env comes from when it is not there."""

from __future__ import annotations

import io
import subprocess
from pathlib import Path

import pytest

from gpufleet import app
from gpufleet import tune as tuning
from gpufleet.conformance import session
from gpufleet.conformance.session import Node
from gpufleet.connect.connection import ConnectOptions
from gpufleet.facts.gather import Facts
from gpufleet.inventory.load import load_inventory
from gpufleet.provision.role import VarError
from gpufleet.tune import (
    Candidate,
    Measured,
    candidates,
    settings,
    table,
    winner,
    with_change,
)


def _node(tmp_path: Path, extra: str = "", gpus: bool = True) -> Node:
    path = tmp_path / "hosts.yml"
    path.write_text("all:\n  hosts:\n    n1:\n      nccl_env: {NCCL_ALGO: Ring, NCCL_DEBUG: WARN}\n"
                    + extra)
    host = load_inventory(path).select("all")[0]
    return Node(host, ConnectOptions(), Facts("n1", {"gpus": [{"name": "NVIDIA H200"}]}
                                               if gpus else {}))


def test_the_defaults_try_nccl_s_settings_one_at_a_time(tmp_path: Path) -> None:
    node = _node(tmp_path)
    one = [c.name for c in candidates(node, settings(node.host), 1)]
    assert one == ["NCCL_ALGO=Tree", "NCCL_PROTO=Simple", "NCCL_PROTO=LL128",
                   "NCCL_BUFFSIZE=8388608"]  # Ring is the current NCCL_ALGO
    many = [c.name for c in candidates(node, settings(node.host), 4)]
    assert many[-2:] == ["NCCL_NCHANNELS_PER_NET_PEER=2", "NCCL_IB_QPS_PER_CONNECTION=4"]
    gloo = _node(tmp_path, gpus=False)
    assert [c.name for c in candidates(gloo, settings(gloo.host), 2)] == ["OMP_NUM_THREADS=2"]


def test_declared_candidates_and_bad_ones(tmp_path: Path) -> None:
    node = _node(tmp_path, "      tune_candidates: {NCCL_P2P_LEVEL: [NVL, SYS], "
                           "NCCL_BUFFSIZE: 4194304}\n      tune_repeats: 3\n")
    wanted = settings(node.host)
    assert wanted.repeats == 3
    assert [c.change for c in candidates(node, wanted, 1)] == [
        {"NCCL_P2P_LEVEL": "NVL"}, {"NCCL_P2P_LEVEL": "SYS"}, {"NCCL_BUFFSIZE": "4194304"}]
    for bad, words in (("tune_candidates: {nccl algo: [Ring]}", "environment variable names"),
                       ("tune_candidates: [NCCL_ALGO]", "a mapping of variables"),
                       ("tune_candidates: {NCCL_ALGO: []}", "a list of values for NCCL_ALGO"),
                       ("tune_repeats: 1", "an integer from 2 to 100")):
        broken = _node(tmp_path, f"      {bad}\n")
        with pytest.raises(VarError, match=words) as caught:
            settings(broken.host)
        assert "hosts.yml:" in str(caught.value)


def _measured(name: str, ddp: list[float], errors: list[str] | None = None) -> Measured:
    change = dict([name.split("=")]) if "=" in name else {}
    return Measured(Candidate(change), ddp, [1.0] * len(ddp), errors or [])


def test_a_winner_only_beyond_the_noise() -> None:
    current = _measured("current", [1000.0, 1020.0, 980.0])          # noise 2%
    small = _measured("NCCL_ALGO=Tree", [1015.0, 1030.0, 1000.0])   # +1.5%: within the noise
    large = _measured("NCCL_PROTO=LL128", [1150.0, 1160.0, 1140.0])  # +15%
    noisy = _measured("NCCL_BUFFSIZE=8388608", [1300.0, 900.0, 1250.0])  # +25%, noise 16%
    broken = _measured("NCCL_P2P_LEVEL=SYS", [2000.0, 2000.0], ["round 3: DDP: timed out"])
    assert winner(current, [small]) is None
    assert winner(current, [small, large, noisy, broken]) is noisy
    assert winner(current, [small, large, broken]) is large
    text = table([current, small, large, broken], large)
    assert text.splitlines()[0].split() == ["candidate", "DDP", "samples/s", "vs", "current",
                                            "AllReduce", "busbw", "GB/s"]
    assert "NCCL_PROTO=LL128    1,150 ±0.9%    +15.0%      1.000 ±0.0%  winner" in text
    assert text.count("winner") == 1
    assert "failed: round 3: DDP: timed out" in text


GROUP = """# training nodes
gpufleet_scheduler: slurm
nccl_env:
  NCCL_SOCKET_IFNAME: "{{ fabric_if }}"   # each node's own fabric
  NCCL_ALGO: Ring   # set by hand
  NCCL_DEBUG: WARN

cuda_version: "12.4.1"
"""
HOSTS = ("all:\n  vars:\n    fabric_if: eth0\n  children:\n    gpu:\n      hosts:\n"
         "        n1:\n        n2:\n          fabric_if: eth9\n        n3:\n")


class FakeSession:
    """The nodes, reached; nothing is run on them."""

    def __init__(self, nodes: list[Node]) -> None:
        self.nodes = {n.name: n for n in nodes}

    def ready(self) -> list[Node]:
        return list(self.nodes.values())

    def close(self) -> None:
        pass


def tune_winner(monkeypatch: pytest.MonkeyPatch, inventory: Path, change: tuple[str, str],
                tmp_path: Path) -> tuple[int, str, str]:
    """``gpufleet tune`` on the inventory's hosts where ``change`` wins by 15%: its exit
    code, its report, and the diff it wrote."""
    nodes = [Node(h, ConnectOptions(), Facts(h.name, {"gpus": [{"name": "NVIDIA H200"}]}))
             for h in load_inventory(inventory).select("all")]
    monkeypatch.setattr(session.ConformanceSession, "start",
                        lambda *args, **kwargs: FakeSession(nodes))
    monkeypatch.setattr(tuning, "tune", lambda *args, **kwargs: [
        _measured("current", [100.0, 100.5, 99.5]),
        _measured("=".join(change), [115.0, 115.2, 114.8])])
    out, patch = io.StringIO(), tmp_path / "tune.diff"
    code = app.tune_cmd(str(inventory), diff_path=str(patch), out=out)
    return code, out.getvalue(), patch.read_text() if patch.exists() else ""


def git_apply(repo: Path, patch: str) -> None:
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "apply", "-"], input=patch.encode(), check=True,
                   capture_output=True)


def test_the_winning_diff_changes_only_the_candidate_s_key_as_the_group_file_writes_it(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    inventory = tmp_path / "inv"
    (inventory / "group_vars").mkdir(parents=True)
    (inventory / "hosts.yml").write_text(HOSTS)
    (inventory / "group_vars" / "gpu.yml").write_text(GROUP)
    code, report, patch = tune_winner(monkeypatch, inventory, ("NCCL_PROTO", "LL128"),
                                      tmp_path)
    assert code == 0, report
    assert "note:" not in report
    git_apply(inventory, patch)
    # the template stays as written (n1 would have made it eth0 for n2 too)
    assert (inventory / "group_vars" / "gpu.yml").read_text() == GROUP.replace(
        "  NCCL_DEBUG: WARN\n", "  NCCL_DEBUG: WARN\n  NCCL_PROTO: LL128\n")
    code, report, patch = tune_winner(monkeypatch, inventory, ("NCCL_ALGO", "Tree"), tmp_path)
    assert [line for line in patch.splitlines() if line[:1] in "+-"
            and line[:3] not in ("+++", "---")] == ["-  NCCL_ALGO: Ring   # set by hand",
                                                    "+  NCCL_ALGO: Tree   # set by hand"]


def test_a_host_s_own_nccl_env_is_not_the_group_s_and_is_named(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    inventory = tmp_path / "inv"
    (inventory / "group_vars").mkdir(parents=True)
    (inventory / "host_vars").mkdir()
    (inventory / "hosts.yml").write_text(HOSTS)
    (inventory / "group_vars" / "gpu.yml").write_text(GROUP)
    (inventory / "host_vars" / "n1.yml").write_text("nccl_env:\n  NCCL_SOCKET_IFNAME: ib0\n")
    code, report, patch = tune_winner(monkeypatch, inventory, ("NCCL_PROTO", "LL128"),
                                      tmp_path)
    assert code == 0, report
    assert ("note: n1 takes its nccl_env from host_vars/n1.yml:1, which this diff does not "
            "change: it keeps NCCL_PROTO as it is") in report
    git_apply(inventory, patch)
    assert (inventory / "group_vars" / "gpu.yml").read_text() == GROUP.replace(
        "  NCCL_DEBUG: WARN\n", "  NCCL_DEBUG: WARN\n  NCCL_PROTO: LL128\n")
    assert (inventory / "host_vars" / "n1.yml").read_text() == \
        "nccl_env:\n  NCCL_SOCKET_IFNAME: ib0\n"


def test_an_inherited_nccl_env_is_said_and_copied_as_written(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    inventory = tmp_path / "inv"
    (inventory / "group_vars").mkdir(parents=True)
    (inventory / "hosts.yml").write_text(HOSTS)
    (inventory / "group_vars" / "all.yml").write_text(
        'nccl_env:\n  NCCL_SOCKET_IFNAME: "{{ fabric_if }}"\n')
    (inventory / "group_vars" / "gpu.yml").write_text("cuda_version: 12.4.1\n")
    (inventory / "host_vars").mkdir()
    (inventory / "host_vars" / "n1.yml").write_text("nccl_env:\n  NCCL_SOCKET_IFNAME: ib0\n")
    code, report, patch = tune_winner(monkeypatch, inventory, ("NCCL_PROTO", "LL128"),
                                      tmp_path)
    assert code == 0, report
    assert ("note: group gpu has no nccl_env of its own: it inherits group all's; the diff "
            "gives group gpu its own in group_vars/gpu.yml, a copy of that one as written with "
            "the change") in report
    # the first node's own value is not the group's: it is not copied, and the node is named
    assert "ib0" not in patch
    assert "note: n1 takes its nccl_env from host_vars/n1.yml:1" in report
    git_apply(inventory, patch)
    assert (inventory / "group_vars" / "gpu.yml").read_text() == (
        "cuda_version: 12.4.1\n\nnccl_env:\n  NCCL_SOCKET_IFNAME: '{{ fabric_if }}'\n"
        "  NCCL_PROTO: LL128\n")
    assert load_inventory(inventory).hosts["n2"].vars["nccl_env"] == {
        "NCCL_SOCKET_IFNAME": "eth9", "NCCL_PROTO": "LL128"}


def test_no_nccl_env_anywhere_is_said(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    inventory = tmp_path / "inv"
    inventory.mkdir()
    (inventory / "hosts.yml").write_text(HOSTS)
    _, report, patch = tune_winner(monkeypatch, inventory, ("NCCL_PROTO", "LL128"), tmp_path)
    assert ("note: no group or host defines nccl_env; the diff gives group gpu its own in "
            "group_vars/gpu.yml with the change only") in report
    git_apply(inventory, patch)
    assert (inventory / "group_vars" / "gpu.yml").read_text() == "nccl_env:\n  NCCL_PROTO: LL128\n"


def test_a_group_file_s_nccl_env_is_edited_where_it_is_written() -> None:
    assert with_change("nccl_env: {NCCL_ALGO: Ring, X: '{{ y }}'}  # flow\nx: 1\n",
                       "NCCL_ALGO", "Tree") == \
        "nccl_env: {NCCL_ALGO: Tree, X: '{{ y }}'}  # flow\nx: 1\n"
    assert with_change("nccl_env:\n  'NCCL_BUFFSIZE': 4194304\n", "NCCL_BUFFSIZE",
                       "8388608") == "nccl_env:\n  'NCCL_BUFFSIZE': '8388608'\n"
    assert with_change("nccl_env:\n    A: 1\nb: 2", "C", "3") == \
        "nccl_env:\n    A: 1\n    C: '3'\nb: 2"
    assert with_change('nccl_env:\n  A: "x # y"  # note\n', "A", "{{ z }}") == \
        "nccl_env:\n  A: '{{ z }}'  # note\n"
    # a value over several lines, a template for the whole mapping, or none: not edited
    assert with_change("nccl_env:\n  A: >\n    x\n", "A", "y") is None
    assert with_change('nccl_env: "{{ env }}"\n', "A", "y") is None
    assert with_change("x: 1\n", "A", "y") is None


def test_bad_input_stops_before_any_host_is_contacted(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all:\n  children:\n    rack1:\n      hosts:\n        gpu01:\n"
                         "          ansible_host: 127.0.0.1\n          ansible_port: 1\n"
                         "    rack2:\n      hosts:\n        gpu02:\n"
                         "          ansible_host: 127.0.0.1\n          ansible_port: 1\n")
    (tmp_path / "group_vars").mkdir()
    assert app.tune_cmd(str(inventory), group="rack9") == 2
    assert app.tune_cmd(str(inventory), group="rack1") == 2
    assert app.tune_cmd(str(inventory), diff_path=str(inventory / "x.diff")) == 2
    (tmp_path / "group_vars" / "all.yml").write_text("tune_repeats: 500\n")
    assert app.tune_cmd(str(inventory)) == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == f"error: --group 'rack9': no such group in {inventory}"
    assert lines[1] == ("error: --group 'rack1' does not hold every selected host (gpu02 not "
                        "in it)")
    assert lines[2].startswith("error: --diff ")
    assert lines[3] == ("error: host gpu01: variable tune_repeats must be an integer from 2 "
                        f"to 100, got 500 ({tmp_path / 'group_vars' / 'all.yml'}:1)")
    assert len(lines) == 4
