"""gpufleet.slurm: parsers on output captured from the lab's slurmctld 22.05.8, reasons, and
the command wrappers against stand-in scontrol/sinfo scripts (argv and errors)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gpufleet.bootstrap import Bootstrap, StepResult, mark
from gpufleet.errors import ParseError
from gpufleet.inventory.model import load_inventory
from gpufleet.slurm.client import (
    REASON_LIMIT,
    Slurm,
    SlurmError,
    SlurmNode,
    drain_reason,
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


# ---- reasons -------------------------------------------------------------------------------

@pytest.mark.parametrize(("check", "message", "reason"), [
    ("conformance/reachability", "port 29500 closed",
     "gpufleet: conformance/reachability: port 29500 closed"),
    ("healthcheck/gpus", 'nvidia-smi failed:\n"Unable to determine"\r\t0000:3b:00',
     "gpufleet: healthcheck/gpus: nvidia-smi failed: 'Unable to determine' 0000:3b:00"),
    ("x", "", "gpufleet: x: failed"),
    ("", "bell\x07 and del\x7f", "gpufleet: check: bell and del"),
])
def test_drain_reason_is_one_clean_line(check: str, message: str, reason: str) -> None:
    assert drain_reason(check, message) == reason


def test_drain_reason_is_bounded() -> None:
    reason = drain_reason("healthcheck/xid", "Xid 79 " * 100)
    assert len(reason) == REASON_LIMIT and reason.endswith("...")
    assert reason.startswith("gpufleet: healthcheck/xid: Xid 79 Xid 79")


# ---- commands, against stand-ins that record their argv --------------------------------------

@pytest.fixture
def fake_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """scontrol that answers ``show node`` from $FAKE_SHOW and logs every argv as JSON."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "argv.log"
    record = ("python3 -c 'import json, sys; print(json.dumps(sys.argv[1:]))' \"$@\" >> "
              f"{log}\n")
    stand_in(bin_dir, "scontrol", record + 'case "$*" in *show*) cat "$FAKE_SHOW";; esac\n'
              'echo "SLURM_CONF=$SLURM_CONF" > "$FAKE_ENV"\n')
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_ENV", str(tmp_path / "env"))
    return tmp_path


def _calls(tmp: Path) -> list[list[str]]:
    return [json.loads(line) for line in (tmp / "argv.log").read_text().splitlines()]


def _show(tmp: Path, monkeypatch: pytest.MonkeyPatch, fixture: str, node: str) -> None:
    lines = [ln for ln in (SLURM / fixture).read_text().splitlines()
             if ln.startswith(f"NodeName={node} ")]
    (tmp / "show.txt").write_text("\n".join(lines) + "\n")
    monkeypatch.setenv("FAKE_SHOW", str(tmp / "show.txt"))


def test_drain_passes_the_reason_as_one_argument(fake_slurm: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    _show(fake_slurm, monkeypatch, "scontrol_show_node.txt", "node04")
    action = Slurm(conf=Path("/x/slurm.conf")).drain("node04", "conformance/allreduce",
                                                      'bus bandwidth 1.2 "GB/s"; rm -rf /')
    reason = "gpufleet: conformance/allreduce: bus bandwidth 1.2 'GB/s'; rm -rf /"
    assert (action.action, action.detail) == ("drained", reason)
    assert _calls(fake_slurm)[-1] == ["update", "nodename=node04", "state=drain",
                                      f"reason={reason}"]
    assert (fake_slurm / "env").read_text().strip() == "SLURM_CONF=/x/slurm.conf"


def test_drain_leaves_an_operator_drain_alone(fake_slurm: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    _show(fake_slurm, monkeypatch, "scontrol_show_node.txt", "node01")
    action = Slurm().drain("node01", "healthcheck/xid", "Xid 79")
    assert action.action == "left alone" and "replace PSU" in action.detail
    assert not any(c[0] == "update" for c in _calls(fake_slurm))


def test_resume_only_what_gpufleet_drained(fake_slurm: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    _show(fake_slurm, monkeypatch, "scontrol_show_node.txt", "node01")
    assert Slurm().resume("node01").action == "left alone"
    _show(fake_slurm, monkeypatch, "scontrol_show_node.txt", "node04")
    assert Slurm().resume("node04").action == "unchanged"
    assert not any(c[0] == "update" for c in _calls(fake_slurm))
    _show(fake_slurm, monkeypatch, "scontrol_show_node.txt", "node03")
    assert Slurm().resume("node03", ("drift/", "conformance/firewall/")).action == "left alone"
    assert not any(c[0] == "update" for c in _calls(fake_slurm))
    action = Slurm().resume("node03", ("conformance/reachability",))
    assert action.action == "resumed" and "conformance/reachability" in action.detail
    assert _calls(fake_slurm)[-1] == ["update", "nodename=node03", "state=resume"]


@pytest.mark.parametrize("name", ["node[01-02]", "node01 state=resume", "", "-x"])
def test_node_names_that_are_not_one_node_are_refused(name: str) -> None:
    with pytest.raises(SlurmError, match="invalid Slurm node name"):
        Slurm().drain(name, "c", "m")


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
        Slurm().resume("nope")


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
    reason = "gpufleet: bootstrap/provision: provision: apt failed"
    assert _calls(fake_slurm)[-1] == ["update", "nodename=node04", "state=drain",
                                      f"reason={reason}"]
    assert f"scheduler: drained: {reason}" in message
    _show(fake_slurm, monkeypatch, "scontrol_show_node.txt", "node03")  # a gpufleet drain
    show = fake_slurm / "show.txt"
    show.write_text(show.read_text().replace("NodeName=node03 ", "NodeName=node04 "))
    mark(None, host, inventory, Bootstrap("gpu4", ready=True), None)
    assert _calls(fake_slurm)[-1] == ["update", "nodename=node04", "state=resume"]
