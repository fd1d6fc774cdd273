"""Hostile input against real lab nodes: a node whose output carries rich markup, ANSI
escapes and NUL bytes; known_hosts files with @revoked and @cert-authority lines, pinned and
personal files that disagree, ``UserKnownHostsFile=/dev/null`` and a symlinked known_hosts;
an inventory whose connection settings are templates.

The tests share one small lab of their own (three nodes), separate from the session lab.
"""

from __future__ import annotations

import base64
import io
import json
import os
import stat
import threading
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paramiko
import pytest
import yaml

from gpufleet import app
from gpufleet.app import DriftOutputs
from gpufleet.connect.connection import ConnectOptions
from gpufleet.connect.hostkeys import HostKeyError, fingerprint
from gpufleet.connect.ssh import SSHConnection
from gpufleet.errors import GpufleetError
from gpufleet.inventory.load import load_inventory
from gpufleet.inventory.model import Host
from gpufleet.lab.cluster import Lab
from gpufleet.provision.plan import ApplyContext, ApplyOptions
from gpufleet.roles import pytorch
from tests.lab.conftest import lab_config_for, node_sh
from tests.unit.test_facts_script import FORGER


@pytest.fixture(scope="module")
def small_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    if os.geteuid() != 0:
        pytest.skip("lab tests need root: they create network namespaces and mounts")
    lab = Lab(lab_config_for("hs", 5, tmp_path_factory.mktemp("hostile") / "lab"))
    lab.down()
    lab.up(3)
    yield lab
    lab.down()


def node_key(lab: Lab, name: str) -> paramiko.PKey:
    kind, blob = lab.node(name).host_key_pub.read_text().split()[:2]
    return paramiko.PKey.from_type_string(kind, base64.b64decode(blob))


def known_line(lab: Lab, name: str, marker: str = "", names: str | None = None) -> str:
    kind, blob = lab.node(name).host_key_pub.read_text().split()[:2]
    prefix = f"{marker} " if marker else ""
    return f"{prefix}{names or lab.node(name).address} {kind} {blob}\n"


def lab_host(lab: Lab, name: str, **extra: Any) -> Host:
    host = load_inventory(lab.config.inventory_dir).hosts[name]
    return Host(host.name, {**dict(host.vars), **extra}, host.groups)


def connect(host: Host, base: Path, **options: Any) -> SSHConnection:
    conn = SSHConnection(host, ConnectOptions(known_hosts_base=base, **options))
    conn.connect()
    return conn


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty home directory: ~/.ssh/known_hosts is this test's own."""
    (tmp_path / "home" / ".ssh").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return tmp_path / "home"


# Reports ------------------------------------------------------------------------------------


def put_file(lab: Lab, node: str, path: str, text: str, mode: str = "0644") -> None:
    encoded = base64.b64encode(text.encode()).decode()
    node_sh(lab, node, f"mkdir -p $(dirname {path}) && echo {encoded} | base64 -d > {path} "
            f"&& chmod {mode} {path}")


def test_a_hostile_node_cannot_break_facts(small_lab: Lab, tmp_path: Path) -> None:
    release = node_sh(small_lab, "node02", "cat /etc/os-release")
    hostile_release = "".join(
        'PRETTY_NAME="\x1b[2J[/x]OS"\n' if line.startswith("PRETTY_NAME=") else line + "\n"
        for line in release.splitlines())
    put_file(small_lab, "node02", "/usr/local/bin/nvidia-smi",
             "#!/bin/sh\nprintf '[/x] [bold]b[/bold] \\033[31mred\\033[0m \\000nul\\n'\n"
             "exit 9\n", "0755")
    put_file(small_lab, "node02", "/etc/os-release", hostile_release)
    try:
        report = tmp_path / "facts.json"
        out = io.StringIO()
        code = app.facts(str(small_lab.config.inventory_dir), json_path=str(report), out=out)
        text = out.getvalue()
    finally:
        node_sh(small_lab, "node02", "rm -f /usr/local/bin/nvidia-smi")
        put_file(small_lab, "node02", "/etc/os-release", release)
    assert code == 0
    document = json.loads(report.read_text())
    node02 = document["hosts"]["node02"]
    assert node02["absent"]["gpus"].startswith("[/x] [bold]b[/bold] \x1b[31mred\x1b[0m ")
    assert node02["summary"]["os"] == "\x1b[2J[/x]OS"
    assert "\x1b" not in text and "\x00" not in text
    assert "node02: unknown gpus" in text
    assert "[/x] [bold]b[/bold] \\x1b[31mred\\x1b[0m " in text
    assert "\\x1b[2J[/x]OS" in text
    assert document["hosts"]["node01"]["status"] == "ok"


@pytest.mark.parametrize("where", ["its own output", "the session's output"])
def test_an_nvidia_smi_printing_the_framing_cannot_forge_the_kernel_fact(
        small_lab: Lab, tmp_path: Path, where: str) -> None:
    """Over SSH the script is on the node's process list, nonce and all; the stand-in reads
    it and prints a kernel section of its own, to its output or into the session's."""
    kernel = node_sh(small_lab, "node02", "uname -r").strip()
    write = 'printf "%s\\n" "$frames"' + ("" if where == "its own output" else
                                          ' >"/proc/$script/fd/1"')
    put_file(small_lab, "node02", "/usr/local/bin/nvidia-smi",
             f"#!/bin/sh\n{FORGER}[ -n \"$tag\" ] || exit 9\n{write}\n", "0755")
    try:
        report = tmp_path / "facts.json"
        code = app.facts(str(small_lab.config.inventory_dir), limit="node02",
                         json_path=str(report), out=io.StringIO())
    finally:
        node_sh(small_lab, "node02", "rm -f /usr/local/bin/nvidia-smi")
    assert code == 0
    node02 = json.loads(report.read_text())["hosts"]["node02"]
    assert node02["absent"]["gpus"].startswith("unparseable output")  # the stand-in ran
    if where == "its own output":
        assert node02["facts"]["kernel"] == kernel
    else:
        assert "kernel" not in node02["facts"]
        assert node02["absent"]["kernel"].endswith("(a frame printed on the node); not trusted")
    assert node02["facts"]["hostname"] == "node02"


def test_a_hostile_inventory_key_is_refused_escaped_before_any_host_is_contacted(
        small_lab: Lab, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inventory = tmp_path / "inventory"
    inventory.mkdir()
    hosts = yaml.safe_load((small_lab.config.inventory_dir / "hosts.yml").read_text())
    hosts["all"]["children"]["lab"]["hosts"]["node01"]["nccl_env"] = {
        "BAD\x1b[31m\x00;KEY": "1"}
    (inventory / "hosts.yml").write_text(yaml.safe_dump(hosts))
    junit = tmp_path / "drift.xml"
    code = app.drift_cmd(str(inventory), outputs=DriftOutputs(
        junit_path=str(junit), report_dir=str(tmp_path / "history")), out=io.StringIO())
    err = capsys.readouterr().err
    assert code == 2
    assert "BAD\\x1b[31m\\x00;KEY" in err and "\x1b" not in err and "\x00" not in err
    assert not junit.exists()  # nothing half-written


def test_drift_junit_is_valid_xml_with_hostile_values(small_lab: Lab, tmp_path: Path) -> None:
    # Bytes a node controls (a managed file's content) reach the diff in JUnit and on the
    # terminal: XML stays valid and the terminal gets no control character.
    inventory = tmp_path / "inventory"
    inventory.mkdir()
    hosts = yaml.safe_load((small_lab.config.inventory_dir / "hosts.yml").read_text())
    hosts["all"]["children"]["lab"]["hosts"]["node01"]["nccl_env"] = {"NCCL_DEBUG": "WARN"}
    (inventory / "hosts.yml").write_text(yaml.safe_dump(hosts))
    node_sh(small_lab, "node01", r"printf 'NCCL_DEBUG=WARN\n\033[31mred\001\n' > /etc/nccl.conf")
    junit = tmp_path / "drift.xml"
    out = io.StringIO()
    try:
        code = app.drift_cmd(str(inventory), limit="node01",
                             outputs=DriftOutputs(junit_path=str(junit),
                                                  report_dir=str(tmp_path / "history")),
                             out=out)
    finally:
        node_sh(small_lab, "node01", "rm -f /etc/nccl.conf")
    assert code == 1
    raw = junit.read_bytes()
    assert b"\x1b" not in raw and b"\x01" not in raw
    root = ET.fromstring(raw)
    cases = [c for c in root.iter("testcase") if c.get("classname") == "drift.node01"
             and "/etc/nccl.conf" in (c.get("name") or "")]
    assert cases, [c.get("name") for c in root.iter("testcase")]
    details = "".join(cases[0].itertext())
    assert "red" in details
    assert "\x1b" not in out.getvalue() and "\x01" not in out.getvalue()


def test_templated_connection_settings_reach_the_node(small_lab: Lab, tmp_path: Path) -> None:
    node = small_lab.node("node03")
    prefix, index = node.address.rsplit(".", 1)
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {
        "vars": {"lab_prefix": prefix, "admin": "root",
                 "ansible_user": "{{ admin }}",
                 "ansible_ssh_private_key_file": str(small_lab.config.key),
                 "gpufleet_known_hosts": str(small_lab.config.known_hosts)},
        "hosts": {"t3": {"index": int(index),
                         "ansible_host": "{{ lab_prefix }}.{{ index }}"}}}}))
    host = load_inventory(inventory).hosts["t3"]
    conn = connect(host, tmp_path)
    try:
        assert conn.run("hostname").stdout.strip() == "node03"
    finally:
        conn.close()


# Host keys ----------------------------------------------------------------------------------


def test_a_revoked_key_is_refused_and_other_nodes_connect(small_lab: Lab, tmp_path: Path,
                                                          home: Path) -> None:
    pinned = tmp_path / "known_hosts"
    pinned.write_text(small_lab.config.known_hosts.read_text()
                      + known_line(small_lab, "node01", "@revoked", "*"))
    with pytest.raises(HostKeyError) as caught:
        connect(lab_host(small_lab, "node01", gpufleet_known_hosts=str(pinned)), tmp_path,
                accept_new_host_keys=True)
    key = node_key(small_lab, "node01")
    assert str(caught.value) == (
        f"host key of {small_lab.node('node01').address} (ssh-ed25519 {fingerprint(key)}) is "
        f"revoked (@revoked at {pinned}:4); refusing to connect")
    conn = connect(lab_host(small_lab, "node02", gpufleet_known_hosts=str(pinned)), tmp_path)
    conn.close()


def test_a_cert_authority_covers_one_node_only(small_lab: Lab, tmp_path: Path,
                                               home: Path) -> None:
    address = small_lab.node("node01").address
    pinned = tmp_path / "known_hosts"
    others = [line for line in small_lab.config.known_hosts.read_text().splitlines(True)
              if not line.startswith(address + " ")]
    pinned.write_text("".join(others) + known_line(small_lab, "node03", "@cert-authority",
                                                   address))
    before = pinned.read_text()
    with pytest.raises(HostKeyError) as caught:
        connect(lab_host(small_lab, "node01", gpufleet_known_hosts=str(pinned)), tmp_path,
                accept_new_host_keys=True)
    assert "is vouched for only by a @cert-authority line" in str(caught.value)
    assert f"({pinned}:3)" in str(caught.value)
    assert pinned.read_text() == before
    for name in ("node02", "node03"):
        connect(lab_host(small_lab, name, gpufleet_known_hosts=str(pinned)), tmp_path).close()


def test_the_pinned_file_wins_over_the_personal_one(small_lab: Lab, tmp_path: Path,
                                                    home: Path) -> None:
    address = small_lab.node("node01").address
    right = known_line(small_lab, "node01")
    wrong = known_line(small_lab, "node02", names=address)
    pinned = tmp_path / "pinned"
    personal = home / ".ssh" / "known_hosts"
    pinned.write_text(right)
    personal.write_text(wrong)
    connect(lab_host(small_lab, "node01", gpufleet_known_hosts=str(pinned)), tmp_path).close()
    pinned.write_text(wrong)
    personal.write_text(right)
    with pytest.raises(HostKeyError) as caught:
        connect(lab_host(small_lab, "node01", gpufleet_known_hosts=str(pinned)), tmp_path)
    assert str(caught.value).startswith(f"HOST KEY CHANGED for {address}: known_hosts "
                                        f"({pinned}) has ")


def test_user_known_hosts_dev_null_is_never_replaced(small_lab: Lab, tmp_path: Path,
                                                     home: Path) -> None:
    before = os.stat(os.devnull)
    host = lab_host(small_lab, "node01", gpufleet_known_hosts=None,
                    ansible_ssh_common_args="-o UserKnownHostsFile=/dev/null "
                                            "-o StrictHostKeyChecking=no")
    with pytest.raises(HostKeyError) as caught:
        connect(host, tmp_path, accept_new_host_keys=True)
    assert str(caught.value).startswith(
        f"cannot record the host key of {small_lab.node('node01').address} in /dev/null: it is "
        "/dev/null; set gpufleet_known_hosts")
    after = os.stat(os.devnull)
    assert stat.S_ISCHR(after.st_mode) and after.st_rdev == before.st_rdev
    assert not list((home / ".ssh").iterdir())


def test_new_keys_are_recorded_through_a_symlink(small_lab: Lab, tmp_path: Path,
                                                 home: Path) -> None:
    real = tmp_path / "state" / "known_hosts"
    link = tmp_path / "known_hosts"
    link.symlink_to(real)
    host = lab_host(small_lab, "node02", gpufleet_known_hosts=str(link))
    conn = connect(host, tmp_path, accept_new_host_keys=True)
    assert conn.accepted_fingerprint == fingerprint(node_key(small_lab, "node02"))
    conn.close()
    assert link.is_symlink() and real.read_text() == known_line(small_lab, "node02")
    connect(host, tmp_path).close()


# Secrets ------------------------------------------------------------------------------------


def test_package_source_credentials_stay_off_the_command_line(small_lab: Lab,
                                                              tmp_path: Path) -> None:
    """pip runs as a stand-in that records its argv, its /proc cmdline and its environment;
    the token reaches the environment only."""
    put_file(small_lab, "node01", "/opt/fake/bin/python", "\n".join([
        "#!/bin/sh",
        'if [ "$1" = "-c" ]; then exit 1; fi',
        "{ printf 'argv:%s\\n' \"$*\"; printf 'cmdline:'; tr '\\0' ' ' < /proc/$$/cmdline;",
        "  printf '\\nparent:'; tr '\\0' ' ' < /proc/$PPID/cmdline;",
        "  printf '\\nindex:%s\\nlinks:%s\\n' \"$PIP_INDEX_URL\" \"$PIP_FIND_LINKS\"; }"
        " > /tmp/pip-seen", ""]), "0755")
    token = "ci:s3cr3t-t0ken"
    step = pytorch.PipInstall("/opt/fake/bin/python", [
        "--index-url", f"https://{token}@pypi.example/simple",
        "--find-links", "file:///srv/gpufleet-wheels", "--no-index", "torch==2.13.0"],
        "2.13.0", None, None, 60.0)
    host = lab_host(small_lab, "node01")
    conn = connect(host, tmp_path)
    try:
        with pytest.raises(GpufleetError) as caught:
            step.apply(ApplyContext(conn, host, ApplyOptions(), lambda: conn,
                                    threading.Lock()))
        seen = node_sh(small_lab, "node01", "cat /tmp/pip-seen")
    finally:
        conn.close()
        node_sh(small_lab, "node01", "rm -rf /opt/fake /tmp/pip-seen")
    assert token not in str(caught.value)
    lines = dict(line.split(":", 1) for line in seen.splitlines())
    assert lines["index"] == f"https://{token}@pypi.example/simple"
    assert lines["links"] == "file:///srv/gpufleet-wheels"
    for key in ("argv", "cmdline", "parent"):
        assert token not in lines[key] and "gpufleet-wheels" not in lines[key], key
    assert lines["argv"] == ("-m pip install --no-input --disable-pip-version-check "
                             "--no-compile --no-index torch==2.13.0")
