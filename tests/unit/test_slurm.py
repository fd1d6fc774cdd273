"""gpufleet.slurm: parsers on output captured from the lab's slurmctld 22.05.8, reasons, and
the command wrappers against stand-in scontrol/sinfo scripts (argv and errors)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from gpufleet.bootstrap import Bootstrap, StepResult, mark
from gpufleet.errors import ParseError
from gpufleet.inventory.load import load_inventory
from gpufleet.slurm.client import (
    RunFindings,
    Slurm,
    SlurmError,
    SlurmNode,
    parse_show_node,
    parse_show_partition,
    parse_sinfo,
)
from tests.conftest import FIXTURES, stand_in

SLURM = FIXTURES / "slurm"


def _nodes(name: str) -> dict[str, SlurmNode]:
    return {n.name: n for n in parse_show_node((SLURM / name).read_text())}


def test_show_node_reads_every_field_gpufleet_uses() -> None:
    nodes = _nodes("scontrol_show_node.txt")
    assert list(nodes) == ["node01", "node03", "node04", "node05"]
    node04 = nodes["node04"]
    assert node04.address == "10.119.0.14" and node04.hostname == "node04"
    assert node04.cpus == 4 and node04.gres == "gpu:2" and node04.gpus == 2
    assert node04.features == ("h200", "ib") and node04.partitions == ("lab",)
    assert node04.state == "MIXED" and not node04.drained and node04.reason is None


def test_show_node_reason_keeps_bars_and_key_value_text_and_splits_user_and_time() -> None:
    node01 = parse_show_node((SLURM / "scontrol_show_node.txt").read_text())[0]
    assert node01.reason == "maintenance: replace PSU | ticket=OPS-12 Comment=x"
    assert (node01.reason_user, node01.reason_time) == ("root", "2026-12-01T09:55:09")
    assert node01.drained and not node01.drained_by_gpufleet
    assert node01.base_state == "IDLE" and node01.flags == {"DRAIN"}


def test_show_node_reason_before_a_comment_field() -> None:
    (node,) = parse_show_node((SLURM / "scontrol_show_node_comment.txt").read_text())
    assert node.reason == "disk check [smartctl] = failing"
    assert node.reason_time == "2026-12-01T10:00:06"


def test_gpufleet_drained_and_downed_nodes() -> None:
    nodes = _nodes("scontrol_show_node.txt")
    assert nodes["node03"].drained_by_gpufleet
    node05 = nodes["node05"]
    assert node05.base_state == "DOWN" and not node05.drained
    assert node05.drained_by_gpufleet


def test_not_responding_flag() -> None:
    node05 = _nodes("scontrol_show_node_not_responding.txt")["node05"]
    assert node05.state == "IDLE+NOT_RESPONDING"
    assert node05.flags == {"NOT_RESPONDING"}


def test_show_partition() -> None:
    (part,) = parse_show_partition((SLURM / "scontrol_show_partition.txt").read_text())
    assert (part.name, part.nodes, part.state, part.default) == ("lab", "node[01,03-05]", "UP",
                                                                 True)


def test_sinfo_rows() -> None:
    rows = parse_sinfo((SLURM / "sinfo_nodes.txt").read_text())
    assert [(r.name, r.partition, r.default_partition, r.state) for r in rows] == [
        ("node01", "lab", True, "drained"), ("node03", "lab", True, "drained"),
        ("node04", "lab", True, "mixed"), ("node05", "lab", True, "down")]
    assert rows[0].reason == "maintenance: replace PSU | ticket=OPS-12 Comment=x"
    assert rows[2].reason is None and rows[2].cpus == 4 and rows[2].gres == "gpu:2"
    states = [r.state for r in parse_sinfo((SLURM / "sinfo_nodes_not_responding.txt")
                                           .read_text())]
    assert states[-1] == "idle*"


@pytest.mark.parametrize("text", ["Node nope not found\n", "PARTITION AVAIL\n"])
def test_unexpected_output_is_a_parse_error(text: str) -> None:
    with pytest.raises(ParseError):
        parse_show_node(text)
    with pytest.raises(ParseError):
        parse_sinfo(text)


def test_gres_gpu_counts() -> None:
    line = (SLURM / "scontrol_show_node_one.txt").read_text()
    typed = line.replace("Gres=gpu:2", "Gres=gpu:h200:8(S:0-1),nic:2")
    assert parse_show_node(typed)[0].gpus == 8
    assert parse_show_node(line.replace("Gres=gpu:2", "Gres=(null)"))[0].gpus == 0


# ---- commands, against a stand-in scontrol that keeps the node's state ----------------------

FAKE_SCONTROL = r"""#!/usr/bin/env python3
import json, os, re, sys
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(json.dumps(sys.argv[1:]) + "\n")
with open(os.environ["FAKE_ENV"], "w") as env:
    env.write("SLURM_CONF=" + os.environ.get("SLURM_CONF", "") + "\n")
show = os.environ["FAKE_SHOW"]
line = open(show).read().strip()
if "show" in sys.argv:
    print(line)
elif sys.argv[1] == "update":
    opts = dict(a.split("=", 1) for a in sys.argv[2:])
    state = re.search(r" State=(\S+)", line).group(1)
    base = state.split("+")[0]
    line = re.sub(r" Reason=.*$", "", line)
    race = os.environ.get("FAKE_RACE")
    if race and not os.path.exists(show + ".raced"):  # another run's write lands over ours
        open(show + ".raced", "w").close()
        opts = {"state": "drain", "reason": race}
    if opts["state"] == "drain":
        line = line.replace(f" State={state}", f" State={base}+DRAIN")
        line += f" Reason={opts['reason']} [root@2026-12-01T10:00:00]"
    else:
        line = line.replace(f" State={state}", " State=IDLE")
    open(show, "w").write(line + "\n")
"""


@pytest.fixture
def fake_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """scontrol that answers ``show node`` from $FAKE_SHOW, applies ``update`` to it, and
    logs every argv as JSON."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stand_in(bin_dir, "scontrol", "")
    (bin_dir / "scontrol").write_text(FAKE_SCONTROL)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_ENV", str(tmp_path / "env"))
    monkeypatch.setenv("FAKE_LOG", str(tmp_path / "argv.log"))
    monkeypatch.setattr("gpufleet.slurm.client.SETTLE_S", 0.0)
    return tmp_path


def _calls(tmp: Path) -> list[list[str]]:
    return [json.loads(line) for line in (tmp / "argv.log").read_text().splitlines()]


def _updates(tmp: Path) -> list[list[str]]:
    return [c for c in _calls(tmp) if c[0] == "update"] if (tmp / "argv.log").exists() else []


def _show(tmp: Path, monkeypatch: pytest.MonkeyPatch, fixture: str, node: str) -> None:
    lines = [ln for ln in (SLURM / fixture).read_text().splitlines()
             if ln.startswith(f"NodeName={node} ")]
    (tmp / "show.txt").write_text("\n".join(lines) + "\n")
    monkeypatch.setenv("FAKE_SHOW", str(tmp / "show.txt"))


def _reason(tmp: Path) -> str | None:
    return parse_show_node((tmp / "show.txt").read_text())[0].reason


def test_a_finding_drains_and_the_reason_is_one_argument(
        fake_slurm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _show(fake_slurm, monkeypatch, "scontrol_show_node.txt", "node04")
    action = Slurm(conf=Path("/x/slurm.conf")).update("node04", [RunFindings(
        "conformance", {"allreduce/each_node_alone": 'bus bandwidth 1.2 "GB/s"; rm -rf /'})])
    assert action.action == "drained"
    reason = action.detail
    assert reason.startswith("gf allreduce/each_node_alone: bus bandwidth 1.2 'GB/s'; rm -rf / "
                             "{gf1 c:allreduce/each_node_alone@")
    assert _updates(fake_slurm) == [["update", "nodename=node04", "state=drain",
                                     f"reason={reason}"]]
    assert (fake_slurm / "env").read_text().strip() == "SLURM_CONF=/x/slurm.conf"


def test_an_operator_drain_is_left_alone(fake_slurm: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    _show(fake_slurm, monkeypatch, "scontrol_show_node.txt", "node01")
    for run in (RunFindings("healthcheck", {"xid": "Xid 79"}),
                RunFindings("conformance", {}, ["gpu/health"])):
        action = Slurm().update("node01", [run])
        assert action.action == "left alone" and "replace PSU" in action.detail
    assert _updates(fake_slurm) == []


def test_the_node_stays_drained_while_any_finding_is_open(
        fake_slurm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The defect: drift re-drained a node conformance had drained (for ECC errors) and the
    next clean drift resumed it. Now each run only clears its own findings."""
    _show(fake_slurm, monkeypatch, "scontrol_show_node.txt", "node04")
    slurm = Slurm()
    slurm.update("node04", [RunFindings("conformance", {"gpu/health": "GPU0: 2 ECC errors"})])
    slurm.update("node04", [RunFindings("drift", {"nccl_env": "/etc/nccl.conf differs"},
                                        ["driver", "cuda"])])
    reason = _reason(fake_slurm) or ""
    assert reason.startswith("gf gpu/health: GPU0: 2 ECC errors (+1 more) {gf1 c:gpu/health@")
    assert " d:nccl_env@" in reason
    assert slurm.update("node04", [RunFindings("drift", {}, ["nccl_env"])]).action == "drained"
    assert (_reason(fake_slurm) or "").startswith("gf gpu/health: GPU0: 2 ECC errors {gf1 ")
    assert slurm.update("node04", [RunFindings("drift", {}, ["nccl_env"])]).action == \
        "unchanged"
    action = slurm.update("node04", [RunFindings("conformance", {}, ["gpu/health"])])
    assert action.action == "resumed"
    assert _updates(fake_slurm)[-1] == ["update", "nodename=node04", "state=resume"]
    assert slurm.update("node04", [RunFindings("conformance", {}, ["gpu/health"])]).action \
        == "unchanged"


def test_a_write_lost_to_another_run_is_merged_again(
        fake_slurm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two controllers read the same reason and write one after the other: the first reads
    the reason again after settling, finds its finding gone and merges into the other's."""
    _show(fake_slurm, monkeypatch, "scontrol_show_node.txt", "node04")
    monkeypatch.setenv("FAKE_RACE", "gf drift/nccl_env: differs {gf1 d:nccl_env@1764590300}")
    action = Slurm().update("node04", [RunFindings("conformance", {"gpu/health": "ECC"})])
    assert action.action == "drained"
    assert len(_updates(fake_slurm)) == 2
    reason = _reason(fake_slurm) or ""
    assert reason.startswith("gf drift/nccl_env: differs (+1 more) {gf1 d:nccl_env@1764590300 "
                             "c:gpu/health@"), reason


def test_a_reason_of_an_earlier_version_is_one_finding(
        fake_slurm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _show(fake_slurm, monkeypatch, "scontrol_show_node.txt", "node03")
    assert Slurm().update("node03", [RunFindings("drift", {}, ["nccl_env"])]).action == \
        "unchanged"
    assert Slurm().update("node03", [RunFindings("drift", {"nccl_env": "differs"})]).action \
        == "drained"
    assert re.fullmatch(r"gf reachability: port 29500 closed 'to node01' second line \(\+1 "
                        r"more\) \{gf1 c:reachability@0 d:nccl_env@\d+\}",
                        _reason(fake_slurm) or "")
    assert Slurm().update("node03", [RunFindings("drift", {}, ["nccl_env"])]).action == \
        "drained"
    assert Slurm().update("node03", [RunFindings("conformance", {}, ["reachability"])]
                          ).action == "resumed"


@pytest.mark.parametrize("name", ["node[01-02]", "node01 state=resume", "", "-x"])
def test_node_names_that_are_not_one_node_are_refused(name: str) -> None:
    with pytest.raises(SlurmError, match="invalid Slurm node name"):
        Slurm().update(name, [RunFindings("conformance", {"c": "m"})])


def test_missing_scontrol_is_a_clear_error(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SlurmError, match=r"^scontrol not found on this machine: install"):
        Slurm().nodes()


def test_unanswering_slurmctld_is_a_clear_error(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    captured = SLURM / "scontrol_no_controller.txt"
    stand_in(tmp_path, "scontrol", f"cat {captured} >&2\nexit 1\n")
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    with pytest.raises(SlurmError, match=r"^slurmctld does not answer `scontrol --all "
                                         r"--oneliner`: slurm_load_node error: Unable to "
                                         r"contact slurm controller"):
        Slurm().nodes()


def test_every_call_has_a_timeout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stand_in(tmp_path, "scontrol", "exec sleep 30\n")
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    with pytest.raises(SlurmError, match=r"did not finish within 1s: slurmctld does not "
                                         r"answer"):
        Slurm(timeout=1.0).node("node01")


def test_unknown_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    captured = SLURM / "scontrol_show_node_missing.txt"
    stand_in(tmp_path, "scontrol", f"cat {captured}\nexit 1\n")
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    with pytest.raises(SlurmError, match=r"^no Slurm node named 'nope'$"):
        Slurm().update("nope", [RunFindings("drift", {}, ["nccl_env"])])


def test_bootstrap_drains_a_node_it_could_not_reach_and_resumes_a_certified_one(
        fake_slurm: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  vars: {gpufleet_scheduler: slurm, gpufleet_slurm_conf: /x/s.conf}\n"
                   "  hosts:\n    gpu4: {ansible_host: 127.0.0.1, gpufleet_slurm_node: node04}\n")
    inventory = load_inventory(inv)
    host = inventory.hosts["gpu4"]
    _show(fake_slurm, monkeypatch, "scontrol_show_node.txt", "node04")
    failed = Bootstrap("gpu4", [StepResult("trust", "ok", ""),
                                StepResult("provision", "failed", "apt failed")],
                       reason="provision: apt failed")
    message, _ = mark(None, host, inventory, failed, None)
    reason = _reason(fake_slurm) or ""
    assert reason.startswith("gf bootstrap/provision: provision: apt failed {gf1 b:provision@")
    assert f"scheduler: drained: {reason}" in message
    certified = Bootstrap("gpu4", [StepResult("provision", "ok", ""),
                                   StepResult("certify", "ok", "")], ready=True,
                          passed_checks=["gpu/health"])
    mark(None, host, inventory, certified, None)
    assert _updates(fake_slurm)[-1] == ["update", "nodename=node04", "state=resume"]
