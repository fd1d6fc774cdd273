"""The lab cluster itself: isolation, SSH with verified host keys, clean tear-down."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import paramiko
import pytest

from gpufleet.errors import GpufleetError
from gpufleet.inventory.load import load_inventory
from gpufleet.lab.cluster import Lab
from gpufleet.lab.model import LabConfig
from gpufleet.lab.repo import KEYRING
from tests.conftest import ROOT
from tests.lab.conftest import lab_config_for, node_sh


def _paramiko(lab: Lab, address: str, known_hosts: Path) -> paramiko.SSHClient:
    client = paramiko.SSHClient()
    client.load_host_keys(str(known_hosts))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    client.connect(address, username="root", key_filename=str(lab.config.key),
                   look_for_keys=False, allow_agent=False, timeout=10)
    return client


def test_every_node_answers_ssh_with_verified_host_key(lab: Lab) -> None:
    for status in lab.status():
        assert status.up and status.in_known_hosts
        client = _paramiko(lab, status.address, lab.config.known_hosts)
        _, out, _ = client.exec_command("hostname")
        assert out.read().decode().strip() == status.name
        client.close()


def test_unknown_host_key_is_refused(lab: Lab, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    with pytest.raises(paramiko.SSHException, match="not found in known_hosts"):
        _paramiko(lab, lab.node("node01").address, empty)


def test_nodes_have_private_copy_on_write_system_directories(lab: Lab) -> None:
    node_sh(lab, "node01", "echo only-here > /etc/gpufleet-lab-marker && "
            "mkdir -p /opt/gpufleet-marker && touch /usr/local/gpufleet-marker")
    try:
        assert node_sh(lab, "node01", "cat /etc/gpufleet-lab-marker").strip() == "only-here"
        for path in ("/etc/gpufleet-lab-marker", "/opt/gpufleet-marker",
                     "/usr/local/gpufleet-marker"):
            assert node_sh(lab, "node02", f"test -e {path} && echo yes || echo no").strip() == "no"
            assert not Path(path).exists(), f"{path} leaked to the controller"
        assert (lab.node("node01").dir / "upper/etc/gpufleet-lab-marker").exists()
    finally:
        node_sh(lab, "node01", "rm -rf /etc/gpufleet-lab-marker /opt/gpufleet-marker "
                "/usr/local/gpufleet-marker")


def test_nodes_have_their_own_hostname_address_and_proc_view(lab: Lab) -> None:
    out = node_sh(lab, "node03", "hostname; ip -4 -o addr show dev eth0; "
                  "cat /proc/sys/kernel/random/boot_id")
    hostname, addr_line, boot_id = out.strip().splitlines()
    assert hostname == "node03"
    assert lab.node("node03").address in addr_line
    assert boot_id != Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def test_nodes_reach_each_other_over_tcp(lab: Lab) -> None:
    target = lab.node("node13")
    listener = subprocess.Popen(
        lab.exec_argv("node13", "python3 -c \"import socket; s=socket.socket(); "
                      "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
                      f"s.bind(('{target.address}', 29555)); s.listen(); "
                      "c, a = s.accept(); c.sendall(a[0].encode()); c.close()\""),
        stdout=subprocess.PIPE, text=True)
    try:
        node_sh(lab, "node13", "for i in $(seq 300); do ss -ltn | grep -q ':29555 ' && exit 0; "
                "sleep 0.1; done; exit 1")
        connect = (f"import socket; s=socket.create_connection(('{target.address}', 29555), 5); "
                   "print(s.recv(64).decode())")
        out = node_sh(lab, "node12", f"python3 -c \"{connect}\"")
        assert out.strip() == lab.node("node12").address
    finally:
        listener.kill()
        listener.wait()


def test_nftables_rules_on_one_node_affect_only_that_node(lab: Lab) -> None:
    node_sh(lab, "node14", "nft add table inet gftest && nft 'add chain inet gftest out "
            "{ type filter hook output priority 0; }' && nft add rule inet gftest out "
            f"ip daddr {lab.config.controller_address} icmp type echo-request drop")
    try:
        ping = (f"ping -c1 -W1 {lab.config.controller_address} >/dev/null && echo ok || "
                "echo blocked")
        blocked = node_sh(lab, "node14", ping).strip()
        other = node_sh(lab, "node15", ping).strip()
        assert (blocked, other) == ("blocked", "ok")
        assert "gftest" not in subprocess.run(["nft", "list", "tables"], capture_output=True,
                                              text=True, check=True).stdout
    finally:
        node_sh(lab, "node14", "nft delete table inet gftest")


def test_apt_uses_the_lab_repository_and_installs_stay_on_one_node(lab: Lab) -> None:
    repo = load_inventory(lab.config.inventory_dir).hosts["node09"].vars["nvidia_repo_url"]
    node_sh(lab, "node09", f"cp {lab.config.repo / KEYRING} /usr/share/keyrings/lab.gpg && "
            f"echo 'deb [signed-by=/usr/share/keyrings/lab.gpg] {repo} /' "
            "> /etc/apt/sources.list.d/lab.list")
    node_sh(lab, "node09", "apt-get -qq update && DEBIAN_FRONTEND=noninteractive apt-get -qq -y "
            "install libnccl2=2.23.4-1+cuda12.6 >/dev/null && apt-mark hold libnccl2")
    assert "hi  libnccl2" in node_sh(lab, "node09", "dpkg -l libnccl2")
    assert "2.21.5-1+cuda12.4" in node_sh(lab, "node09", "apt-cache madison libnccl2")
    assert node_sh(lab, "node10", "dpkg -s libnccl2 >/dev/null 2>&1 && echo yes || echo no"
                   ).strip() == "no"
    description = node_sh(lab, "node09", "dpkg -s libnccl2 | grep -i 'lab stand-in'")
    assert "gpufleet lab stand-in" in description
    node_sh(lab, "node09", "apt-mark unhold libnccl2 >/dev/null; DEBIAN_FRONTEND=noninteractive "
            "apt-get -qq -y purge libnccl2 >/dev/null; rm -f /etc/apt/sources.list.d/lab.list")


def test_lab_up_is_idempotent(lab: Lab) -> None:
    before = lab.status()
    after = lab.up(len(before))
    assert [(s.name, s.sshd_pid) for s in after] == [(s.name, s.sshd_pid) for s in before]
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                           check=True).stdout
    assert len(re.findall(rf"^{lab.config.name}-node\d+", netns, re.MULTILINE)) == len(before)
    hosts = (lab.config.inventory_dir / "hosts.yml").read_text()
    assert hosts.count("ansible_host:") == len(before)


def test_a_node_reboot_keeps_its_disk_and_changes_its_boot_id(lab: Lab) -> None:
    node_sh(lab, "node11", "echo kept > /root/reboot-marker")
    boot_before = node_sh(lab, "node11", "cat /proc/sys/kernel/random/boot_id")
    lab.reboot("node11")
    assert node_sh(lab, "node11", "cat /root/reboot-marker").strip() == "kept"
    assert node_sh(lab, "node11", "cat /proc/sys/kernel/random/boot_id") != boot_before
    assert lab.status()[10].up


def test_down_leaves_nothing_behind(tmp_path: Path) -> None:
    small = Lab(lab_config_for("dn", 1, tmp_path / "inventory"))
    name, root = small.config.name, str(small.config.root)
    small.up(2)
    orphan = int(node_sh(small, "node01", "setsid sleep 600 >/dev/null 2>&1 < /dev/null & "
                         "echo $!").strip())
    node_ns = {os.stat(f"/run/netns/{name}-{n}").st_ino for n in ("node01", "node02")}
    # a namespace inode freed by down() may be reused by a namespace made afterwards (another
    # lab on this machine): only processes that already ran before down() count
    before = float(Path("/proc/uptime").read_text().split()[0]) * os.sysconf("SC_CLK_TCK")
    small.down()
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                           check=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True,
                           check=True).stdout
    assert f"{name}-" not in netns
    assert f"{name}-" not in links
    assert root not in Path("/proc/mounts").read_text()
    assert not Path(f"/proc/{orphan}").exists() or "Z" in Path(f"/proc/{orphan}/stat").read_text()
    still_inside = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            inode = os.stat(f"/proc/{pid}/ns/net").st_ino
            started = int(Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()[19])
        except (OSError, IndexError, ValueError):
            continue
        if inode in node_ns and started <= before:
            still_inside.append(pid)
    assert still_inside == []
    sshd = subprocess.run(["pgrep", "-af", root], capture_output=True,
                          text=True, check=False).stdout
    assert sshd.strip() == ""
    assert not (tmp_path / "inventory" / "hosts.yml").exists()


def test_lab_commands_fail_clearly_when_not_root() -> None:
    proc = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                           sys.executable, "-c",
                           "from gpufleet.lab import commands; raise SystemExit(commands.up(2))"],
                          capture_output=True, text=True, cwd=ROOT, check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("error: the lab must run as root (it manages network "
                                   "namespaces and mounts)")


def test_lab_commands_name_a_missing_system_tool(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("ip", "nsenter", "unshare", "mount", "umount", "ssh-keygen", "dpkg-deb",
                 "dpkg-scanpackages", "nft"):
        found = subprocess.run(["sh", "-c", f"command -v {tool}"], capture_output=True,
                               text=True, check=True).stdout.strip()
        os.symlink(found, bin_dir / tool)
    proc = subprocess.run([sys.executable, "-c",
                           "from gpufleet.lab import commands; raise SystemExit(commands.up(2))"],
                          capture_output=True, text=True, cwd=ROOT, check=False,
                          env={**os.environ, "PATH": str(bin_dir)})
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: missing system tools: sshd (install them with:")


def test_a_lab_of_32_nodes(tmp_path: Path) -> None:
    big = Lab(lab_config_for("32", 2, tmp_path / "inventory"))
    try:
        statuses = big.up(32)
        assert len(statuses) == 32 and all(s.up for s in statuses)
        assert node_sh(big, "node32", "hostname").strip() == "node32"
    finally:
        big.down()


def test_lab_root_under_an_overlaid_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(GpufleetError, match=r"must not lie under /tmp"):
        Lab(LabConfig(root=tmp_path / "lab"))


def test_unknown_node_name_is_a_clear_error(lab: Lab) -> None:
    with pytest.raises(GpufleetError, match=r"no lab node named 'node99'"):
        lab.exec_argv("node99", "true")
