"""The engine against real lab nodes: fan-out, facts in one round trip, host keys,
timeouts, become, ProxyJump, atomic writes."""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path

import pytest

from gpufleet import app
from gpufleet.connect.connection import CommandTimeout, Connection, ConnectOptions
from gpufleet.connect.fleet import FleetOptions, TaskResult, run_fleet
from gpufleet.connect.hostkeys import HostKeyError
from gpufleet.errors import GpufleetError
from gpufleet.facts.gather import gather_facts
from gpufleet.inventory.load import load_inventory
from gpufleet.inventory.model import Host, Inventory
from gpufleet.lab.cluster import Lab
from tests.lab.conftest import SUBNET, node_processes, node_sh, ssh


def _host(inventory: Inventory, name: str, **extra: object) -> Host:
    host = inventory.hosts[name]
    return Host(host.name, {**host.vars, **extra}, host.groups)


def test_facts_from_three_nodes_in_parallel_one_round_trip_each(
        inventory: Inventory, inventory_path: Path) -> None:
    hosts = inventory.select("node01:node02:node03")

    def task(host: Host, conn: Connection) -> TaskResult[dict[str, object]]:
        facts = gather_facts(conn)
        return TaskResult({"hostname": facts.get("hostname"), "cpus": facts.get("cpus"),
                           "absent": facts.absent})

    outcomes = run_fleet(hosts, task, FleetOptions(
        connect=ConnectOptions(known_hosts_base=inventory_path)))
    for name, outcome in outcomes.items():
        assert outcome.status == "ok", outcome.error
        assert outcome.round_trips == 1
        assert outcome.value is not None and outcome.value["hostname"] == name
        assert "gpus" in outcome.value["absent"]  # no GPUs in the lab: absent with a reason


def test_invoke_facts_on_16_nodes_costs_one_round_trip_per_host(
        lab: Lab, inventory_path: Path, tmp_path: Path) -> None:
    report = tmp_path / "facts.json"
    start = time.monotonic()
    code = app.facts(str(inventory_path), json_path=str(report))
    elapsed = time.monotonic() - start
    assert code == 0
    doc = json.loads(report.read_text())
    assert doc["schema"] == "gpufleet.facts/1"
    assert len(doc["hosts"]) == 16
    assert {h["round_trips"] for h in doc["hosts"].values()} == {1}
    node = doc["hosts"]["node05"]
    assert node["summary"]["os"].startswith("Debian GNU/Linux")
    assert node["facts"]["port_range"] == [32768, 60999]
    assert node["absent"]["gpus"].startswith("nvidia-smi not found")
    assert elapsed < 60


def test_unreachable_node_is_reported_while_others_succeed(
        lab: Lab, inventory: Inventory, inventory_path: Path) -> None:
    lab.set_link("node06", up=False)
    try:
        outcomes = run_fleet(inventory.select("node05:node06:node07"),
                             lambda h, c: TaskResult(gather_facts(c).get("hostname")),
                             FleetOptions(connect=ConnectOptions(known_hosts_base=inventory_path,
                                                                 connect_timeout=2)))
    finally:
        lab.set_link("node06", up=True)
    assert outcomes["node05"].status == "ok"
    assert outcomes["node07"].status == "ok"
    assert outcomes["node06"].status == "unreachable"
    assert outcomes["node06"].error == f"connect to {SUBNET}.16:22 timed out after 2s"


def test_changed_host_key_is_refused(inventory: Inventory, lab: Lab, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    lines = lab.config.known_hosts.read_text().splitlines()
    other_key = next(line for line in lines if line.startswith(f"{SUBNET}.12 ")).split(None, 1)[1]
    known.write_text("".join(f"{SUBNET}.11 {other_key}\n" if line.startswith(f"{SUBNET}.11 ")
                             else line + "\n" for line in lines))
    conn = ssh(_host(inventory, "node01", gpufleet_known_hosts=str(known)), tmp_path)
    with pytest.raises(HostKeyError) as err:
        conn.run("true")
    assert str(err.value).startswith(f"HOST KEY CHANGED for {SUBNET}.11: known_hosts ({known}")
    assert "refusing to connect" in str(err.value)


def test_unknown_host_key_is_refused_unless_accepted_and_then_recorded(
        inventory: Inventory, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    host = _host(inventory, "node02", gpufleet_known_hosts=str(known))
    home = Path.home() / ".ssh" / "known_hosts"
    assert not home.exists() or f"{SUBNET}.12" not in home.read_text()
    refused = rf"host key of {re.escape(SUBNET)}\.12 \(ssh-ed25519 SHA256:"
    with pytest.raises(HostKeyError, match=refused):
        ssh(host, tmp_path).run("true")
    assert not known.exists()
    conn = ssh(host, tmp_path, accept_new_host_keys=True)
    assert conn.run("hostname").stdout.strip() == "node02"
    conn.close()
    assert known.read_text().startswith(f"{SUBNET}.12 ssh-ed25519 ")
    assert ssh(host, tmp_path).run("hostname").stdout.strip() == "node02"


def test_hung_command_times_out_and_is_killed_on_the_node(
        inventory: Inventory, inventory_path: Path, lab: Lab) -> None:
    conn = ssh(inventory.hosts["node03"], inventory_path)
    start = time.monotonic()
    with pytest.raises(CommandTimeout, match="command timed out after 2s: sleep 300"):
        conn.run("sleep 300", timeout=2)
    assert time.monotonic() - start < 15
    conn.close()
    time.sleep(0.5)
    assert "sleep 300" not in node_processes(lab, "node03")


def test_host_wall_timeout_fails_that_host_only(inventory: Inventory,
                                                inventory_path: Path) -> None:
    def task(host: Host, conn: Connection) -> TaskResult[str]:
        conn.run("sleep 30" if host.name == "node04" else "true", timeout=60)
        return TaskResult("done")

    start = time.monotonic()
    outcomes = run_fleet(inventory.select("node04:node05"), task, FleetOptions(
        host_timeout=2, connect=ConnectOptions(known_hosts_base=inventory_path)))
    assert time.monotonic() - start < 10
    assert outcomes["node05"].status == "ok"
    assert outcomes["node04"].status == "failed"
    assert outcomes["node04"].error in (
        "host timed out after 2s", "host timed out after 2s: stopped at the host's deadline: "
        "sleep 30")


def test_serial_batches_stop_past_max_fail_percent(inventory: Inventory,
                                                   inventory_path: Path) -> None:
    order: list[str] = []

    def task(host: Host, conn: Connection) -> TaskResult[None]:
        order.append(host.name)
        if host.name in ("node01", "node02"):
            raise GpufleetError("planned failure")
        return TaskResult(None)

    outcomes = run_fleet(inventory.select("node01:node02:node03:node04"), task, FleetOptions(
        serial="50%", max_fail_percent=25, connect=ConnectOptions(known_hosts_base=inventory_path)))
    assert sorted(order) == ["node01", "node02"]
    assert [outcomes[n].status for n in ("node01", "node02", "node03", "node04")] == \
        ["failed", "failed", "skipped", "skipped"]
    assert outcomes["node03"].error.startswith("not started: 2 of 2 hosts in the previous batch")


def test_become_runs_commands_as_root_through_sudo(lab: Lab, inventory: Inventory,
                                                   inventory_path: Path) -> None:
    node_sh(lab, "node07", "id gfuser >/dev/null 2>&1 || useradd -m -s /bin/sh gfuser; "
            "echo 'gfuser ALL=(ALL) NOPASSWD:ALL' > /etc/sudoers.d/gfuser; "
            "mkdir -p ~gfuser/.ssh && cp /root/.ssh/authorized_keys ~gfuser/.ssh/ && "
            "chown -R gfuser: ~gfuser/.ssh")
    plain = ssh(_host(inventory, "node07", ansible_user="gfuser"), inventory_path)
    assert plain.run("id -un").stdout.strip() == "gfuser"
    plain.close()
    become = ssh(_host(inventory, "node07", ansible_user="gfuser", ansible_become=True),
                 inventory_path)
    assert become.run("id -un").stdout.strip() == "root"
    become.put("/etc/gpufleet-become-test", b"written as root\n", mode=0o600)
    assert node_sh(lab, "node07", "stat -c '%a %U' /etc/gpufleet-become-test").strip() == \
        "600 root"
    become.close()


def test_proxyjump_through_another_node(lab: Lab, inventory: Inventory,
                                        inventory_path: Path) -> None:
    node_sh(lab, "node08", "nft add table inet jumponly && nft 'add chain inet jumponly in "
            "{ type filter hook input priority 0; }' && nft add rule inet jumponly in "
            f"ip saddr {SUBNET}.1 tcp dport 22 drop")
    try:
        direct = ssh(inventory.hosts["node08"], inventory_path, connect_timeout=2)
        with pytest.raises(GpufleetError, match="timed out"):
            direct.run("true")
        jumped = ssh(_host(inventory, "node08",
                           ansible_ssh_common_args=f"-o ProxyJump=root@{SUBNET}.11"),
                     inventory_path)
        assert jumped.run("hostname").stdout.strip() == "node08"
        jumped.close()
    finally:
        node_sh(lab, "node08", "nft delete table inet jumponly")


def test_put_is_atomic_keeps_a_backup_and_sets_mode(lab: Lab, inventory: Inventory,
                                                    inventory_path: Path) -> None:
    conn = ssh(inventory.hosts["node09"], inventory_path)
    conn.put("/etc/gpufleet-put/test.conf", b"first\n", mode=0o640)
    conn.put("/etc/gpufleet-put/test.conf", b"second\n", mode=0o640)
    conn.close()
    out = node_sh(lab, "node09", "cat /etc/gpufleet-put/test.conf; "
                  "cat /etc/gpufleet-put/test.conf.gpufleet-bak; "
                  "stat -c %a /etc/gpufleet-put/test.conf; ls /etc/gpufleet-put")
    assert out.split() == ["second", "first", "640", "test.conf", "test.conf.gpufleet-bak"]


def test_values_with_shell_metacharacters_reach_the_node_as_data(
        lab: Lab, inventory: Inventory, inventory_path: Path) -> None:
    conn = ssh(inventory.hosts["node10"], inventory_path)
    evil = "/tmp/x; touch /tmp/pwned #'$(id)`id`"
    conn.put(evil, b"data\n")
    conn.close()
    listing = node_sh(lab, "node10", "ls /tmp")
    assert "pwned" not in listing
    assert node_sh(lab, "node10", "cat '/tmp/x; touch /tmp/pwned #'\"'\"'$(id)`id`'").strip() == \
        "data"


def test_local_connection_runs_on_the_controller(tmp_path: Path) -> None:
    inventory_file = tmp_path / "local.yml"
    inventory_file.write_text("all:\n  hosts:\n    controller:\n      ansible_connection: local\n")
    inv = load_inventory(inventory_file)
    outcomes = run_fleet(inv.select("all"), lambda h, c: TaskResult(gather_facts(c)))
    facts = outcomes["controller"].value
    assert outcomes["controller"].status == "ok"
    assert facts is not None and facts.get("hostname") == Path("/etc/hostname").read_text().strip()
    assert shutil.which("nvidia-smi") is None or "gpus" in facts.values
