"""Controller CPU of the fleet runner's per-host work, threads vs worker processes, without
the network: every host parses the same captured facts output of a provisioned lab node
(bench/captures/lab-node-facts.txt, its markers' nonce 0123456789abcdef) and plans every
role against it, as drift does after its one round trip. Run from the project root:

    .venv/bin/python bench/controller_cpu.py --hosts 1000,2000 --processes 1,2 --runs 3

Prints one JSON line per run and a summary; --results FILE writes them as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

import roles
from gpufleet.connection import Connection
from gpufleet.drift import consistency_request
from gpufleet.engine import active_roles, fact_request, plan_host
from gpufleet.facts import catalog, parse_sections
from gpufleet.fleet import FleetOptions, TaskResult, run_fleet
from gpufleet.inventory import Host, Inventory, load_inventory

ROOT = Path(__file__).resolve().parent.parent
CAPTURE = ROOT / "bench" / "captures" / "lab-node-facts.txt"
NONCE = "0123456789abcdef"


def inventory(directory: Path, count: int) -> Inventory:
    """``count`` hosts with the lab's variables (local connections: nothing is contacted)."""
    group_vars = yaml.safe_load((ROOT / "inventory" / "lab" / "group_vars" / "all.yml")
                                .read_text())
    hosts = {f"node{i:04d}": {"ansible_host": f"10.{140 + i // 60000}.{i // 250 % 240}."
                                              f"{10 + i % 240}"} for i in range(1, count + 1)}
    doc = {"all": {"vars": {**group_vars, "ansible_connection": "local",
                            "gpufleet_controllers": ["10.140.0.1"]},
                   "children": {"lab": {"hosts": hosts}}}}
    path = directory / "hosts.yml"
    path.write_text(yaml.safe_dump(doc))
    return load_inventory(path)


def cpu_s() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def measure(inv: Inventory, processes: int) -> dict[str, float]:
    text = CAPTURE.read_text()
    first = next(iter(inv.hosts.values()))
    request = fact_request(active_roles(first, roles.ALL)) | consistency_request(first)
    facts_list = catalog.BASE_FACTS + request.facts()

    def task(host: Host, conn: Connection) -> TaskResult[int]:
        facts = parse_sections(host.name, text, facts_list, NONCE)
        plan = plan_host(inv, host, active_roles(host, roles.ALL), facts)
        return TaskResult(len(plan.changes))

    hosts = list(inv.hosts.values())
    before, start = cpu_s(), time.monotonic()
    outcomes = run_fleet(hosts, task, FleetOptions(processes=processes))
    wall, cpu = time.monotonic() - start, cpu_s() - before
    bad = [o for o in outcomes.values() if o.status != "ok"]
    if bad:
        raise SystemExit(f"{len(bad)} hosts did not plan: {bad[0].error}")
    return {"hosts": len(hosts), "processes": processes, "wall_s": round(wall, 3),
            "cpu_s": round(cpu, 3), "cpu_per_host_ms": round(cpu / len(hosts) * 1000, 2),
            "loadavg_1m": round(os.getloadavg()[0], 2)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--hosts", default="1000,2000")
    p.add_argument("--processes", default="1,2")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--results", type=Path)
    args = p.parse_args(argv)
    samples = []
    with tempfile.TemporaryDirectory() as tmp:
        for count in (int(x) for x in args.hosts.split(",")):
            inv = inventory(Path(tmp), count)
            for run in range(args.runs):
                for processes in (int(x) for x in args.processes.split(",")):
                    sample = measure(inv, processes) | {"run": run + 1}
                    samples.append(sample)
                    print(json.dumps(sample), flush=True)
    summary = {}
    for key in sorted({(s["hosts"], s["processes"]) for s in samples}):
        rows = [s for s in samples if (s["hosts"], s["processes"]) == key]
        summary[f"{key[0]} hosts, {key[1]} process(es)"] = {
            k: statistics.median(r[k] for r in rows) for k in ("wall_s", "cpu_s",
                                                               "cpu_per_host_ms")}
    print(json.dumps(summary, indent=1))
    if args.results:
        args.results.write_text(json.dumps({"cores": os.cpu_count(), "summary": summary,
                                            "samples": samples}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
