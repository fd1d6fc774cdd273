"""Managed files and links: changes, diffs, redaction, and link commands run for real."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import jinja2
import pytest

from gpufleet.facts.formats import FileState
from gpufleet.facts.gather import FactMissing, Facts
from gpufleet.provision.managed import (
    HEADER,
    file_change,
    link_change,
    redact,
    render,
    unified_diff,
)
from gpufleet.provision.plan import Put, Run

# --------------------------------------------------------------------------- redact


@pytest.mark.parametrize(("line", "expected"), [
    ("password=hunter2", "password=********"),
    ("DB_PASSWORD = s3cr3t", "DB_PASSWORD = ********"),
    ("passwd: x", "passwd: ********"),
    ("api_key: abc123", "api_key: ********"),
    ("API-KEY=abc123", "API-KEY=********"),
    ("apikey=abc123", "apikey=********"),
    ("  token: abc", "  token: ********"),
    ("export HF_TOKEN=hf_abcdef", "export HF_TOKEN=********"),
    ("client_secret: a:b=c", "client_secret: ********"),
    ("aws_credential_file=/root/.aws/x", "aws_credential_file=********"),
    ("Secret=Value", "Secret=********"),
])
def test_redact_hides_values_of_secret_keys(line: str, expected: str) -> None:
    assert redact(line) == expected


@pytest.mark.parametrize("line", [
    "NCCL_SOCKET_IFNAME=eth0",
    "user: alice",
    "comment: rotate the password=weekly",
    "password",
    "token=",
    "# no secrets here",
])
def test_redact_leaves_other_lines_alone(line: str) -> None:
    assert redact(line) == line


def test_redact_works_line_by_line() -> None:
    text = "a=1\npassword=x\nb: 2\ntoken: y\n"
    assert redact(text) == "a=1\npassword=********\nb: 2\ntoken: ********\n"


# --------------------------------------------------------------------------- unified_diff


def test_unified_diff_headers_and_hunk() -> None:
    assert unified_diff("/etc/nccl.conf", "A=1\nB=2\n", "A=1\nB=3\n") == (
        "--- /etc/nccl.conf (on host)\n"
        "+++ /etc/nccl.conf (desired)\n"
        "@@ -1,2 +1,2 @@\n"
        " A=1\n"
        "-B=2\n"
        "+B=3\n")


def test_unified_diff_ends_every_line_even_without_trailing_newline() -> None:
    assert unified_diff("/x", "A=1", "A=2") == (
        "--- /x (on host)\n+++ /x (desired)\n@@ -1 +1 @@\n-A=1\n+A=2\n")


def test_unified_diff_redacts_both_sides() -> None:
    diff = unified_diff("/etc/default/x", "A=1\nNCCL_TOKEN=old\n", "A=2\nNCCL_TOKEN=new\n")
    assert diff == ("--- /etc/default/x (on host)\n+++ /etc/default/x (desired)\n"
                    "@@ -1,2 +1,2 @@\n-A=1\n+A=2\n NCCL_TOKEN=********\n")
    assert unified_diff("/x", "password=old\n", "password=new\n") == ""


def test_unified_diff_of_equal_text_is_empty() -> None:
    assert unified_diff("/x", "same\n", "same\n") == ""


# --------------------------------------------------------------------------- file_change


def facts_with(path: str, state: FileState) -> Facts:
    return Facts("h", values={f"file:{path}": state})


PATH = "/etc/nccl.conf"
CONTENT = "A=1\nB=2\n"


def test_file_change_create() -> None:
    change = file_change("nccl_env", facts_with(PATH, FileState(PATH, False)), PATH, CONTENT,
                         mode=0o600, owner="root:adm")
    assert change is not None
    assert (change.item, change.action, change.before, change.after) == \
        ("nccl_env/file /etc/nccl.conf", "create", "absent", "8 bytes")
    assert change.diff == ("--- /etc/nccl.conf (on host)\n+++ /etc/nccl.conf (desired)\n"
                           "@@ -0,0 +1,2 @@\n+A=1\n+B=2\n")
    [step] = change.steps
    assert isinstance(step, Put)
    assert (step.path, step.content, step.mode, step.owner) == \
        (PATH, b"A=1\nB=2\n", 0o600, "root:adm")
    assert not change.pending_reboot


def test_file_change_update_counts_bytes_and_diffs() -> None:
    state = FileState(PATH, True, b"A=1\n", "644", "root:root")
    change = file_change("nccl_env", facts_with(PATH, state), PATH, CONTENT)
    assert change is not None
    assert (change.action, change.before, change.after) == \
        ("update", "4 bytes (differs)", "8 bytes")
    assert change.diff == ("--- /etc/nccl.conf (on host)\n+++ /etc/nccl.conf (desired)\n"
                           "@@ -1 +1,2 @@\n A=1\n+B=2\n")
    assert isinstance(change.steps[0], Put)


def test_file_change_counts_encoded_bytes_not_characters() -> None:
    change = file_change("r", facts_with(PATH, FileState(PATH, False)), PATH, "caf\u00e9\n")
    assert change is not None
    assert change.after == "6 bytes"
    assert change.steps[0].content == "caf\u00e9\n".encode()  # type: ignore[attr-defined]


@pytest.mark.parametrize(("mode", "owner"), [("644", "root:root"), ("600", "nobody:root")])
def test_file_change_set_mode_when_only_mode_or_owner_differ(mode: str, owner: str) -> None:
    state = FileState(PATH, True, CONTENT.encode(), mode, owner)
    change = file_change("firewall", facts_with(PATH, state), PATH, CONTENT, mode=0o600)
    assert change is not None
    assert (change.action, change.before, change.after, change.diff) == \
        ("set mode", f"{mode} {owner}", "600 root:root", None)
    assert [(s.path, s.mode) for s in change.steps] == [(PATH, 0o600)]  # type: ignore[attr-defined]


def test_file_change_none_when_content_mode_and_owner_match() -> None:
    state = FileState(PATH, True, CONTENT.encode(), "644", "root:root")
    assert file_change("r", facts_with(PATH, state), PATH, CONTENT) is None
    state = FileState(PATH, True, CONTENT.encode(), "4755", "root:root")
    assert file_change("r", facts_with(PATH, state), PATH, CONTENT, mode=0o4755) is None


def test_file_change_needs_the_file_fact() -> None:
    facts = Facts("h", absent={f"file:{PATH}": "permission denied"})
    with pytest.raises(FactMissing, match="permission denied"):
        file_change("r", facts, PATH, CONTENT)


# --------------------------------------------------------------------------- link_change


def link_facts(path: str, target: str | None) -> Facts:
    return Facts("h", values={f"link:{path}": target})


def test_link_change_none_when_target_matches() -> None:
    assert link_change("cuda", link_facts("/usr/local/cuda", "/usr/local/cuda-12.4"),
                       "/usr/local/cuda", "/usr/local/cuda-12.4") is None


@pytest.mark.parametrize(("current", "before"), [
    (None, "absent"), ("", "not a link"), ("/usr/local/cuda-12.6", "/usr/local/cuda-12.6")])
def test_link_change_before_values(current: str | None, before: str) -> None:
    change = link_change("cuda", link_facts("/usr/local/cuda", current), "/usr/local/cuda",
                         "/usr/local/cuda-12.4")
    assert change is not None
    assert (change.item, change.action, change.before, change.after) == \
        ("cuda/link /usr/local/cuda", "link", before, "/usr/local/cuda-12.4")
    [step] = change.steps
    assert isinstance(step, Run)
    assert step.command == ("mkdir -p /usr/local && ln -sfn /usr/local/cuda-12.4 "
                            "/usr/local/cuda.gpufleet-tmp && mv -Tf /usr/local/cuda.gpufleet-tmp "
                            "/usr/local/cuda")
    assert step.describe() == "point /usr/local/cuda at /usr/local/cuda-12.4"


def test_link_change_quotes_paths() -> None:
    path, target = "/opt/my dir/cuda link", "/opt/it's/cuda 12"
    change = link_change("cuda", link_facts(path, None), path, target)
    assert change is not None
    assert change.steps[0].command == (  # type: ignore[attr-defined]
        "mkdir -p '/opt/my dir' && ln -sfn '/opt/it'\"'\"'s/cuda 12' "
        "'/opt/my dir/cuda link.gpufleet-tmp' && mv -Tf '/opt/my dir/cuda link.gpufleet-tmp' "
        "'/opt/my dir/cuda link'")


def test_link_change_at_the_root_uses_slash_as_parent() -> None:
    change = link_change("r", link_facts("/cuda", None), "/cuda", "/opt/cuda")
    assert change is not None
    assert change.steps[0].command.startswith("mkdir -p / && ")  # type: ignore[attr-defined]


def test_link_change_command_creates_and_replaces_links_with_awkward_names(
        tmp_path: Path) -> None:
    path = tmp_path / "new dir" / "cuda link"
    for target in ("/opt/it's/cuda 12.4", "../$HOME `x` cuda-12.6"):
        change = link_change("cuda", link_facts(str(path), None), str(path), target)
        assert change is not None
        command = change.steps[0].command  # type: ignore[attr-defined]
        subprocess.run(["sh", "-c", command], check=True, timeout=10)
        assert os.readlink(path) == target
    assert sorted(p.name for p in path.parent.iterdir()) == ["cuda link"]


# --------------------------------------------------------------------------- render


def test_render_is_strict_about_undefined_values() -> None:
    with pytest.raises(jinja2.UndefinedError):
        render("nccl.conf.j2", settings={})


def test_render_nccl_conf_exact() -> None:
    header = HEADER.format(role="nccl_env")
    assert render("nccl.conf.j2", header=header, settings={"NCCL_DEBUG": "WARN",
                                                           "NCCL_IB_HCA": "mlx5_0:1"}) == (
        "# Managed by gpufleet (role nccl_env); local edits are reported as drift and "
        "replaced.\nNCCL_DEBUG=WARN\nNCCL_IB_HCA=mlx5_0:1\n")
