"""Node-local conformance through Slurm: one combined job step per round of commands
(``--launcher slurm``) against a step per command (``--launcher slurm-per-node``), with SSH
as the reference for every (host, suite, check) outcome. Per run: wall time, job steps
slurmctld created, tasks slurmd launched and slurmctld's RPCs (sdiag, reset before each
run). Run as root from the project root:

    sudo .venv/bin/python bench/slurm_steps.py --nodes 3,16 --runs 2

Everything runs on the bench's own lab with Slurm (gfsteps, 10.142.0.0/16,
/srv/gpufleet-lab-steps), torn down at the end (--keep-lab keeps it). Results:
bench/results/slurm-steps.json and bench/results/slurm-steps.md.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import ROOT, log

from gpufleet import app
from gpufleet.lab.cluster import Lab
from gpufleet.lab.model import LabConfig
from gpufleet.lab.slurm import LabSlurm, SlurmSettings

LAB = LabConfig(name="gfsteps", root=Path("/srv/gpufleet-lab-steps"), subnet="10.142.0",
                inventory_dir=Path("/srv/gpufleet-lab-steps/inventory/lab"))
WORK = LAB.root / "work"
SUITES = "firewall,stack,host_sizing,storage"
LAUNCHERS = ("ssh", "slurm", "slurm-per-node")
RESULTS = ROOT / "bench" / "results"
_RPC = re.compile(r"^\s+(REQUEST_\w+|MESSAGE_\w+)\s+\(\s*\d+\)\s+count:(\d+)", re.M)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="3,16",
                        help="comma-separated lab sizes (default: 3,16)")
    parser.add_argument("--runs", type=int, default=2, help="runs per launcher and size")
    parser.add_argument("--suites", default=SUITES, help=f"suites (default: {SUITES})")
    parser.add_argument("--keep-lab", action="store_true", help="leave the lab running")
    return parser.parse_args(argv)


def _lab() -> Lab:
    group_vars = LAB.inventory_dir / "group_vars"
    if group_vars.exists():
        shutil.rmtree(group_vars)
    shutil.copytree(ROOT / "inventory" / "lab" / "group_vars", group_vars)
    (group_vars / "lab.yml").write_text(
        f"gpufleet_scheduler: slurm\ngpufleet_slurm_conf: {LabSlurm(LAB).conf}\n")
    return Lab(LAB)


def _slurm(argv: list[str]) -> str:
    env = LabSlurm(LAB).client.environment()
    return subprocess.run(argv, capture_output=True, text=True, check=True, env=env).stdout


def rpcs(sdiag: str) -> dict[str, int]:
    """slurmctld's RPC counts by message type from sdiag's output."""
    return {name: int(count) for name, count in _RPC.findall(sdiag)}


def _steps(job: str, nodes: list[str]) -> tuple[int, int]:
    """(job steps, tasks) of ``job`` from every node's slurmd log."""
    logs = LabSlurm(LAB).dir / "log"
    per_node = [set(re.findall(rf"launch task StepId={job}\.(\d+)",
                               (logs / f"slurmd-{n}.log").read_text())) for n in nodes]
    return len(set().union(*per_node)), sum(map(len, per_node))


def _outcomes(report: Path) -> dict[str, str]:
    return {f"{r['host']} {r['suite']}/{r['check']}": r["outcome"]
            for r in json.loads(report.read_text())["results"]}


def measure(count: int, launcher: str, run: int, suites: str) -> dict[str, Any]:
    """One conformance run of ``count`` nodes with ``launcher``."""
    report = WORK / f"{launcher}-{count}-{run}.json"
    nodes = [f"node{i:02d}" for i in range(1, count + 1)]
    limit = ":".join(nodes)
    _slurm(["sdiag", "--reset"])
    start = time.monotonic()
    code = app.conformance_cmd(str(LAB.inventory_dir), limit=limit, suites=suites,
                               json_path=str(report), launcher=launcher,
                               partition=None if launcher == "ssh" else "lab",
                               out=open("/dev/null", "w"))  # noqa: SIM115
    wall = time.monotonic() - start
    counts = rpcs(_slurm(["sdiag"]))
    row: dict[str, Any] = {"nodes": count, "launcher": launcher, "run": run, "exit": code,
                           "wall_s": round(wall, 2), "rpcs": sum(counts.values()),
                           "step_create_rpcs": counts.get("REQUEST_JOB_STEP_CREATE", 0),
                           "outcomes": _outcomes(report)}
    if launcher != "ssh":
        job = json.loads(report.read_text())["data"]["launcher"]["slurm"]["job_id"]
        row["steps"], row["tasks"] = _steps(job, nodes)
    log(f"{count} nodes, {launcher} run {run}: {wall:.1f}s, {row.get('steps', '-')} steps, "
        f"{row['rpcs']} RPCs")
    return row


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Median figures per (nodes, launcher), and whether every launcher gave SSH's outcomes."""
    table = []
    for count in sorted({r["nodes"] for r in rows}):
        reference = next(r["outcomes"] for r in rows
                         if r["nodes"] == count and r["launcher"] == "ssh")
        for launcher in LAUNCHERS:
            mine = [r for r in rows if r["nodes"] == count and r["launcher"] == launcher]
            entry: dict[str, Any] = {
                "nodes": count, "launcher": launcher, "runs": len(mine),
                "wall_s": statistics.median(r["wall_s"] for r in mine),
                "rpcs": statistics.median(r["rpcs"] for r in mine),
                "step_create_rpcs": statistics.median(r["step_create_rpcs"] for r in mine),
                "same_outcomes_as_ssh": all(r["outcomes"] == reference for r in mine),
                "checks": len(reference)}
            if launcher != "ssh":
                entry["steps"] = statistics.median(r["steps"] for r in mine)
                entry["tasks"] = statistics.median(r["tasks"] for r in mine)
            table.append(entry)
    return table


def markdown(table: list[dict[str, Any]], command: str) -> str:
    lines = [f"`{command}`", "",
             "| nodes | launcher | wall (median) | job steps | tasks | slurmctld RPCs | "
             "step-create RPCs | outcomes = SSH |",
             "|---:|---|---:|---:|---:|---:|---:|---|"]
    for e in table:
        lines.append(f"| {e['nodes']} | {e['launcher']} | {e['wall_s']:.1f} s | "
                     f"{e.get('steps', '-')} | {e.get('tasks', '-')} | {e['rpcs']:g} | "
                     f"{e['step_create_rpcs']:g} | "
                     f"{'yes' if e['same_outcomes_as_ssh'] else 'NO'} ({e['checks']} checks) |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = sorted(int(n) for n in args.nodes.split(","))
    WORK.mkdir(parents=True, exist_ok=True)
    lab = _lab()
    rows: list[dict[str, Any]] = []
    try:
        lab.up(max(sizes), slurm=SlurmSettings())
        for count in sizes:
            for run in range(1, args.runs + 1):
                for launcher in LAUNCHERS:
                    rows.append(measure(count, launcher, run, args.suites))
    finally:
        if not args.keep_lab:
            lab.down()
    table = summarise(rows)
    command = "sudo .venv/bin/python bench/slurm_steps.py " + " ".join(argv or sys.argv[1:])
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "slurm-steps.json").write_text(json.dumps(
        {"command": command, "suites": args.suites, "table": table,
         "runs": [{k: v for k, v in r.items() if k != "outcomes"} for r in rows]},
        indent=2) + "\n")
    (RESULTS / "slurm-steps.md").write_text(markdown(table, command))
    print(markdown(table, command))
    return 0 if all(e["same_outcomes_as_ssh"] for e in table) else 1


if __name__ == "__main__":
    sys.exit(main())
