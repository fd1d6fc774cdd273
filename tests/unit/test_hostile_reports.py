"""Host- and inventory-controlled text at every writer: rich markup is printed, not
interpreted; control characters and ANSI escapes never reach the terminal; JUnit stays
valid XML; the facts JSON is still written."""

from __future__ import annotations

import io
import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from gpufleet import app
from gpufleet.connect.connection import Connection
from gpufleet.connect.fleet import Outcome
from gpufleet.drift import report as drift_report
from gpufleet.drift.compare import DriftItem, HostDrift, Inconsistency
from gpufleet.facts import report as facts_report
from gpufleet.facts.gather import FactRequest, Facts
from gpufleet.provision import report as provision_report
from gpufleet.provision.plan import Change, Plan
from gpufleet.report import junit, terminal
from tests.junit_schema import check_junit

HOSTILE = "[/x] [bold]b[/bold] \x1b[31mred\x1b[0m \x00nul \u202eevil\r\nforged"


def output(write: Any) -> str:
    stream = io.StringIO()
    con = terminal.console(stream)
    con.width = 4000  # no folding: the assertions look for whole strings
    write(con)
    return stream.getvalue()


def assert_terminal_safe(text: str) -> None:
    assert "\x1b" not in text and "\x00" not in text and "\u202e" not in text and "\r" not in text
    assert "\\x1b[31mred\\x1b[0m" in text
    assert "[/x] [bold]b[/bold]" in text
    assert "\\x00nul \\u202eevil\\x0d\\x0aforged" in text


def test_plain_and_markup_helpers() -> None:
    assert terminal.plain(HOSTILE) == (
        "[/x] [bold]b[/bold] \\x1b[31mred\\x1b[0m \\x00nul \\u202eevil\\x0d\\x0aforged")
    assert terminal.plain("two\nlines\ttab", newlines=True) == "two\nlines\ttab"
    assert terminal.markup("[/x]") == "\\[/x]"
    assert terminal.markup(":warning: \\") == ":warning: \\\\"


def test_recap_progress_and_facts_table_with_a_hostile_host() -> None:
    outcome: Outcome[Any] = Outcome(HOSTILE, "failed", f"boom {HOSTILE}", 1.0)
    outcomes = {HOSTILE: outcome}
    assert_terminal_safe(output(lambda con: terminal.print_recap(con, outcomes,
                                                                 {HOSTILE: HOSTILE})))
    assert_terminal_safe(output(lambda con: con.print(terminal.facts_table(outcomes))))
    ok: Outcome[Any] = Outcome(HOSTILE, "ok", None, 1.0, {"os": HOSTILE})
    assert_terminal_safe(output(lambda con: con.print(terminal.facts_table({HOSTILE: ok}))))
    stream = io.StringIO()
    progress = terminal.TerminalProgress("facts", stream)
    progress.start(1)
    progress.host_done(outcome)
    assert_terminal_safe(stream.getvalue())


def test_a_plan_with_hostile_resources_and_diffs() -> None:
    change = Change("nccl_env", f"file {HOSTILE}", "update", HOSTILE, HOSTILE, [],
                    diff=f"+{HOSTILE}\n-[/red]\n")
    text = output(lambda con: provision_report.print_plan(con, Plan(HOSTILE, [change]), True))
    assert_terminal_safe(text)
    assert "-[/red]" in text


def hostile_drift() -> drift_report.DriftRun:
    item = DriftItem(HOSTILE, HOSTILE, HOSTILE, "file", HOSTILE, HOSTILE, f"+{HOSTILE}\n")
    hosts = {HOSTILE: HostDrift(HOSTILE, "drifted", [item], None, 1.0),
             "clean\x1b[2J": HostDrift("clean\x1b[2J", "error", [], f"failed: {HOSTILE}", 1.0)}
    inconsistency = Inconsistency(HOSTILE, HOSTILE, {HOSTILE: [HOSTILE]}, None)
    return drift_report.DriftRun("inv", "0" * 64, hosts, [inconsistency], [], [], 0.0, 1.0,
                                 remediation={HOSTILE: {"status": HOSTILE, "error": HOSTILE}})


def test_the_drift_report_with_a_hostile_group_host_and_item() -> None:
    text = output(lambda con: drift_report.print_report(con, hostile_drift()))
    assert_terminal_safe(text)
    assert "\\x1b[2J" in text


def test_junit_stays_valid_xml_and_keeps_the_text_visible(tmp_path: Path) -> None:
    path = tmp_path / "drift.xml"
    junit.write(path, drift_report.to_junit(hostile_drift()))
    check_junit(path)
    root = ET.fromstring(path.read_bytes())
    failure = root.find("testsuite/testcase/failure")
    assert failure is not None
    assert failure.text is not None and "\\x1b[31mred" in failure.text
    assert "\\x00nul" in failure.get("message", "")
    error = root.find("testsuite/testcase/error")
    assert error is not None and "\\x00nul" in error.get("message", "")


@pytest.mark.parametrize("character", ["\x00", "\x08", "\x1b", "\x1f", "\ud800", "\ufffe"])
def test_junit_replaces_each_character_xml_cannot_hold(character: str) -> None:
    suite = junit.Suite("drift", 0.0, {"inventory": f"inv{character}"})
    suite.case("h", f"name{character}", failure=character, data={"k": character})
    document = junit.render(suite)
    ET.fromstring(document)
    assert f"\\x{ord(character):02x}".encode() in document or \
        f"\\u{ord(character):04x}".encode() in document


def test_facts_survives_hostile_fact_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    inventory = tmp_path / "hosts.yml"
    inventory.write_text('all:\n  hosts:\n    "evil\\e[31mnode":\n'
                         "      ansible_connection: local\n")

    def gather(conn: Connection, request: FactRequest) -> Facts:
        return Facts(host=HOSTILE, values={"os_release": {"PRETTY_NAME": HOSTILE}},
                     absent={"gpus": f"exit 1: {HOSTILE}"})

    monkeypatch.setattr(facts_report, "gather_facts", gather)
    report = tmp_path / "facts.json"
    stream = io.StringIO()
    code = app.facts(str(inventory), json_path=str(report), out=stream)
    assert code == 0
    assert_terminal_safe(stream.getvalue())
    assert "evil\\x1b[31mnode" in stream.getvalue()
    document = json.loads(report.read_text())
    assert document["hosts"]["evil\x1b[31mnode"]["absent"]["gpus"] == f"exit 1: {HOSTILE}"
    assert "\x1b" not in capsys.readouterr().err


def test_an_error_message_reaches_stderr_without_control_characters(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inventory = tmp_path / "hosts.ini"
    inventory.write_text("[gpu]\ngpu01 ansible_port=\x1b[2J\n")
    assert app.facts(str(inventory)) == 2
    err = capsys.readouterr().err
    assert "\x1b" not in err
    assert err == f"error: {inventory}:2: invalid ansible_port '\\x1b[2J': expected a number " \
                  "from 1 to 65535\n"
