"""gpufleet tune's pure parts: the variables checked before any host, the candidates, the
winner only beyond the noise, the table, and the nccl_env diff, which git apply takes."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from gpufleet import app
from gpufleet.conformance.session import Node
from gpufleet.conformance.tune import (
    Candidate,
    Measured,
    candidates,
    diff,
    settings,
    table,
    winner,
    with_nccl_env,
)
from gpufleet.connect.connection import ConnectOptions
from gpufleet.facts.gather import Facts
from gpufleet.inventory.model import load_inventory
from gpufleet.provision.role import VarError


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
  NCCL_ALGO: Ring   # set by hand
  NCCL_DEBUG: WARN

cuda_version: "12.4.1"
"""


def test_the_diff_replaces_the_group_s_nccl_env_and_keeps_the_rest(tmp_path: Path) -> None:
    new = with_nccl_env(GROUP, {"NCCL_ALGO": "Ring", "NCCL_DEBUG": "WARN",
                                "NCCL_PROTO": "LL128"})
    assert new == GROUP.replace("  NCCL_DEBUG: WARN\n",
                                "  NCCL_DEBUG: WARN\n  NCCL_PROTO: LL128\n").replace(
        "   # set by hand", "")
    assert with_nccl_env("nccl_env: {NCCL_ALGO: Ring}\nx: 1\n", {"NCCL_ALGO": "Tree"}) == \
        "nccl_env:\n  NCCL_ALGO: Tree\nx: 1\n"
    assert with_nccl_env("x: 1\n", {"NCCL_ALGO": "Tree"}) == \
        "x: 1\n\nnccl_env:\n  NCCL_ALGO: Tree\n"


def test_git_applies_the_diff(tmp_path: Path) -> None:
    repo = tmp_path / "inv"
    (repo / "group_vars").mkdir(parents=True)
    path = repo / "group_vars" / "training.yml"
    path.write_text(GROUP)
    patch = diff(path, "group_vars/training.yml",
                 {"NCCL_ALGO": "Tree", "NCCL_DEBUG": "WARN"})
    new_file = diff(repo / "group_vars" / "h200.yml", "group_vars/h200.yml",
                    {"NCCL_PROTO": "LL128"})
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    for text in (patch, new_file):
        subprocess.run(["git", "-C", str(repo), "apply", "-"], input=text.encode(),
                       check=True, capture_output=True)
    assert "  NCCL_ALGO: Tree\n" in path.read_text()
    assert (repo / "group_vars" / "h200.yml").read_text() == "nccl_env:\n  NCCL_PROTO: LL128\n"


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
