"""The three tools' drift checks as subprocesses, each validated: a converged fleet must come
back clean from every tool, or the timing is thrown away (BenchError)."""

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
PLAYBOOK = BENCH / "ansible" / "drift-check.yml"
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
    control = WORK / "ansible-cp"
    shutil.rmtree(control, ignore_errors=True)
    control.mkdir(parents=True)
    env = {"ANSIBLE_CONFIG": str(ANSIBLE_CFG), "ANSIBLE_HOME": str(WORK / "ansible-home"),
           "ANSIBLE_SSH_CONTROL_PATH_DIR": str(control),
           "ANSIBLE_SSH_COMMON_ARGS": f"-o UserKnownHostsFile={known_hosts} "
                                      "-o StrictHostKeyChecking=yes"}
    try:
        timed = run_timed([str(TOOLS_VENV / "bin" / "ansible-playbook"), "--check", "-i",
                           str(inventory), "-f", str(nodes), "--limit", limit_pattern(nodes),
                           "-e", f"bench_desired_dir={desired}", str(PLAYBOOK)], env=env)
    finally:
        _close_control_masters(control)
    recap = dict(re.findall(r"^(node\d+)\s+:\s+(.*)$", timed.stdout, re.MULTILINE))
    clean = [h for h, line in recap.items()
             if re.search(r"changed=0\s+unreachable=0\s+failed=0", line)]
    if timed.rc != 0 or sorted(clean) != node_names(nodes):
        raise fail(f"ansible-playbook --check on {nodes} converged nodes was not clean", timed)
    return timed


def _close_control_masters(control: Path) -> None:
    """Stop the ControlPersist masters this run left, so the next run starts cold."""
    for sock in control.iterdir() if control.is_dir() else []:
        subprocess.run(["ssh", "-o", f"ControlPath={sock}", "-O", "exit", "bench"],
                       capture_output=True, check=False, timeout=30)


def pyinfra_dry(inventory: Path, nodes: int, desired: Path) -> Timed:
    """`pyinfra --dry` of the equivalent deploy, parallel = node count; no operation may
    report a change."""
    env = {"BENCH_INVENTORY": str(inventory / "hosts.yml"), "BENCH_HOSTS": str(nodes),
           "BENCH_DESIRED_DIR": str(desired)}
    timed = run_timed([str(TOOLS_VENV / "bin" / "pyinfra"), "inventory.py", "deploy.py",
                       "--dry", "--parallel", str(nodes)], env=env, cwd=PYINFRA_DIR)
    text = timed.stdout + timed.stderr
    ready = len(re.findall(r"\] Ready: deploy\.py", text))
    _, _, table = text.partition("--> Detected changes:")
    rows = [line for line in table.split("\n\n", 1)[0].splitlines()[2:] if line.strip()]
    changed = [r for r in rows if not re.search(r"\s-\s+-\s*$", r)]
    if timed.rc != 0 or ready != nodes or not rows or changed:
        raise fail(f"pyinfra --dry on {nodes} converged nodes was not clean "
                   f"(ready {ready}, changed rows {changed})", timed)
    return timed
