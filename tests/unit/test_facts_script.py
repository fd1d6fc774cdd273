"""The composite facts script: compose many commands, run them with sh, split the output."""

from __future__ import annotations

import base64
import os
import re
import socket
import subprocess
import time
from pathlib import Path

import pytest

from gpufleet.connect.local import LocalConnection
from gpufleet.facts import script
from gpufleet.facts.gather import gather_facts
from gpufleet.facts.script import Section
from gpufleet.inventory.model import Host
from tests.conftest import stand_in


def run_sh(text: str) -> str:
    """Run a composed script with sh on this machine, as a host would."""
    proc = subprocess.run(["sh", "-c", text], capture_output=True, timeout=30, check=False)
    return proc.stdout.decode("utf-8", errors="replace")


def round_trip(commands: list[tuple[str, str]]) -> dict[str, Section]:
    return script.split(run_sh(script.compose(commands)))


def frame(name: str, rc: int, text: str, nonce: str = "") -> str:
    """One section as the script prints it: markers around the body in base64."""
    tag = f"@@gpufleet-{nonce}" if nonce else "@@gpufleet"
    body = base64.encodebytes(text.encode()).decode()
    return f"\n{tag}:{name}@@\n{body}{tag}-rc:{rc}@@\n"


# --------------------------------------------------------------------------- compose


def test_compose_exact_text_for_one_command() -> None:
    assert script.compose([("hostname", "hostname")]) == (
        script.PRELUDE
        + "__s\n( hostname\n) </dev/null >\"$__o\" 2>&1\n__e hostname $?\n"
    )


def test_compose_quotes_names_with_spaces_and_quotes() -> None:
    text = script.compose([("file:/etc/my file's.conf", "true")])
    assert text.endswith("__s\n( true\n) </dev/null >\"$__o\" 2>&1\n"
                         "__e 'file:/etc/my file'\"'\"'s.conf' $?\n")


def test_prelude_sets_c_locale_and_sbin_path() -> None:
    assert script.PRELUDE.startswith(
        "export LC_ALL=C PATH=\"$PATH:/usr/local/sbin:/usr/sbin:/sbin\"\n")


@pytest.mark.parametrize("name", ["two\nlines", "a@@b", "@@", "x@@"])
def test_compose_rejects_names_that_would_break_the_markers(name: str) -> None:
    with pytest.raises(ValueError, match="bad section name"):
        script.compose([(name, "true")])


def test_compose_of_nothing_is_only_the_prelude() -> None:
    assert script.compose([]) == script.PRELUDE
    assert round_trip([]) == {}


# --------------------------------------------------------------------------- round trip


def test_round_trip_keeps_each_sections_exact_text_and_rc() -> None:
    sections = round_trip([
        ("plain", "echo hello"),
        ("no-newline", "printf 'a\\nb'"),
        ("empty", "true"),
        ("blank-lines", "printf '\\n\\n'"),
        ("leading-blank", "printf '\\nx\\n'"),
        ("rc", "echo oops; exit 3"),
        ("silent-failure", "exit 7"),
        ("stderr", "echo out; echo err >&2"),
        ("comment", "echo c # a trailing comment must not swallow the subshell"),
        ("utf8", "printf 'caf\\303\\251\\n'"),
        ("tabs", "printf 'a\\tb  \\n'"),
    ])
    assert sections == {
        "plain": Section("plain", 0, "hello\n"),
        "no-newline": Section("no-newline", 0, "a\nb"),
        "empty": Section("empty", 0, ""),
        "blank-lines": Section("blank-lines", 0, "\n\n"),
        "leading-blank": Section("leading-blank", 0, "\nx\n"),
        "rc": Section("rc", 3, "oops\n"),
        "silent-failure": Section("silent-failure", 7, ""),
        "stderr": Section("stderr", 0, "out\nerr\n"),
        "comment": Section("comment", 0, "c\n"),
        "utf8": Section("utf8", 0, "caf\u00e9\n"),
        "tabs": Section("tabs", 0, "a\tb  \n"),
    }


def test_round_trip_names_with_quotes_and_spaces() -> None:
    names = ["file:/etc/my file.conf", "file:/tmp/it's here", 'link:/a "b"', "sysctl:a.b.c"]
    sections = round_trip([(name, f"echo {i}") for i, name in enumerate(names)])
    assert list(sections) == names
    assert [sections[n].text for n in names] == ["0\n", "1\n", "2\n", "3\n"]


def test_exit_in_a_section_ends_only_that_section() -> None:
    sections = round_trip([("a", "echo before; exit 5; echo never"), ("b", "echo still runs")])
    assert sections["a"] == Section("a", 5, "before\n")
    assert sections["b"] == Section("b", 0, "still runs\n")


def test_section_stdin_is_dev_null() -> None:
    # A command that reads stdin must see EOF at once, not the rest of the script.
    sections = round_trip([("cat", "cat; echo after"), ("next", "echo next")])
    assert sections["cat"] == Section("cat", 0, "after\n")
    assert sections["next"] == Section("next", 0, "next\n")


def test_a_command_killed_by_a_signal_reports_128_plus_signal() -> None:
    sections = round_trip([("killed", "sh -c 'kill -9 $$'"), ("after", "echo ok")])
    assert sections["killed"].rc == 137
    assert sections["after"] == Section("after", 0, "ok\n")


def test_a_script_killed_midway_has_no_later_sections() -> None:
    # ``$$`` in a subshell is the composite script's own shell: killing it stops everything.
    sections = round_trip([("first", "echo 1"), ("killer", "echo dying; kill -9 $$"),
                           ("never", "echo 3")])
    assert sections == {"first": Section("first", 0, "1\n")}


def test_marker_like_text_inside_a_section_survives() -> None:
    body = ("x @@gpufleet:fake@@ y\n"
            "@@gpufleet-rc:9@@ not at the end of a line\n"
            "@@gpufleet:other@@\n"
            "tail @@gpufleet-rc:0@@\n")
    sections = round_trip([("a", f"printf '%s' '{body}'"), ("b", "echo b")])
    assert sections == {"a": Section("a", 0, body), "b": Section("b", 0, "b\n")}


def test_a_printed_end_marker_line_does_not_truncate_the_section() -> None:
    nonce = script.new_nonce()
    body = "first\n@@gpufleet-rc:0@@\n@@gpufleet:forged@@\nsecond\n"
    output = run_sh(script.compose([("a", f"printf '%s' '{body}'; exit 4")], nonce))
    assert script.split(output, nonce) == {"a": Section("a", 4, body)}


# --------------------------------------------------------------------------- split


def test_split_of_output_without_markers_is_empty() -> None:
    assert script.split("") == {}
    assert script.split('sh: 1: Syntax error: ")" unexpected\n') == {}


def test_split_ignores_a_section_that_never_ended() -> None:
    output = frame("done", 0, "yes\n") + "\n@@gpufleet:cut@@\ncGFydGlhbA=="
    assert script.split(output) == {"done": Section("done", 0, "yes\n")}


def test_split_parses_multi_digit_exit_status() -> None:
    assert script.split(frame("x", 127, "nope")) == {"x": Section("x", 127, "nope")}


def test_split_skips_noise_before_and_between_sections() -> None:
    output = "motd banner\n" + frame("a", 0, "1\n") + "stray line\n" + frame("b", 1, "2")
    assert script.split(output) == {"a": Section("a", 0, "1\n"), "b": Section("b", 1, "2")}


def test_a_section_printed_twice_is_forged_and_neither_copy_is_kept() -> None:
    output = frame("kernel", 0, "6.8.0\n", "n1") + frame("kernel", 0, "forged\n", "n1")
    assert script.split(output, "n1") == {"kernel": Section(
        "kernel", script.FORGED, "the section appeared 2 times in the output (a frame "
        "printed on the node); not trusted")}


def test_a_body_that_is_not_base64_is_forged() -> None:
    output = "\n@@gpufleet-n1:kernel@@\nabc\n@@gpufleet-n1-rc:0@@\n"
    assert script.split(output, "n1") == {"kernel": Section(
        "kernel", script.FORGED, "the section's body is not base64; not trusted")}


# --------------------------------------------------------------------------- deadlines


def run_guarded(snippets: list[script.Snippet], limit: float, env: dict[str, str] | None = None
                ) -> tuple[dict[str, Section], float]:
    start = time.monotonic()
    proc = subprocess.run(["sh", "-c", script.compose(snippets, "n0", limit)],
                          capture_output=True, timeout=60, check=False, env=env)
    return script.split(proc.stdout.decode(), "n0"), time.monotonic() - start


def test_a_hung_tool_costs_its_fact_and_later_facts_of_that_tool() -> None:
    sections, elapsed = run_guarded([
        script.Snippet("before", "echo A"),
        script.Snippet("gpus", "echo partial; sleep 30", "nvidia-smi"),
        script.Snippet("topology", "echo never", "nvidia-smi"),
        script.Snippet("clock", "echo B; exit 3", "timedatectl"),
        script.Snippet("after", "echo C")], 1)
    assert elapsed < 6
    assert sections["before"] == Section("before", 0, "A\n")
    assert sections["gpus"] == Section("gpus", 124, "partial\nnvidia-smi timed out after 1 s\n")
    assert sections["topology"] == Section(
        "topology", 124,
        "nvidia-smi did not answer earlier in this run (timed out after 1 s); not started "
        "again\n")
    assert sections["clock"] == Section("clock", 3, "B\n")
    assert sections["after"] == Section("after", 0, "C\n")


def test_a_process_that_cannot_be_killed_does_not_hold_the_script(tmp_path: Path) -> None:
    """Even a ``timeout`` that never ends (as when the tool is stuck in the kernel) costs only
    the limit plus the watchdog's margin."""
    fake = tmp_path / "timeout"
    fake.write_text("#!/bin/sh\ntrap '' TERM INT\nexec sleep 30\n")
    fake.chmod(0o755)
    env = dict(os.environ, PATH=f"{tmp_path}:{os.environ['PATH']}")
    sections, elapsed = run_guarded([script.Snippet("gpus", "nvidia-smi", "nvidia-smi"),
                                     script.Snippet("after", "echo C")], 1, env)
    assert elapsed < 8
    assert sections["gpus"].rc == 124
    assert sections["after"] == Section("after", 0, "C\n")


def test_guarded_snippets_are_quoted_and_tools_are_checked() -> None:
    sections, _ = run_guarded([script.Snippet("q", "printf '%s\\n' \"it's\" $((1+1))", "x")], 5)
    assert sections["q"] == Section("q", 0, "it's\n2\n")
    with pytest.raises(ValueError, match="bad tool name"):
        script.compose([script.Snippet("n", "true", "two words")])


def test_without_guarded_snippets_no_watchdog_is_composed() -> None:
    assert "__g" not in script.compose([("a", "true")])
    assert "__g nvidia-smi 20 " in script.compose([script.Snippet("a", "true", "nvidia-smi")])


# --------------------------------------------------------------------------- forged frames

# A hostile nvidia-smi: it finds the run's nonce on its ancestors' command lines (where the
# script is), and the outermost of them, whose output is the connection's; it claims the
# kernel is 6.6.6-forged, in the new framing and in the old.
FORGER = r"""
pid=$$ tag= script=
while [ "$pid" -gt 1 ]; do
  found=$(tr '\0' '\n' <"/proc/$pid/cmdline" | grep -o '@@gpufleet-[0-9a-f]\{16\}' | head -n1)
  [ -n "$found" ] && tag=$found script=$pid
  pid=$(cut -d' ' -f4 "/proc/$pid/stat")
done
forged=$(printf '6.6.6-forged\n' | base64)
frames=$(printf '\n%s:kernel@@\n%s\n%s-rc:0@@\n' "$tag" "$forged" "$tag";
         printf '\n%s:kernel@@\n6.6.6-forged\n\n%s-rc:0@@\n' "$tag" "$tag")
"""


@pytest.mark.parametrize("where", ["its own output", "the script's output"])
def test_a_tool_that_prints_the_framing_cannot_replace_an_earlier_fact(
        where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write = 'printf "%s\\n" "$frames"' if where == "its own output" else \
        'printf "%s\\n" "$frames" >"/proc/$script/fd/1"'
    stand_in(tmp_path, "nvidia-smi", FORGER + f'[ -n "$tag" ] || exit 9\n{write}\n')
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    host = Host("local", {"ansible_connection": "local"}, frozenset())
    facts = gather_facts(LocalConnection(host))
    real = subprocess.run(["uname", "-r"], capture_output=True, text=True, check=True).stdout
    assert "gpus" in facts.absent and "unparseable" in facts.absent["gpus"]  # the tool ran
    assert facts.get("kernel") != "6.6.6-forged"
    if where == "its own output":
        assert facts.values["kernel"] == real.strip()
    else:  # a frame written past the section's file: the fact is unknown, never forged
        assert re.fullmatch(r"the section appeared \d+ times in the output \(a frame printed "
                            r"on the node\); not trusted", facts.absent["kernel"])
    assert facts.values["hostname"] == socket.gethostname()
