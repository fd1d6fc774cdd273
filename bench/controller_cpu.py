"""Controller CPU of the fleet runner's per-host work, threads vs worker processes, without
the network: every host parses the same captured facts output of a provisioned lab node
(bench/captures/lab-node-facts.txt, its markers' nonce 0123456789abcdef) and plans every
role against it, as drift does after its one round trip. Run from the project root:

    .venv/bin/python bench/controller_cpu.py --hosts 1000,2000 --processes 1,2 --runs 3

Prints one JSON line per run and a summary; --results FILE writes them as JSON.

The capture is taken from a provisioned lab node (as root, the lab up):

    .venv/bin/python bench/controller_cpu.py --capture INVENTORY_DIR --host node01

which writes the node's facts output, the lab's repository keyring and the lab variables
the plans depend on (lab-cuda-archive-keyring.gpg, lab-node-vars.yml) under bench/captures/.
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

from gpufleet import roles
from gpufleet.connect.connection import Connection, ConnectOptions
from gpufleet.connect.fleet import FleetOptions, TaskResult, run_fleet
from gpufleet.facts import catalog, script
from gpufleet.facts.gather import parse_sections, snippet_timeout
from gpufleet.inventory.load import load_inventory
from gpufleet.inventory.model import Host, Inventory
from gpufleet.provision.engine import active_roles, fact_request, plan_host
from gpufleet.roles import consistency_request

ROOT = Path(__file__).resolve().parent.parent
CAPTURES = ROOT / "bench" / "captures"
CAPTURE = CAPTURES / "lab-node-facts.txt"
CAPTURED_VARS = CAPTURES / "lab-node-vars.yml"
CAPTURED_KEYRING = CAPTURES / "lab-cuda-archive-keyring.gpg"
NONCE = "0123456789abcdef"
PLAN_VARS = ("gpufleet_controllers", "nvidia_repo_url")


def drift_facts(host: Host) -> list[catalog.Fact]:
    """The facts drift gathers from ``host`` in its one round trip."""
    request = fact_request(active_roles(host, roles.ALL)) | consistency_request(host)
    return catalog.BASE_FACTS + request.facts()


def capture(directory: Path, name: str) -> None:
    """One provisioned lab node's drift facts output (fixed nonce) and the lab variables
    its plans depend on, written under bench/captures/."""
    inv = load_inventory(directory)
    if name not in inv.hosts:
        raise SystemExit(f"{directory}: no host {name}")
    host = inv.hosts[name]
    composite = script.compose((script.Snippet(f.name, f.shell, f.guard)
                                for f in drift_facts(host)), NONCE, snippet_timeout(host))

    def task(host: Host, conn: Connection) -> TaskResult[str]:
        return TaskResult(conn.run(composite, timeout=300).stdout)

    outcome = run_fleet([host], task, FleetOptions(
        connect=ConnectOptions(known_hosts_base=directory)))[name]
    if outcome.status != "ok" or not isinstance(outcome.value, str):
        raise SystemExit(f"{name}: {outcome.status}: {outcome.error}")
    CAPTURE.write_text(outcome.value)
    CAPTURED_KEYRING.write_bytes(Path(host.vars["nvidia_repo_keyring"]).read_bytes())
    CAPTURED_VARS.write_text(yaml.safe_dump({k: host.vars[k] for k in PLAN_VARS}))
    print(f"wrote {CAPTURE}, {CAPTURED_KEYRING.name} and {CAPTURED_VARS.name}")


def inventory(directory: Path, count: int) -> Inventory:
    """``count`` hosts with the lab's variables (local connections: nothing is contacted)."""
    group_vars = yaml.safe_load((ROOT / "inventory" / "lab" / "group_vars" / "all.yml")
                                .read_text())
    captured = yaml.safe_load(CAPTURED_VARS.read_text())
    hosts = {f"node{i:04d}": {"ansible_host": f"10.{140 + i // 60000}.{i // 250 % 240}."
                                              f"{1 + i % 250}"} for i in range(1, count + 1)}
    doc = {"all": {"vars": {**group_vars, **captured, "ansible_connection": "local",
                            "nvidia_repo_keyring": str(CAPTURED_KEYRING)},
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
    facts_list = drift_facts(next(iter(inv.hosts.values())))

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
    changes = sorted({o.value for o in outcomes.values() if o.value is not None})
    return {"hosts": len(hosts), "processes": processes, "wall_s": round(wall, 3),
            "changes_per_host": changes[0] if len(changes) == 1 else changes,
            "cpu_s": round(cpu, 3), "cpu_per_host_ms": round(cpu / len(hosts) * 1000, 2),
            "loadavg_1m": round(os.getloadavg()[0], 2)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--hosts", default="1000,2000")
    p.add_argument("--processes", default="1,2")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--results", type=Path)
    p.add_argument("--capture", type=Path, metavar="INVENTORY_DIR",
                   help="capture a provisioned lab node's facts output instead")
    p.add_argument("--host", default="node01", help="the node --capture reads")
    args = p.parse_args(argv)
    if args.capture:
        capture(args.capture, args.host)
        return 0
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
