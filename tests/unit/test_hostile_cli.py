"""Commands on broken input: one clear line on stderr and the documented exit code."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet import app, exitcodes
from gpufleet.connect.connection import Connection
from gpufleet.drift.run import history_dir
from gpufleet.errors import GpufleetError
from gpufleet.facts import report as facts_report
from gpufleet.facts.gather import FactRequest, Facts
from gpufleet.inventory.load import load_inventory
from gpufleet.inventory.target import Target


def test_an_empty_inventory_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inventory = tmp_path / "hosts.ini"
    inventory.write_text("# nothing yet\n[gpu]\n")
    assert app.facts(str(inventory)) == exitcodes.USAGE
    assert capsys.readouterr().err == f"error: inventory {inventory} has no hosts\n"


def test_a_limit_that_selects_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inventory = tmp_path / "hosts.ini"
    inventory.write_text("[gpu]\ngpu01 ansible_connection=local\n")
    assert app.drift_cmd(str(inventory), limit="gpu0[2-3]*") == exitcodes.USAGE
    assert capsys.readouterr().err == (
        f"error: --limit 'gpu0[2-3]*' selects no host of {inventory}\n")


@pytest.mark.parametrize(("status", "code"), [("ok", exitcodes.OK),
                                              ("failed", exitcodes.UNREACHABLE)])
def test_facts_exits_3_when_a_host_failed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          status: str, code: int) -> None:
    inventory = tmp_path / "hosts.ini"
    inventory.write_text("gpu01 ansible_connection=local\ngpu02 ansible_connection=local\n")

    def gather(conn: Connection, request: FactRequest) -> Facts:
        if status == "failed" and conn.host.name == "gpu02":  # type: ignore[attr-defined]
            raise GpufleetError("facts script failed (exit 2): no shell")
        return Facts(host="gpu01")

    monkeypatch.setattr(facts_report, "gather_facts", gather)
    assert app.facts(str(inventory)) == code


def test_a_bad_jump_host_is_bad_input_not_an_internal_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inventory = tmp_path / "hosts.ini"
    inventory.write_text("[gpu]\ngpu01 ansible_ssh_common_args='-J ops@bastion:22x'\n")
    assert app.provision_cmd(str(inventory), check=True) == exitcodes.USAGE
    assert capsys.readouterr().err == (
        f"error: {inventory}:2: invalid ansible_ssh_common_args '-J ops@bastion:22x': "
        "ProxyJump 'ops@bastion:22x': expected a number from 1 to 65535\n")


def test_a_malformed_history_file_does_not_end_the_drift_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture) -> None:
    inventory = tmp_path / "hosts.ini"
    inventory.write_text("gpu01 ansible_connection=local\n")
    reports = tmp_path / "reports"
    history = history_dir(reports, Target.select(load_inventory(inventory)))
    history.mkdir(parents=True)
    (history / "drift-20261130T020000.000000Z.json").write_text('[{"hosts": "x"}]')
    code = app.drift_cmd(str(inventory), outputs=app.DriftOutputs(report_dir=str(reports)))
    assert code == exitcodes.OK
    assert "Traceback" not in capsys.readouterr().err
    [warning] = caplog.messages
    assert "is unusable and was left out: not a drift report" in warning
    assert len(list(history.glob("drift-*.json"))) == 2  # the new run was kept beside it
