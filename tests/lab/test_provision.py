"""Provisioning on real lab nodes: real apt/dpkg, nftables and iptables, sshd."""

from __future__ import annotations

import json
import shlex
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from gpufleet import app, roles
from gpufleet.connect.connection import ConnectOptions
from gpufleet.connect.fleet import FleetOptions, Outcome
from gpufleet.inventory.load import load_inventory
from gpufleet.lab.cluster import Lab
from gpufleet.provision.engine import HostRun, RunOptions, provision
from gpufleet.provision.plan import ApplyOptions
from tests.lab.conftest import node_sh

LOCK_HOLDER = ("python3 -c \"import fcntl, os, time\n"
               "for p in ('/var/lib/dpkg/lock-frontend', '/var/lib/dpkg/lock', "
               "'/var/lib/apt/lists/lock'):\n"
               "    fcntl.lockf(os.open(p, os.O_RDWR | os.O_CREAT), fcntl.LOCK_EX)\n"
               "time.sleep({seconds})\" >/dev/null 2>&1 & echo $!")


@contextmanager
def override(inventory_path: Path, kind: str, name: str, values: dict[str, Any]
             ) -> Iterator[None]:
    """Temporarily set variables in host_vars/ or group_vars/."""
    path = inventory_path / kind / f"{name}.yml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(yaml.safe_dump(values))
    try:
        yield
    finally:
        path.unlink()


def run(inventory_path: Path, limit: str, check: bool = False, role_names: str | None = None,
        lock_timeout: int = 300) -> dict[str, Outcome[HostRun]]:
    inventory = load_inventory(inventory_path)
    options = RunOptions(check=check, apply=ApplyOptions(lock_timeout_s=lock_timeout),
                         fleet=FleetOptions(connect=ConnectOptions(
                             known_hosts_base=inventory_path)))
    return provision(inventory, inventory.select(limit), roles.select(role_names), options)


def items(outcome: Outcome[HostRun]) -> list[str]:
    assert outcome.value is not None and outcome.value.plan is not None, outcome.error
    return [c.item for c in outcome.value.plan.changes]


def connect_result(lab: Lab, source: str, address: str, port: int) -> str:
    """open / refused / filtered, as seen from a node or the outsider namespace."""
    probe = ("import socket\ns = socket.socket()\ns.settimeout(2)\n"
             f"try:\n    s.connect(('{address}', {port}))\n    print('open')\n"
             "except ConnectionRefusedError:\n    print('refused')\n"
             "except OSError:\n    print('filtered')\n")
    if source == "outsider":
        argv = ["ip", "netns", "exec", lab.outsider(), "python3", "-c", probe]
        return subprocess.run(argv, capture_output=True, text=True, check=True).stdout.strip()
    return node_sh(lab, source, f"python3 -c {shlex.quote(probe)}").strip()


@contextmanager
def listening(lab: Lab, node: str, ports: list[int]) -> Iterator[None]:
    address = lab.node(node).address
    script = ("import socket, threading, time\n"
              f"for p in {ports}:\n"
              "    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
              f"    s.bind(('{address}', p)); s.listen(16)\n"
              "    threading.Thread(target=lambda s=s: [s.accept() for _ in iter(int, 1)],"
              " daemon=True).start()\n"
              "time.sleep(60)\n")
    proc = subprocess.Popen(lab.exec_argv(node, f"exec python3 -c {shlex.quote(script)}"))
    time.sleep(0.8)
    try:
        yield
    finally:
        proc.kill()
        proc.wait()


def test_provisioned_nodes_run_the_pinned_stack(lab: Lab, provisioned: Path) -> None:
    out = node_sh(lab, "node01", "dpkg-query -W -f='${Package} ${Version} ${Status}\\n' "
                  "nvidia-driver-550 cuda-toolkit-12-4 libnccl2 libnccl-dev")
    assert sorted(out.splitlines()) == [
        "cuda-toolkit-12-4 12.4.1-1 hold ok installed",
        "libnccl-dev 2.21.5-1+cuda12.4 hold ok installed",
        "libnccl2 2.21.5-1+cuda12.4 hold ok installed",
        "nvidia-driver-550 550.127.05-0ubuntu1 hold ok installed",
    ]
    assert "Pin: version 2.21.5-1+cuda12.4" in node_sh(
        lab, "node01", "cat /etc/apt/preferences.d/gpufleet-nccl.pref")
    assert node_sh(lab, "node01", "readlink /usr/local/cuda").strip() == "/usr/local/cuda-12.4"
    assert "550.127.05" in node_sh(lab, "node01", "cat /proc/driver/nvidia/version")
    torch = node_sh(lab, "node01", "/opt/gpufleet/venv/bin/python -c 'import torch; "
                    "print(torch.__version__, torch.version.cuda)' 2>/dev/null")
    assert torch.strip() == "2.13.0+cpu None"
    assert node_sh(lab, "node01", "cat /etc/nccl.conf").splitlines()[1:] == \
        ["NCCL_DEBUG=WARN", "NCCL_SOCKET_IFNAME=eth0"]  # sorted by name
    assert node_sh(lab, "node01", "cat /proc/sys/net/ipv4/ip_local_port_range").split() == \
        ["49152", "65535"]
    assert "\"nvidia-\";" in node_sh(
        lab, "node01", "cat /etc/apt/apt.conf.d/51gpufleet-unattended-upgrades")
    assert "table inet gpufleet" in node_sh(lab, "node01", "nft list tables")


def test_a_second_run_changes_nothing(provisioned: Path) -> None:
    outcomes = run(provisioned, "node01:node02:node03:node04")
    assert {n: (o.status, items(o)) for n, o in outcomes.items()} == {
        n: ("ok", []) for n in ("node01", "node02", "node03", "node04")}


def test_nccl_version_change_is_planned_exactly_and_converges(provisioned: Path) -> None:
    hosts = "node01:node02:node03:node04"
    with override(provisioned, "group_vars", "lab", {"nccl_version": "2.23.4",
                                                      "nccl_cuda": "12.6"}):
        planned = run(provisioned, hosts, check=True)
        for outcome in planned.values():
            assert items(outcome) == ["nccl/package libnccl2", "nccl/package libnccl-dev",
                                      "nccl/file /etc/apt/preferences.d/gpufleet-nccl.pref"]
            change = outcome.value.plan.changes[0]  # type: ignore[union-attr]
            assert (change.action, change.before, change.after) == \
                ("upgrade", "2.21.5-1+cuda12.4", "2.23.4-1+cuda12.6")
        applied = run(provisioned, hosts)
        assert {o.status for o in applied.values()} == {"changed"}
        assert all(items(o) == [] for o in run(provisioned, hosts, check=True).values())
    downgraded = run(provisioned, hosts)
    assert {o.status for o in downgraded.values()} == {"changed"}
    assert all(items(o) == [] for o in run(provisioned, hosts, check=True).values())


def test_a_package_changed_behind_gpufleets_back_is_brought_back(lab: Lab,
                                                                provisioned: Path) -> None:
    node_sh(lab, "node03", "DEBIAN_FRONTEND=noninteractive apt-get -qq -y "
            "--allow-change-held-packages install libnccl2=2.23.4-1+cuda12.6 "
            "libnccl-dev=2.23.4-1+cuda12.6 >/dev/null && apt-mark unhold libnccl2 >/dev/null")
    planned = run(provisioned, "node03", check=True)["node03"]
    changes = {c.item: (c.action, c.before, c.after)
               for c in planned.value.plan.changes}  # type: ignore[union-attr]
    assert changes == {
        "nccl/package libnccl2": ("downgrade", "2.23.4-1+cuda12.6", "2.21.5-1+cuda12.4"),
        "nccl/package libnccl-dev": ("downgrade", "2.23.4-1+cuda12.6", "2.21.5-1+cuda12.4"),
    }
    assert run(provisioned, "node03")["node03"].status == "changed"
    assert "hold ok installed" in node_sh(lab, "node03", "dpkg-query -W -f='${Status}' libnccl2")
    assert items(run(provisioned, "node03", check=True)["node03"]) == []


def test_firewall_admits_the_cluster_and_rejects_an_outsider(lab: Lab,
                                                             provisioned: Path) -> None:
    target = lab.node("node02").address
    with listening(lab, "node02", [29500, 49152, 57000, 65535]):
        for port in (29500, 49152, 57000, 65535):
            assert connect_result(lab, "node01", target, port) == "open"
            assert connect_result(lab, "outsider", target, port) == "filtered"
        assert connect_result(lab, "node01", target, 8080) == "filtered"
        assert connect_result(lab, "outsider", target, 22) == "filtered"


def test_firewall_never_touches_a_table_it_does_not_own(lab: Lab, provisioned: Path) -> None:
    node_sh(lab, "node04", "nft add table ip foreign && nft 'add chain ip foreign c "
            "{ type filter hook forward priority 0; }' && nft add rule ip foreign c counter")
    node_sh(lab, "node04", "nft delete table inet gpufleet")
    try:
        planned = run(provisioned, "node04", check=True)["node04"]
        assert items(planned) == ["firewall/live ruleset (nftables)"]
        assert planned.value.plan.changes[0].before == \
            "not loaded (gpufleet's rules are missing)"  # type: ignore[union-attr]
        assert run(provisioned, "node04")["node04"].status == "changed"
        tables = node_sh(lab, "node04", "nft list tables")
        assert "table ip foreign" in tables and "table inet gpufleet" in tables
        assert "counter" in node_sh(lab, "node04", "nft list table ip foreign")
        assert items(run(provisioned, "node04", check=True)["node04"]) == []
    finally:
        node_sh(lab, "node04", "nft delete table ip foreign")


def test_a_ruleset_that_closes_ssh_is_rolled_back(lab: Lab, provisioned: Path) -> None:
    before = node_sh(lab, "node04", "nft list table inet gpufleet")
    with override(provisioned, "host_vars", "node04", {"firewall_allow_controller": False,
                                                        "firewall_guard_seconds": 5}):
        outcome = run(provisioned, "node04")["node04"]
        assert outcome.status == "failed"
        assert "restored the previous ruleset" in str(outcome.error)
        assert "new SSH connection" in str(outcome.error)
    assert node_sh(lab, "node04", "nft list table inet gpufleet") == before
    assert node_sh(lab, "node04", "cat /etc/gpufleet/firewall.guard-fired").strip().endswith(
        "rolled back")
    assert items(run(provisioned, "node04", check=True)["node04"]) == []


def test_apt_lock_held_too_long_fails_that_host_clearly(lab: Lab, provisioned: Path) -> None:
    holder = node_sh(lab, "node02", LOCK_HOLDER.format(seconds=60)).strip()
    try:
        with override(provisioned, "host_vars", "node02", {"nccl_version": "2.23.4",
                                                            "nccl_cuda": "12.6"}):
            start = time.monotonic()
            outcome = run(provisioned, "node02", lock_timeout=3)["node02"]
        assert time.monotonic() - start < 30
        assert outcome.status == "failed"
        assert "apt/dpkg lock still held by another process after 3s" in str(outcome.error)
    finally:
        node_sh(lab, "node02", f"kill {holder}")
    assert items(run(provisioned, "node02", check=True)["node02"]) == []


def test_a_version_the_repository_lacks_fails_naming_what_exists(provisioned: Path) -> None:
    with override(provisioned, "host_vars", "node02", {"nccl_version": "2.99.9"}):
        outcome = run(provisioned, "node02")["node02"]
    assert outcome.status == "failed"
    assert str(outcome.error).endswith(
        "libnccl2=2.99.9-1+cuda12.4 is not available from the host's apt repositories "
        "(available: 2.28.3-1+cuda13.0, 2.23.4-1+cuda12.6, 2.21.5-1+cuda12.4)")


def test_a_node_taken_down_mid_run_ends_unreachable(lab: Lab, provisioned: Path) -> None:
    hosts = "node01:node02:node03"
    node_sh(lab, "node03", LOCK_HOLDER.format(seconds=120))
    result: dict[str, Outcome[HostRun]] = {}
    with override(provisioned, "group_vars", "lab", {"nccl_version": "2.23.4",
                                                      "nccl_cuda": "12.6"}):
        worker = threading.Thread(target=lambda: result.update(run(provisioned, hosts)))
        worker.start()
        time.sleep(4)
        lab.power_off("node03")
        worker.join(timeout=120)
    try:
        assert result["node03"].status == "unreachable"
        assert "dropped" in str(result["node03"].error)
        assert result["node01"].status == result["node02"].status == "changed"
    finally:
        lab.power_on("node03")
    restored = run(provisioned, hosts)
    assert [restored[n].status for n in ("node01", "node02", "node03")] == \
        ["changed", "changed", "ok"]


def test_inventory_values_cannot_run_commands(lab: Lab, provisioned: Path) -> None:
    evil = "eth0$(touch /tmp/pwned1)`touch /tmp/pwned2`;touch /tmp/pwned3"
    with override(provisioned, "host_vars", "node01", {
            "nccl_env": {"NCCL_SOCKET_IFNAME": evil, "NCCL_DEBUG": "WARN"},
            "pytorch_find_links": "/srv/gpufleet-wheels; touch /tmp/pwned4"}):
        run(provisioned, "node01", role_names="nccl_env")
        env_file = node_sh(lab, "node01", "cat /etc/default/gpufleet-nccl")
        sourced = node_sh(lab, "node01", "set -a; . /etc/default/gpufleet-nccl; "
                          "printf '%s' \"$NCCL_SOCKET_IFNAME\"")
    assert f"NCCL_SOCKET_IFNAME='{evil}'" in env_file
    assert sourced == evil
    assert node_sh(lab, "node01", "ls /tmp | grep -c pwned || true").strip() == "0"
    run(provisioned, "node01", role_names="nccl_env")
    assert items(run(provisioned, "node01", check=True)["node01"]) == []


def test_an_invalid_variable_fails_that_host_with_its_name(provisioned: Path) -> None:
    with override(provisioned, "host_vars", "node01", {"nccl_env": {"BAD;KEY": "1"}}):
        outcome = run(provisioned, "node01:node02", check=True)
    assert outcome["node01"].status == "failed"
    assert outcome["node01"].error == ("host node01: nccl_env key 'BAD;KEY' is not a valid "
                                       "environment variable name")
    assert outcome["node02"].status == "ok"


def test_iptables_backend(lab: Lab, provisioned: Path) -> None:
    with override(provisioned, "host_vars", "node05", {"firewall_backend": "iptables"}):
        first = run(provisioned, "node05", role_names="nccl_env,firewall")["node05"]
        assert first.status == "changed", first.error
        assert "-j GPUFLEET-INPUT" in node_sh(lab, "node05", "iptables -S INPUT")
        target = lab.node("node05").address
        with listening(lab, "node05", [29500, 60000]):
            assert connect_result(lab, "node01", target, 29500) == "open"
            assert connect_result(lab, "node01", target, 60000) == "open"
            assert connect_result(lab, "outsider", target, 29500) == "filtered"
        assert items(run(provisioned, "node05", check=True,
                         role_names="nccl_env,firewall")["node05"]) == []


def test_cli_json_report_and_exit_codes(provisioned: Path, tmp_path: Path) -> None:
    report = tmp_path / "provision.json"
    assert app.provision_cmd(str(provisioned), limit="node01:node02", check=True,
                             json_path=str(report)) == 0
    doc = json.loads(report.read_text())
    assert doc["schema"] == "gpufleet.provision/1"
    assert doc["hosts"]["node01"] == {"status": "ok", "error": None,
                                      "duration_s": doc["hosts"]["node01"]["duration_s"],
                                      "changes": [], "reboot_required": None, "rebooted": False}
    assert app.provision_cmd(str(provisioned), limit="nosuchhost") == 2
    with override(provisioned, "host_vars", "node02", {"nccl_version": "2.99.9"}):
        assert app.provision_cmd(str(provisioned), limit="node02") == 1
