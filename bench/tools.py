"""The three tools as subprocesses, each validated: a converged fleet must come back clean
from every tool's check, or the timing is thrown away (BenchError); an applied playbook or
deploy must not fail."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

from common import (
    INVOKE,
    ROOT,
    TOOLS_VENV,
    WORK,
    BenchError,
    Timed,
    fail,
    limit_pattern,
    node_names,
    run_timed,
)

BENCH = Path(__file__).resolve().parent
PLAYBOOK = BENCH / "ansible" / "converge.yml"
ANSIBLE_CFG = BENCH / "ansible" / "ansible.cfg"
PYINFRA_DIR = BENCH / "pyinfra"


def gpufleet_drift(inventory: Path, nodes: int, report_dir: Path) -> Timed:
    """`invoke drift` (all roles) on node01..nodeNN; must report every host clean."""
    timed = run_timed([str(INVOKE), "-r", str(ROOT), "drift", "--inventory", str(inventory),
                       "--limit", limit_pattern(nodes), "--report-dir", str(report_dir)],
                      cwd=ROOT)
    if timed.rc != 0 or f"{nodes} hosts: {nodes} clean" not in timed.stdout:
        raise fail(f"invoke drift on {nodes} converged nodes was not clean", timed)
    return timed


def gpufleet_provision(inventory: Path, nodes: int) -> Timed:
    """`invoke provision` on node01..nodeNN; on a converged fleet it must change nothing."""
    timed = run_timed([str(INVOKE), "-r", str(ROOT), "provision", "--inventory", str(inventory),
                       "--limit", limit_pattern(nodes)], cwd=ROOT)
    if timed.rc != 0 or f"ok={nodes}  changed=0  failed=0" not in timed.stdout:
        raise fail(f"invoke provision on {nodes} converged nodes changed something", timed)
    return timed


def gpufleet_facts(inventory: Path, nodes: int, json_path: Path) -> Timed:
    """`invoke facts` on node01..nodeNN; every host must answer in ONE round trip."""
    timed = run_timed([str(INVOKE), "-r", str(ROOT), "facts", "--inventory", str(inventory),
                       "--limit", limit_pattern(nodes), "--json", str(json_path)], cwd=ROOT)
    if timed.rc != 0:
        raise fail("invoke facts failed", timed)
    hosts = json.loads(json_path.read_text())["hosts"]
    trips = {h["round_trips"] for h in hosts.values()}
    if len(hosts) != nodes or trips != {1}:
        raise BenchError(f"invoke facts: {len(hosts)} hosts, round trips {sorted(trips)}")
    return timed


def ansible_check(inventory: Path, nodes: int, desired: Path, known_hosts: Path) -> Timed:
    """`ansible-playbook --check` of the equivalent playbook, forks = node count; every host
    must end with changed=0 failed=0 unreachable=0."""
    timed, changed = ansible_changes(inventory, nodes, desired, known_hosts)
    if any(changed.values()):
        raise fail(f"ansible-playbook --check on {nodes} converged nodes was not clean", timed)
    return timed


def ansible_changes(inventory: Path, nodes: int, desired: Path,
                    known_hosts: Path) -> tuple[Timed, dict[str, int]]:
    """`ansible-playbook --check` on node01..nodeNN and the tasks it would change per host;
    a failed or unreachable host is a BenchError."""
    timed = _ansible(inventory, node_names(nodes), desired, known_hosts, check=True)
    recap = _ansible_recap(timed)
    if sorted(recap) != node_names(nodes):
        raise fail(f"ansible-playbook --check on {nodes} nodes failed", timed)
    return timed, recap


def ansible_apply(inventory: Path, hosts: list[str], desired: Path, known_hosts: Path) -> Timed:
    """`ansible-playbook` of the equivalent playbook on ``hosts``: none may fail."""
    timed = _ansible(inventory, hosts, desired, known_hosts, check=False)
    if sorted(_ansible_recap(timed)) != sorted(hosts):
        raise fail(f"ansible-playbook on {', '.join(hosts)} failed", timed)
    return timed


def _ansible(inventory: Path, hosts: list[str], desired: Path, known_hosts: Path, *,
             check: bool) -> Timed:
    control = WORK / "ansible-cp"
    shutil.rmtree(control, ignore_errors=True)
    control.mkdir(parents=True)
    env = {"ANSIBLE_CONFIG": str(ANSIBLE_CFG), "ANSIBLE_HOME": str(WORK / "ansible-home"),
           "ANSIBLE_SSH_CONTROL_PATH_DIR": str(control),
           "ANSIBLE_SSH_COMMON_ARGS": f"-o UserKnownHostsFile={known_hosts} "
                                      "-o StrictHostKeyChecking=yes"}
    try:
        return run_timed([str(TOOLS_VENV / "bin" / "ansible-playbook"),
                          *(["--check"] if check else []), "-i", str(inventory),
                          "-f", str(len(hosts)), "--limit", ":".join(hosts),
                          "-e", f"bench_desired_dir={desired}", str(PLAYBOOK)], env=env,
                         timeout=900 if check else 3600)
    finally:
        _close_control_masters(control)


def _ansible_recap(timed: Timed) -> dict[str, int]:
    """Host -> changed tasks, for the hosts whose recap has no failure."""
    recap = re.findall(r"^(node\d+)\s+:.*\bchanged=(\d+)\s+unreachable=0\s+failed=0\b",
                       timed.stdout, re.MULTILINE)
    return {host: int(changed) for host, changed in recap} if timed.rc == 0 else {}


def _close_control_masters(control: Path) -> None:
    """Stop the ControlPersist masters this run left, so the next run starts cold."""
    for sock in control.iterdir() if control.is_dir() else []:
        subprocess.run(["ssh", "-o", f"ControlPath={sock}", "-O", "exit", "bench"],
                       capture_output=True, check=False, timeout=30)


def pyinfra_dry(inventory: Path, nodes: int, desired: Path) -> Timed:
    """`pyinfra --dry` of the equivalent deploy, parallel = node count; no operation may
    report a change."""
    timed, changed = pyinfra_changes(inventory, nodes, desired)
    if changed:
        raise fail(f"pyinfra --dry on {nodes} converged nodes was not clean (changed rows "
                   f"{changed})", timed)
    return timed


def pyinfra_changes(inventory: Path, nodes: int, desired: Path) -> tuple[Timed, list[str]]:
    """`pyinfra --dry` on the first ``nodes`` hosts and the rows of its table of detected
    changes that have one (``Hold libnccl2  1 (node02)  -``); a host that did not get ready
    is a BenchError."""
    env = {"BENCH_INVENTORY": str(inventory / "hosts.yml"), "BENCH_HOSTS": str(nodes),
           "BENCH_DESIRED_DIR": str(desired)}
    timed = run_timed([str(TOOLS_VENV / "bin" / "pyinfra"), "inventory.py", "deploy.py",
                       "--dry", "--parallel", str(nodes)], env=env, cwd=PYINFRA_DIR)
    text = timed.stdout + timed.stderr
    ready = len(re.findall(r"\] Ready: deploy\.py", text))
    _, _, table = text.partition("--> Detected changes:")
    rows = [line for line in table.split("\n\n", 1)[0].splitlines()[2:] if line.strip()]
    if timed.rc != 0 or ready != nodes or not rows:
        raise fail(f"pyinfra --dry on {nodes} nodes failed (ready {ready})", timed)
    return timed, [r.strip() for r in rows if not re.search(r"\s-\s+-\s*$", r)]


def pyinfra_apply(inventory: Path, hosts: list[str], desired: Path) -> Timed:
    """`pyinfra` (applied) of the equivalent deploy on ``hosts``: no operation may fail."""
    env = {"BENCH_INVENTORY": str(inventory / "hosts.yml"), "BENCH_DESIRED_DIR": str(desired)}
    limits = [arg for host in hosts for arg in ("--limit", host)]
    timed = run_timed([str(TOOLS_VENV / "bin" / "pyinfra"), "inventory.py", "deploy.py", "-y",
                       "--parallel", str(len(hosts)), *limits], env=env, cwd=PYINFRA_DIR,
                      timeout=3600)
    # The results table's last row: Grand total, hosts, success, error, no change.
    total = re.search(r"^\s*Grand total\s+\S+\s+\S+\s+(\S+)", timed.stdout + timed.stderr,
                      re.MULTILINE)
    if timed.rc != 0 or total is None or total.group(1) not in ("-", "0"):
        raise fail(f"pyinfra on {', '.join(hosts)} failed", timed)
    return timed
