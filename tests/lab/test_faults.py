"""Real faults on real lab nodes, each injected and its outcome asserted: a hung nvidia-smi on
one node of eight, a node lost mid-provision (powered off, or its sshd killed), a command
that never ends with the host's deadline passing, the dpkg lock held, sudo with and without a
password, and a second controller whose drift must be identical."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from gpufleet import app
from gpufleet.lab.cluster import Lab
from tests.conftest import ROOT
from tests.lab.conftest import LAB_NODES, PROVISIONED, SUBNET, node_processes, node_sh
from tests.lab.fakegpu import fake_gpus
from tests.lab.test_provision import LOCK_HOLDER, items, override, run

EIGHT = [f"node{i:02d}" for i in range(9, 17)]
HUNG = "node12"
PASSWORD = "s3cret-Pw_for-sudo"


def _json(path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(path.read_text())
    return doc


def kill_sshd(lab: Lab, node: str) -> None:
    """Kill every sshd of ``node`` (its listener and its sessions), and nothing else."""
    pids = subprocess.run(["ip", "netns", "pids", lab.node(node).netns], capture_output=True,
                          text=True, check=True).stdout.split()
    for pid in pids:
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == "sshd":
                subprocess.run(["kill", "-KILL", pid], check=False)
        except OSError:
            continue


def _wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


# --------------------------------------------------------------------------- hung nvidia-smi


def test_a_hung_nvidia_smi_costs_one_fact_on_one_node_of_eight(
        lab: Lab, inventory_path: Path, tmp_path: Path) -> None:
    limit = ":".join(EIGHT)
    with fake_gpus(lab, EIGHT, hang=frozenset({HUNG})), \
            override(inventory_path, "group_vars", "lab", {"gpufleet_fact_timeout": 3}):
        start = time.monotonic()
        assert app.facts(str(inventory_path), limit=limit,
                         json_path=str(tmp_path / "facts.json")) == 0
        facts_s = time.monotonic() - start
        start = time.monotonic()
        app.drift_cmd(str(inventory_path), limit=limit, outputs=app.DriftOutputs(
            json_path=str(tmp_path / "drift.json"), report_dir=str(tmp_path / "history")))
        drift_s = time.monotonic() - start
        code = app.conformance_cmd(str(inventory_path), limit=limit, suites="gpu",
                                   json_path=str(tmp_path / "gpu.json"))
    assert facts_s < 3 + 12 and drift_s < 3 + 15, (facts_s, drift_s)
    hosts = _json(tmp_path / "facts.json")["hosts"]
    assert all(hosts[n]["status"] == "ok" for n in EIGHT)
    assert hosts[HUNG]["absent"]["gpus"] == "nvidia-smi timed out after 3 s"
    assert "did not answer earlier" in hosts[HUNG]["absent"]["gpu_topology"]
    assert hosts[HUNG]["facts"]["hostname"] == HUNG  # every other fact is still there
    for name in EIGHT:
        if name != HUNG:
            assert [g["name"] for g in hosts[name]["facts"]["gpus"]] == ["NVIDIA H200"] * 2
    drift = _json(tmp_path / "drift.json")["hosts"]
    assert set(drift[HUNG]["facts_timed_out"]) == {"gpus", "gpu_list", "gpu_topology",
                                                    "nvlink", "gpu_fabric"}
    assert all(drift[n]["facts_timed_out"] == {} for n in EIGHT if n != HUNG)
    assert all(drift[n]["status"] in ("clean", "drifted") for n in EIGHT)
    results = _json(tmp_path / "gpu.json")["results"]
    failed = {(r["host"], r["check"]): r["message"] for r in results if r["outcome"] == "fail"}
    assert code == 1
    assert {host for host, _ in failed} == {HUNG}, failed
    assert failed[(HUNG, "test_count_and_model")] == \
        "nvidia-smi hung: nvidia-smi timed out after 3 s"
    passed = {r["host"] for r in results if r["outcome"] == "pass"}
    assert passed == set(EIGHT) - {HUNG} | {"fleet"}  # one GPU model on the seven that answer


# --------------------------------------------------------------------------- lost mid-run


def test_nodes_lost_mid_provision_keep_what_they_applied(
        lab: Lab, provisioned: Path, tmp_path: Path) -> None:
    """node03 is powered off and node02's sshd is killed while their apt transaction waits
    for a dpkg lock; each had already applied a driver file change, which the report keeps."""
    hosts = "node01:node02:node03"
    report = tmp_path / "provision.json"
    port_range = node_sh(lab, "node02", "cat /proc/sys/net/ipv4/ip_local_port_range")
    holders = {n: node_sh(lab, n, LOCK_HOLDER.format(seconds=120)).strip()
               for n in ("node02", "node03")}
    result: dict[str, int] = {}
    try:
        with override(provisioned, "group_vars", "lab", {
                "nccl_version": "2.23.4", "nccl_cuda": "12.6",
                "nvidia_driver_unattended_blacklist": ["nvidia-", "libnvidia-", "cuda-",
                                                       "libnccl", "gpufleet-fault-test"]}):
            worker = threading.Thread(target=lambda: result.update(code=app.provision_cmd(
                str(provisioned), limit=hosts, json_path=str(report))))
            worker.start()
            unattended = "/etc/apt/apt.conf.d/51gpufleet-unattended-upgrades"
            for node in ("node02", "node03"):
                _wait_for(lambda n=node: "gpufleet-fault-test" in node_sh(
                    lab, n, f"cat {unattended}"), 60, f"{node}'s driver file")
            time.sleep(1)
            lab.power_off("node03")
            kill_sshd(lab, "node02")
            worker.join(timeout=120)
        doc = _json(report)["hosts"]
        for node in ("node02", "node03"):
            assert doc[node]["status"] == "unreachable", doc[node]
            applied = {c["item"] for c in doc[node]["changes"] if c["applied"]}
            assert applied == {f"driver/file {unattended}"}, doc[node]["changes"]
        assert doc["node01"]["status"] == "changed"
        assert result["code"] == 3
    finally:
        lab.power_on("node03")
        node_sh(lab, "node02", f"kill {holders['node02']} 2>/dev/null || true")
        lab.up(LAB_NODES)  # node02's sshd comes back inside its surviving namespace
    # the namespace survived: node02's firewall and port range are as they were
    assert "table inet gpufleet" in node_sh(lab, "node02", "nft list tables")
    assert node_sh(lab, "node02", "cat /proc/sys/net/ipv4/ip_local_port_range") == port_range
    restored = run(provisioned, hosts)
    assert {restored[n].status for n in ("node01", "node02", "node03")} <= {"changed", "ok"}, \
        {n: (o.status, o.error) for n, o in restored.items()}
    assert all(items(run(provisioned, n, check=True)[n]) == [] for n in ("node02", "node03"))


# --------------------------------------------------------------------------- deadlines


def test_a_host_past_its_deadline_gets_no_further_command_and_no_reboot(
        lab: Lab, inventory_path: Path, tmp_path: Path) -> None:
    """node06 needs a driver (and so a reboot); its apt transaction waits on a dpkg lock
    that is released only after the host's deadline. The host is failed at the deadline, the
    waiting apt is killed there, nothing is installed afterwards and the node never reboots;
    node05, given the same plan without a lock, converges in the same run."""
    boot_before = node_sh(lab, "node06", "cat /proc/sys/kernel/random/boot_id")
    holder = node_sh(lab, "node06", LOCK_HOLDER.format(seconds=25)).strip()
    report = tmp_path / "provision.json"
    start = time.monotonic()
    code = app.provision_cmd(str(inventory_path), limit="node05:node06",
                             roles="nvidia_repo,driver",
                             reboot=True, json_path=str(report),
                             fleet=app.FleetArgs(timeout=15))
    elapsed = time.monotonic() - start
    doc = _json(report)["hosts"]
    assert code == 1
    assert doc["node06"]["status"] == "failed"
    assert doc["node06"]["error"].startswith("host timed out after 15s"), doc["node06"]
    assert doc["node05"]["status"] == "changed" and doc["node05"]["rebooted"]
    assert elapsed < 15 + 20, elapsed
    time.sleep(max(0.0, 32 - (time.monotonic() - start)))  # the lock is long released
    assert node_sh(lab, "node06", "cat /proc/sys/kernel/random/boot_id") == boot_before
    assert node_sh(lab, "node06", "dpkg-query -W -f='${Status}' nvidia-driver-550 "
                   "2>/dev/null || true").strip() in ("", "unknown ok not-installed")
    assert [p for p in node_processes(lab, "node06") if "apt-get" in p or "dpkg" in p] == []
    node_sh(lab, "node06", f"kill {holder} 2>/dev/null || true")
    for node in ("node05", "node06"):
        node_sh(lab, node, "apt-mark unhold nvidia-driver-550 >/dev/null 2>&1; "
                "DEBIAN_FRONTEND=noninteractive apt-get -qq -y purge 'nvidia-driver-*' "
                ">/dev/null 2>&1; rm -f /etc/apt/preferences.d/gpufleet-driver.pref "
                "/etc/apt/apt.conf.d/51gpufleet-unattended-upgrades; true")
    lab.reboot("node05")


# --------------------------------------------------------------------------- become


def _sudo_user(lab: Lab, node: str, user: str, rule: str) -> None:
    node_sh(lab, node, f"id {user} >/dev/null 2>&1 || useradd -m -s /bin/sh {user}; "
            f"echo {shlex.quote(f'{user}:{PASSWORD}')} | chpasswd; "
            f"echo {shlex.quote(f'{user} ALL=(ALL) {rule}')} > /etc/sudoers.d/{user}; "
            f"mkdir -p ~{user}/.ssh && cp /root/.ssh/authorized_keys ~{user}/.ssh/ && "
            f"chown -R {user}: ~{user}/.ssh")


def test_become_with_and_without_a_password_never_leaks_it(
        lab: Lab, inventory_path: Path, tmp_path: Path, capsys: Any) -> None:
    node = "node08"
    _sudo_user(lab, node, "gfpw", "ALL")
    _sudo_user(lab, node, "gfnopw", "NOPASSWD:ALL")
    files = ("/etc/nccl.conf", "/etc/default/gpufleet-nccl", "/etc/profile.d/gpufleet-nccl.sh")
    try:
        for user in ("gfpw", "gfnopw", "root"):
            variables = {"ansible_user": user, "ansible_become": True,
                         "ansible_become_password": PASSWORD}
            report = tmp_path / f"{user}.json"
            with override(inventory_path, "host_vars", node, variables):
                code = app.provision_cmd(str(inventory_path), limit=node, roles="nccl_env",
                                         json_path=str(report))
                assert code == 0, _json(report)
                assert app.drift_cmd(str(inventory_path), limit=node, roles="nccl_env",
                                     outputs=app.DriftOutputs(
                                         json_path=str(tmp_path / f"{user}-drift.json"),
                                         report_dir=str(tmp_path / "history"))) == 0
            contents = node_sh(lab, node, "cat " + " ".join(files))
            assert "NCCL_DEBUG=WARN" in contents
            assert PASSWORD not in contents
            node_sh(lab, node, "rm -f " + " ".join(f"{f} {f}.gpufleet-bak" for f in files))
        seen = capsys.readouterr()
        assert PASSWORD not in seen.out + seen.err
        assert all(PASSWORD not in p.read_text() for p in tmp_path.rglob("*.json"))
        # while a command runs as root through password sudo, no process shows the password
        with override(inventory_path, "host_vars", node, {
                "ansible_user": "gfpw", "ansible_become": True,
                "ansible_become_password": PASSWORD}):
            proc = subprocess.Popen(
                [sys.executable, "-c", _RUN_AS_ROOT, str(inventory_path), node],
                cwd=ROOT, stdout=subprocess.PIPE, text=True)
            _wait_for(lambda: any("sleep 4" in p for p in node_processes(lab, node)), 30,
                      "the command to start")
            cmdlines = " ".join(node_processes(lab, node))
            out, _ = proc.communicate(timeout=60)
        assert PASSWORD not in cmdlines
        assert out.strip() == "root"
        with override(inventory_path, "host_vars", node, {
                "ansible_user": "gfpw", "ansible_become": True,
                "ansible_become_password": "wrong"}):
            outcome = run(inventory_path, node, role_names="nccl_env")[node]
        assert outcome.status == "failed"
        assert "rejected the become password" in str(outcome.error)
    finally:
        node_sh(lab, node, "rm -f /etc/sudoers.d/gfpw /etc/sudoers.d/gfnopw")


_RUN_AS_ROOT = """
import sys
from gpufleet.connect.connection import ConnectOptions
from gpufleet.connect.open import connect
from gpufleet.inventory.load import load_inventory
inventory = load_inventory(sys.argv[1])
conn = connect(inventory.hosts[sys.argv[2]], ConnectOptions(known_hosts_base=inventory.base))
print(conn.run("sleep 4; id -un").stdout.strip())
"""


# --------------------------------------------------------------------------- two controllers


def test_drift_is_identical_from_a_second_controller(lab: Lab, provisioned: Path,
                                                     tmp_path: Path) -> None:
    """Both controllers are listed in gpufleet_controllers: provisioning from either keeps
    the other's access, and drift is clean from both."""
    second = lab.second_controller()
    controllers = [f"{SUBNET}.1", lab.config.second_controller_address]
    try:
        _drift_from_both(provisioned, tmp_path, second, controllers)
    finally:
        assert app.provision_cmd(str(provisioned), limit=PROVISIONED, roles="firewall") == 0


def _drift_from_both(provisioned: Path, tmp_path: Path, second: str,
                     controllers: list[str]) -> None:
    with override(provisioned, "group_vars", "lab", {"gpufleet_controllers": controllers}):
        assert app.provision_cmd(str(provisioned), limit=PROVISIONED, roles="firewall") == 0
        first = tmp_path / "first.json"
        assert app.drift_cmd(str(provisioned), limit=PROVISIONED, outputs=app.DriftOutputs(
            json_path=str(first), report_dir=str(tmp_path / "h1"))) == 0
        other = tmp_path / "second.json"
        from_second = subprocess.run(
            ["ip", "netns", "exec", second, sys.executable, "-c", _DRIFT_AND_PROVISION,
             str(provisioned), PROVISIONED, str(other), str(tmp_path / "h2")],
            cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
        assert from_second.returncode == 0, from_second.stdout + from_second.stderr
        for doc in (_json(first), _json(other)):
            assert doc["summary"]["items"] == 0
            assert {h["status"] for h in doc["hosts"].values()} == {"clean"}
        assert app.facts(str(provisioned), limit=PROVISIONED) == 0  # the first still gets in


_DRIFT_AND_PROVISION = """
import sys
from gpufleet import app
inventory, limit, report, history = sys.argv[1:5]
drift = app.drift_cmd(inventory, limit=limit,
                      outputs=app.DriftOutputs(json_path=report, report_dir=history))
provision = app.provision_cmd(inventory, limit=limit, roles="firewall")
sys.exit(drift or provision)
"""


# --------------------------------------------------------------------------- the node lock

_HELD_BY_ANOTHER = (
    "mkdir -p /run/gpufleet/lock && now=$(date +%s) && printf 'command=drift --remediate\\n"
    "controller=ctl-b\\npid=4242\\nstarted=%s\\nuntil=%s\\ntoken=%s\\n' \"$now\" "
    "\"$((now + 600))\" bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb > /run/gpufleet/lock/holder")


def test_two_runs_never_change_one_node_at_once(lab: Lab, provisioned: Path) -> None:
    """Another controller's run holds node02 (its lock on the node): this run waits its
    --lock-timeout, changes nothing and names the holder; once the holder's deadline has
    passed, the stale lock is taken over, and released after the run."""
    node_sh(lab, "node02", _HELD_BY_ANOTHER)
    node_sh(lab, "node02", "rm /etc/nccl.conf")
    try:
        start = time.monotonic()
        outcome = run(provisioned, "node02", role_names="nccl_env", lock_timeout=3)["node02"]
        assert 3 <= time.monotonic() - start < 30
        assert outcome.status == "failed"
        assert str(outcome.error).startswith(
            "the node is being changed by drift --remediate from ctl-b (pid 4242) since ")
        assert str(outcome.error).endswith("waited 3s (--lock-timeout), not changed")
        assert node_sh(lab, "node02", "test -e /etc/nccl.conf || echo absent").strip() == \
            "absent"
        node_sh(lab, "node02", "sed -i 's/^until=.*/until=1/' /run/gpufleet/lock/holder")
        taken = run(provisioned, "node02", role_names="nccl_env")["node02"]
        assert taken.status == "changed", taken.error
        assert taken.value is not None
        assert "node lock acquired (a stale lock, past its holder's deadline, was taken " \
               "over)" in taken.value.log
        assert node_sh(lab, "node02", "ls /run/gpufleet").strip() == ""  # released
    finally:
        node_sh(lab, "node02", "rm -rf /run/gpufleet/lock")
        run(provisioned, "node02", role_names="nccl_env")
    assert items(run(provisioned, "node02", check=True)["node02"]) == []


def test_a_run_that_waited_for_the_lock_plans_again(lab: Lab, provisioned: Path) -> None:
    """The run it waited for converged the node meanwhile: planning again under the lock
    finds nothing to do, so nothing is applied twice (or undone)."""
    node_sh(lab, "node02", "cp /etc/nccl.conf /run/nccl.conf.kept && rm /etc/nccl.conf && "
            + _HELD_BY_ANOTHER)
    try:
        finish = threading.Timer(3, lambda: node_sh(
            lab, "node02", "mv /run/nccl.conf.kept /etc/nccl.conf && rm -rf /run/gpufleet/lock"))
        finish.start()
        outcome = run(provisioned, "node02", role_names="nccl_env", lock_timeout=60)["node02"]
        finish.join()
    finally:
        node_sh(lab, "node02", "rm -rf /run/gpufleet/lock /run/nccl.conf.kept")
    assert outcome.status == "ok", outcome.error
    assert outcome.value is not None and outcome.value.applied == []
    assert any(line.startswith("node lock acquired after waiting ") and
               " for drift --remediate from ctl-b (pid 4242) since " in line
               for line in outcome.value.log)
    assert items(run(provisioned, "node02", check=True)["node02"]) == []


def test_the_lock_is_released_when_a_step_fails(lab: Lab, provisioned: Path) -> None:
    with override(provisioned, "host_vars", "node03", {"nccl_version": "2.99.9"}):
        outcome = run(provisioned, "node03")["node03"]
    assert outcome.status == "failed"
    assert "is not available from the host's apt repositories" in str(outcome.error)
    assert node_sh(lab, "node03", "ls /run/gpufleet 2>/dev/null || true").strip() == ""
