"""Reboots in parallel: provisioning N lab nodes that all need a driver reboot, with
``--serial 50%``, against the same on 2 nodes. Each run starts from fresh nodes (no driver),
installs the pinned driver stand-in and reboots every node to load it.

    sudo .venv/bin/python bench/reboot_batches.py --nodes 2,16 --runs 3

Prints one line per run and the ratio of the medians (the target: N nodes within 2x of 2).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from common import BENCH_LAB, bench_lab, limit_pattern, log, median

from gpufleet import app


def one_run(nodes: int, serial: str) -> tuple[float, dict[str, str]]:
    lab = bench_lab()
    lab.down()
    lab.up(nodes)
    report = BENCH_LAB.root / "work" / f"reboot-{nodes}.json"
    start = time.monotonic()
    code = app.provision_cmd(str(BENCH_LAB.inventory_dir), limit=limit_pattern(nodes),
                             roles="driver", reboot=True, json_path=str(report),
                             fleet=app.FleetArgs(serial=serial))
    wall = time.monotonic() - start
    hosts = json.loads(report.read_text())["hosts"]
    statuses = {name: f"{h['status']}{' rebooted' if h.get('rebooted') else ''}"
                for name, h in hosts.items()}
    if code != 0 or not all(h.get("rebooted") for h in hosts.values()):
        raise SystemExit(f"provisioning {nodes} nodes did not converge with reboots: {statuses}")
    return wall, statuses


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", default="2,16")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--serial", default="50%")
    args = parser.parse_args()
    sizes = [int(n) for n in args.nodes.split(",")]
    walls: dict[int, list[float]] = {n: [] for n in sizes}
    for run in range(args.runs):
        for nodes in sizes:
            wall, _ = one_run(nodes, args.serial)
            walls[nodes].append(wall)
            log(f"run {run + 1}: {nodes} nodes, --serial {args.serial}, every node rebooted: "
                f"{wall:.1f}s")
    bench_lab().down()
    base = median(walls[sizes[0]])
    for nodes in sizes:
        ratio = median(walls[nodes]) / base
        log(f"{nodes} nodes: median {median(walls[nodes]):.1f}s, {ratio:.2f}x of {sizes[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
