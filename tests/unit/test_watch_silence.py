"""``gpufleet watch silence|unsilence``: every value checked for its syntax before any host
is contacted (a bad one exits 2 with one line), each word quoted for the node's shell, and
``gpufleet-watch`` run on each selected node over its connection (here a stand-in over a
local connection, which records the words it was given). The command line is parsed in this
process, as the console script parses it."""

from __future__ import annotations

import io
import logging
import shlex
import signal
from pathlib import Path

import pytest
from invoke.exceptions import Exit

from gpufleet import app, exitcodes
from gpufleet.cli import program
from gpufleet.roles import WatchSetup
from gpufleet.watch import MOST_AHEAD_S, Silence, WatchUsage, parse_until, plan
from tests.conftest import stand_in
from tests.unit.test_cli import one_line

NOW = 1765000000.0  # 2025-12-06T05:46:40Z
SETUP = WatchSetup("/usr/local/sbin/gpufleet-watch", "/etc/gpufleet/watch.json",
                   "/var/lib/gpufleet")


@pytest.mark.parametrize(("text", "until"), [
    ("1765003600", 1765003600),
    ("1765003600.9", 1765003600),
    ("+90s", 1765000090),
    ("+12h", 1765043200),
    ("+2d", 1765172800),
    ("+1w", 1765604800),
    ("2025-12-06T18:00Z", 1765044000),
    ("2025-12-06T18:00:00+00:00", 1765044000),
    ("2025-12-06T19:00+01:00", 1765044000),
    (" 2025-12-06T18:00:00Z ", 1765044000),
])
def test_until_takes_unix_seconds_a_span_or_iso_8601_with_its_zone(text: str, until: int) -> None:
    assert parse_until(text, NOW) == until


@pytest.mark.parametrize(("text", "message"), [
    ("2025-12-06T18:00", r"has no time zone: add Z \(UTC\) or an offset"),
    ("2025-12-07", "has no time zone"),
    ("tomorrow", r"--until must be a time: Unix seconds, \+N with s, m, h, d or w"),
    ("+12", "--until must be a time"),
    ("-12h", "--until must be a time"),
    ("12h", "--until must be a time"),
    ("$(reboot)", "--until must be a time"),
    ("1764999999", r"is in the past \(2025-12-06T05:46:39Z\)"),
    ("+0s", "is in the past"),
    ("2025-12-01T00:00Z", "is in the past"),
    (str(int(NOW) + MOST_AHEAD_S + 1), r"is more than a year ahead \(2026-12-07T05:46:41Z\)"),
    ("1765000000000", r"is more than a year ahead \(after the year 9999\)"),
    ("9" * 400, r"is more than a year ahead \(after the year 9999\)"),
    ("+999999w", "is more than a year ahead"),
])
def test_an_until_that_is_no_time_or_out_of_range_is_refused(text: str, message: str) -> None:
    with pytest.raises(WatchUsage, match=message):
        parse_until(text, NOW)


@pytest.mark.parametrize(("action", "finding", "until", "reason", "message"), [
    ("mute", "a", "+1h", None, "the action must be silence or unsilence, got 'mute'"),
    ("silence", None, "+1h", None, "watch silence needs --finding ID"),
    ("silence", "-x", "+1h", None, "--finding must be a finding id of letters, digits"),
    ("silence", "--help", "+1h", None, "--finding must be a finding id"),
    ("silence", "rdma/mlx5_0/1 x", "+1h", None, "--finding must be a finding id"),
    ("silence", "a;reboot", "+1h", None, "--finding must be a finding id"),
    ("silence", "a" * 201, "+1h", None, "--finding must be a finding id"),
    ("silence", "a", None, None, "watch silence needs --until TIME"),
    ("silence", "a", "+1h", "", "--reason must be one line of text"),
    ("silence", "a", "+1h", "two\nlines", "--reason must be one line of text"),
    ("silence", "a", "+1h", "\x1b[31mred", "--reason must be one line of text"),
    ("silence", "a", "+1h", "right\u202eto left", "--reason must be one line of text"),
    ("silence", "a", "+1h", "x" * 201, "--reason must be one line of text of at most 200"),
    ("unsilence", "a", "+1h", None, "--until and --reason go with watch silence"),
    ("unsilence", "a", None, "why", "--until and --reason go with watch silence"),
])
def test_a_bad_value_is_refused_naming_its_flag(action: str, finding: str | None,
                                                until: str | None, reason: str | None,
                                                message: str) -> None:
    with pytest.raises(WatchUsage, match=message) as refused:
        plan(action, finding, until, reason, NOW)
    assert refused.value.exit_code == exitcodes.USAGE


def test_every_word_reaches_the_program_as_one_argument() -> None:
    hostile = "RMA 4471 $(reboot) `id` ; rm -rf / 'quoted' \"double\" ünï"
    silence = plan("silence", "nvlink/GPU3/link7/replay", "+12h", hostile, NOW)
    assert silence == Silence("silence", "nvlink/GPU3/link7/replay", 1765043200, hostile)
    assert shlex.split(silence.command(SETUP)) == [
        "/usr/local/sbin/gpufleet-watch", "silence", "nvlink/GPU3/link7/replay", "--until",
        "1765043200", "--reason", hostile, "--config", "/etc/gpufleet/watch.json"]
    assert silence.describe() == (f"silence nvlink/GPU3/link7/replay until 2025-12-06T17:46:40Z "
                                  f"({hostile})")
    lifted = plan("unsilence", "nvlink/GPU3/link7/replay", None, None, NOW)
    assert shlex.split(lifted.command(SETUP)) == [
        "/usr/local/sbin/gpufleet-watch", "unsilence", "nvlink/GPU3/link7/replay", "--config",
        "/etc/gpufleet/watch.json"]


@pytest.fixture
def fleet(tmp_path: Path) -> Path:
    """A local inventory: two nodes with a stand-in gpufleet-watch that records its words
    (one per line) and answers as the program would, one whose program refuses, one without
    the watch."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stand_in(bin_dir, "gpufleet-watch",
             f'printf "%s\\n" "$@" >> {tmp_path}/calls\necho "silenced $2"\n')
    stand_in(bin_dir, "refusing-watch", "echo 'watch.json: unknown key \"x\"' >&2\nexit 2\n")
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(f"""all:
  vars:
    ansible_connection: local
    slurm_healthcheck: true
    node_watch_path: {bin_dir}/gpufleet-watch
    node_watch_config: {tmp_path}/watch.json
  hosts:
    gpu01:
    gpu02:
    gpu03:
      node_watch_path: {bin_dir}/refusing-watch
    cpu01:
      slurm_healthcheck: false
""")
    return inventory


def test_silence_runs_the_program_on_each_selected_node(fleet: Path) -> None:
    out = io.StringIO()
    code = app.watch_cmd(str(fleet), "silence", limit="gpu01:gpu02",
                         finding="rdma/mlx5_0/1/symbol_error", until="+12h",
                         reason="cable swap $(date)", out=out)
    assert code == exitcodes.OK
    words = (fleet.parent / "calls").read_text().splitlines()
    assert words.count("silence") == 2 and words.count("cable swap $(date)") == 2
    assert words[:3] == ["silence", "rdma/mlx5_0/1/symbol_error", "--until"]
    assert words[5:8] == ["cable swap $(date)", "--config", f"{fleet.parent}/watch.json"]
    text = out.getvalue()
    assert "WATCH silence rdma/mlx5_0/1/symbol_error until " in text
    assert "(cable swap $(date))" in text
    assert "silenced rdma/mlx5_0/1/symbol_error" in text
    (fleet.parent / "calls").unlink()
    assert app.watch_cmd(str(fleet), "unsilence", limit="gpu01",
                         finding="rdma/mlx5_0/1/symbol_error", out=io.StringIO()) == 0
    assert (fleet.parent / "calls").read_text().splitlines() == [
        "unsilence", "rdma/mlx5_0/1/symbol_error", "--config", f"{fleet.parent}/watch.json"]


def test_a_program_that_refuses_fails_its_node_only(fleet: Path) -> None:
    out = io.StringIO()
    code = app.watch_cmd(str(fleet), "silence", limit="gpu02:gpu03", finding="a", until="+1h",
                         out=out)
    assert code == exitcodes.FAILED
    assert 'gpufleet-watch silence exited 2: watch.json: unknown key "x"' in out.getvalue()
    assert (fleet.parent / "calls").read_text().splitlines()[:2] == ["silence", "a"]


@pytest.mark.parametrize(("args", "message"), [
    (["silence", "--finding", "a", "--until", "+1h"],
     "error: watch silence needs -l/--limit: the node(s) whose finding it is"),
    (["silence", "-l", "gpu01:cpu01", "--finding", "a", "--until", "+1h"],
     "error: the watch is not in use on cpu01 (slurm_healthcheck is off there, or "
     "node_watch is false): nothing to silence"),
    (["silence", "-l", "gpu01", "--finding", "a", "--until", "yesterday"],
     "error: --until must be a time"),
    ([], "error: 'watch' did not receive required positional arguments: 'action'"),
])
def test_bad_usage_exits_2_in_one_line_before_any_node_is_contacted(
        fleet: Path, args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    handlers, sigterm = list(logging.getLogger().handlers), signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(Exit) as stopped:
            program().run(["gpufleet", "watch", *args[:1], "-i", str(fleet), *args[1:]],
                          exit=False)
    finally:  # the command's logging and SIGTERM handler stay with it
        logging.getLogger().handlers[:] = handlers
        signal.signal(signal.SIGTERM, sigterm)
    assert stopped.value.code == exitcodes.USAGE
    assert one_line(capsys.readouterr().err).startswith(message)
    assert not (fleet.parent / "calls").exists()
