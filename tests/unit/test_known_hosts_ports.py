"""Host keys of a node on a port other than 22, as OpenSSH's own tools record them.

A throwaway sshd listens on 127.0.0.1 at a free port. Its known_hosts lines are written by
``ssh-keyscan -p PORT``, by ``ssh`` itself (HashKnownHosts no and yes) and hashed by
``ssh-keygen -H``; then the node is "reinstalled" (sshd restarted on the same port with a
new host key). gpufleet's verdict on each file is checked against its own SSH connection
to that sshd, and against ssh's verdict on the same file.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import paramiko
import pytest

from gpufleet.connect.connection import ConnectOptions
from gpufleet.connect.hostkeys import HostKeyError, fingerprint, lookup
from gpufleet.connect.ssh import SSHConnection
from gpufleet.inventory.load import load_inventory

TOOLS = ("sshd", "ssh", "ssh-keyscan", "ssh-keygen", "unshare")
pytestmark = [
    pytest.mark.skipif(any(shutil.which(t) is None and not Path(f"/usr/sbin/{t}").exists()
                           for t in TOOLS),
                       reason=f"needs OpenSSH's {', '.join(TOOLS[:4])} and unshare"),
    pytest.mark.skipif(os.geteuid() != 0,
                       reason="sshd needs root for its privilege separation directory"),
]

# The ways OpenSSH's tools write a known_hosts line for a host on another port (and
# "ssh-alias": ssh with HostKeyAlias, the key under the bare address).
WRITERS = ("ssh-keyscan", "ssh", "ssh-hashed", "ssh-keygen-H")


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)


def _keygen(path: Path) -> Path:
    _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "", "-f", str(path)])
    return path


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    assert port != 22
    return port


@dataclass
class Node:
    """The throwaway sshd and the known_hosts lines the tools wrote for its two keys."""

    dir: Path
    port: int
    client_key: Path
    lines: dict[str, dict[str, str]]  # "old"/"new" -> writer -> line
    proc: subprocess.Popen[bytes] | None = None

    @property
    def name(self) -> str:
        return f"[127.0.0.1]:{self.port}"

    def start(self, host_key: Path) -> None:
        config = self.dir / "sshd_config"
        config.write_text(f"ListenAddress 127.0.0.1\nPort {self.port}\nHostKey {host_key}\n"
                          "PidFile none\nUsePAM no\nStrictModes no\n"
                          f"AuthorizedKeysFile {self.client_key}.pub\n"
                          "PermitRootLogin prohibit-password\n")
        sshd = shutil.which("sshd") or "/usr/sbin/sshd"
        # A private /run: sshd wants /run/sshd, and the machine's own is left alone.
        self.proc = subprocess.Popen(
            ["unshare", "--mount", "sh", "-c", 'mount -t tmpfs tmpfs /run && mkdir /run/sshd '
             '&& exec "$0" -D -e -f "$1"', sshd, str(config)],
            stdout=subprocess.DEVNULL, stderr=(self.dir / "sshd.log").open("ab"))
        deadline = time.monotonic() + 10
        while True:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"sshd did not start: {(self.dir / 'sshd.log').read_text()}")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
            self.proc = None

    def ssh(self, known: Path, *options: str) -> subprocess.CompletedProcess[str]:
        """``ssh`` to the node with only ``known`` as its known_hosts."""
        return _run(["ssh", "-F", "/dev/null", "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
                     "-o", f"UserKnownHostsFile={known}", "-o", "GlobalKnownHostsFile=/dev/null",
                     "-i", str(self.client_key), "-p", str(self.port), *options,
                     "root@127.0.0.1", "echo", "ok"])

    def record(self, label: str) -> dict[str, str]:
        """The line each tool writes for the key the node presents now."""
        written: dict[str, str] = {}
        scan = _run(["ssh-keyscan", "-t", "ed25519", "-p", str(self.port), "127.0.0.1"])
        written["ssh-keyscan"] = scan.stdout
        for writer, hashing in (("ssh", "no"), ("ssh-hashed", "yes")):
            known = self.dir / f"{label}-{writer}"
            self.ssh(known, "-o", "StrictHostKeyChecking=accept-new",
                     "-o", f"HashKnownHosts={hashing}")
            written[writer] = known.read_text()
        alias = self.dir / f"{label}-alias"  # the key under the bare address, as for port 22
        self.ssh(alias, "-o", "StrictHostKeyChecking=accept-new", "-o", "HashKnownHosts=no",
                 "-o", "HostKeyAlias=127.0.0.1")
        written["ssh-alias"] = alias.read_text()
        hashed = self.dir / f"{label}-keygen"
        hashed.write_text(scan.stdout)
        _run(["ssh-keygen", "-H", "-f", str(hashed)])
        written["ssh-keygen-H"] = hashed.read_text()
        for writer, line in written.items():
            assert line.count("\n") == 1 and " ssh-ed25519 " in line, (writer, line)
        return written


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    directory = tmp_path_factory.mktemp("sshd")
    node = Node(directory, _free_port(), _keygen(directory / "client"), {})
    old, new = _keygen(directory / "host_old"), _keygen(directory / "host_new")
    try:
        node.start(old)
        node.lines["old"] = node.record("old")
        node.stop()
        node.start(new)  # the node was reinstalled: same address and port, a new key
        node.lines["new"] = node.record("new")
        yield node
    finally:
        node.stop()


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No ~/.ssh/known_hosts of the machine's own takes part."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


def gpufleet_run(node: Node, known: Path, accept_new: bool = False) -> str:
    """``echo ok`` over gpufleet's SSH connection, ``known`` pinned as its known_hosts."""
    inventory = known.parent / "hosts.ini"
    inventory.write_text(f"node ansible_host=127.0.0.1 ansible_port={node.port} "
                         f"ansible_user=root ansible_ssh_private_key_file={node.client_key} "
                         f"gpufleet_known_hosts={known}\n")
    host = load_inventory(inventory).hosts["node"]
    conn = SSHConnection(host, ConnectOptions(accept_new_host_keys=accept_new,
                                              known_hosts_base=known.parent))
    try:
        return conn.run("echo ok", timeout=30).stdout
    finally:
        conn.close()


def new_key(node: Node) -> paramiko.PKey:
    return paramiko.PKey.from_path(node.dir / "host_new")


@pytest.mark.parametrize("writer", WRITERS)
def test_a_key_recorded_for_another_port_is_found(node: Node, writer: str,
                                                  tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    known.write_text(node.lines["new"][writer])
    assert node.ssh(known, "-o", "StrictHostKeyChecking=yes").stdout == "ok\n"
    assert [e.blob for e in lookup(node.name, [known]).keys] == [new_key(node).asbytes()]
    assert gpufleet_run(node, known) == "ok\n"


@pytest.mark.parametrize("writer", WRITERS)
def test_a_changed_key_on_another_port_is_refused_even_with_accept_new(
        node: Node, writer: str, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    known.write_text(node.lines["old"][writer])
    refused = node.ssh(known, "-o", "StrictHostKeyChecking=accept-new")
    assert refused.returncode == 255 and "HOST IDENTIFICATION HAS CHANGED" in refused.stderr
    with pytest.raises(HostKeyError) as caught:
        gpufleet_run(node, known, accept_new=True)
    old = paramiko.PKey.from_path(node.dir / "host_old")
    assert str(caught.value) == (
        f"HOST KEY CHANGED for {node.name}: known_hosts ({known}) has {fingerprint(old)}, the "
        f"host presented {fingerprint(new_key(node))}; refusing to connect (if the node was "
        "reinstalled, remove its old line)")
    assert known.read_text() == node.lines["old"][writer]


@pytest.mark.parametrize("writer", ["ssh-keyscan", "ssh-hashed"])
def test_a_revoked_bracketed_key_is_refused_even_with_accept_new(
        node: Node, writer: str, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    recorded = node.lines["new"][writer]
    known.write_text("@revoked " + recorded + recorded)
    assert node.ssh(known, "-o", "StrictHostKeyChecking=accept-new").returncode == 255
    with pytest.raises(HostKeyError, match=rf"is revoked \(@revoked at {known}:1\)"):
        gpufleet_run(node, known, accept_new=True)
    assert known.read_text() == "@revoked " + recorded + recorded


def test_a_negated_pattern_vetoes_the_line(node: Node, tmp_path: Path) -> None:
    name, rest = node.lines["new"]["ssh-keyscan"].split(" ", 1)
    wildcard = name.replace("127.0.0.1", "127.0.0.?")
    allowed, vetoed = tmp_path / "allowed", tmp_path / "vetoed"
    allowed.write_text(f"{wildcard} {rest}")
    # Both names vetoed: ssh looks up the bare address too when [address]:port is unknown.
    vetoed.write_text(f"*,!{name},!127.0.0.1 {rest}")
    assert node.ssh(allowed, "-o", "StrictHostKeyChecking=yes").stdout == "ok\n"
    assert gpufleet_run(node, allowed) == "ok\n"
    assert node.ssh(vetoed, "-o", "StrictHostKeyChecking=yes").returncode == 255
    assert lookup(node.name, [vetoed]).keys == []
    with pytest.raises(HostKeyError, match=r"is not in known_hosts"):
        gpufleet_run(node, vetoed)


def test_a_bare_address_line_vouches_for_another_port_only_with_the_same_key(
        node: Node, tmp_path: Path) -> None:
    same, other = tmp_path / "same", tmp_path / "other"
    same.write_text(node.lines["new"]["ssh-alias"])
    other.write_text(node.lines["old"]["ssh-alias"])
    assert same.read_text().startswith("127.0.0.1 ssh-ed25519 ")
    # The same key under the bare address: ssh accepts it ("found matching key w/out port").
    assert node.ssh(same, "-o", "StrictHostKeyChecking=yes").stdout == "ok\n"
    assert gpufleet_run(node, same) == "ok\n"
    assert same.read_text() == node.lines["new"]["ssh-alias"]
    # Another key there is no verdict on port PORT: the host is new, not changed.
    assert node.ssh(other, "-o", "StrictHostKeyChecking=yes").returncode == 255
    with pytest.raises(HostKeyError, match=r"is not in known_hosts"):
        gpufleet_run(node, other)
    by_ssh = tmp_path / "by_ssh"
    by_ssh.write_text(other.read_text())
    assert node.ssh(by_ssh, "-o", "StrictHostKeyChecking=accept-new",
                    "-o", "HashKnownHosts=no").stdout == "ok\n"
    assert gpufleet_run(node, other, accept_new=True) == "ok\n"
    # Recorded under the name ssh records and looks up, and found again.
    assert other.read_text() == by_ssh.read_text() == (node.lines["old"]["ssh-alias"]
                                                       + node.lines["new"]["ssh-keyscan"])
    assert gpufleet_run(node, other) == "ok\n"
