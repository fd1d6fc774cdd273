"""Fleet scale: drift, facts and node-local conformance on 50, 100 and 200 lab nodes, the
reachability matrix on 300 nodes with sample:K and with all, and a projection to 1,000 and
10,000 nodes from the measured per-host costs. Run as root from the project root:

    sudo .venv/bin/python bench/fleet_scale.py --nodes 1,50,100,200 --reach-nodes 300

Everything runs on the bench's own lab (gfscale, 10.140.0.0/16, /srv/gpufleet-lab-scale;
with GPUFLEET_TEST_NET=N set: gfscaleN, 10.(N+5).0.0/16, /srv/gpufleet-lab-scaleN, beside
that checkout's test labs at offsets 0-4), torn down at the end (--keep-lab keeps it).
Results: bench/results/fleet-scale.json and bench/results/fleet-scale.md.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import tools
from common import (
    INVOKE,
    ROOT,
    BenchError,
    Timed,
    fail,
    limit_pattern,
    log,
    median,
    node_cpu_s,
    run_timed,
)

from gpufleet import app
from gpufleet.lab.cluster import Lab
from gpufleet.lab.model import LabConfig


def scale_lab() -> LabConfig:
    """The bench's lab: its own, or beside the test labs of GPUFLEET_TEST_NET."""
    net = os.environ.get("GPUFLEET_TEST_NET")
    suffix, subnet = (net, f"10.{int(net) + 5}.0") if net else ("", "10.140.0")
    root = Path(f"/srv/gpufleet-lab-scale{suffix}")
    return LabConfig(name=f"gfscale{suffix}", root=root, subnet=subnet,
                     inventory_dir=root / "inventory" / "lab")


SCALE_LAB = scale_lab()
WORK = SCALE_LAB.root / "work"
NODE_LOCAL = "stack,storage,host_sizing"
PROJECT_TO = (1000, 10_000)
ASSUMED_CORES = 8


def _ints(text: str) -> list[int]:
    return sorted({int(x) for x in text.split(",") if x.strip()})


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--nodes", type=_ints, default=[1, 50, 100, 200],
                   help="drift/facts sizes (1 gives the projection its latency chain)")
    p.add_argument("--conformance-nodes", type=_ints, default=[1, 8, 16, 50, 100, 200],
                   help="sizes of the node-local conformance runs")
    p.add_argument("--light-nodes", type=_ints, default=[1, 8, 16],
                   help="sizes of the runs without test_pytorch (no `import torch` on nodes)")
    p.add_argument("--reach-nodes", type=int, default=300, help="reachability lab size")
    p.add_argument("--sample", default="sample:8", help="the sampled strategy")
    p.add_argument("--runs", type=int, default=3, help="runs per size (median)")
    p.add_argument("--provision-forks", type=int, default=16)
    p.add_argument("--skip-reachability", action="store_true")
    p.add_argument("--skip-fleet", action="store_true", help="no facts and drift runs")
    p.add_argument("--conformance-forks", type=int, default=None,
                   help="--forks of the conformance runs (default: the project's)")
    p.add_argument("--analyse", type=Path, default=None,
                   help="only redo the analysis of the samples in this results file")
    p.add_argument("--chain-from", type=Path, default=None,
                   help="with --analyse: take the one-node drift (the latency chain) from "
                        "this results file when the analysed one has none")
    p.add_argument("--keep-lab", action="store_true")
    p.add_argument("--results", type=Path,
                   default=ROOT / "bench" / "results" / "fleet-scale.json")
    return p.parse_args(argv)


def memory_available_mib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    return 0.0


def sshd_pss_mib(lab: Lab) -> float:
    """Proportional memory of every node's listening sshd."""
    total = 0
    for node in lab.nodes():
        try:
            pid = int(node.sshd_pidfile.read_text().strip())
            rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
        except (OSError, ValueError):
            continue
        total += next((int(line.split()[1]) for line in rollup.splitlines()
                       if line.startswith("Pss:")), 0)
    return total / 1024


def fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least-squares line through (nodes, seconds): (fixed seconds, seconds per host)."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    var = sum((x - mx) ** 2 for x, _ in points)
    slope = sum((x - mx) * (y - my) for x, y in points) / var if var else 0.0
    return my - slope * mx, slope


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.lab = Lab(SCALE_LAB)
        self.inventory = SCALE_LAB.inventory_dir
        self.samples: list[dict[str, Any]] = []
        self.results: dict[str, Any] = {
            "lab": {"name": SCALE_LAB.name, "network": str(SCALE_LAB.network)},
            "machine": {"cores": os.cpu_count(), "loadavg_start": os.getloadavg()},
            "runs": args.runs}

    # ---- lab -----------------------------------------------------------------------------

    def up(self, count: int) -> None:
        group_vars = self.inventory / "group_vars"
        if group_vars.exists():
            shutil.rmtree(group_vars)
        shutil.copytree(ROOT / "inventory" / "lab" / "group_vars", group_vars)
        before = memory_available_mib()
        start = time.monotonic()
        statuses = self.lab.up(count)
        if not all(s.up for s in statuses):
            raise BenchError("the scale lab did not come up")
        time.sleep(2)
        self.results.setdefault("lab_up", {})[str(count)] = {
            "seconds": round(time.monotonic() - start, 1),
            "memory_used_mib": round(before - memory_available_mib(), 1),
            "sshd_pss_mib": round(sshd_pss_mib(self.lab), 1)}
        log(f"lab {SCALE_LAB.name}: {count} nodes up: {self.results['lab_up'][str(count)]}")

    def seed(self) -> None:
        """node01 with every role (torch from the wheelhouse), then its venv hard-linked into
        every other node's overlay before anything on that node looks at /opt (an overlay
        does not see a change to its upper directory after a lookup)."""
        start = time.monotonic()
        if app.provision_cmd(str(self.inventory), limit="node01", reboot=True,
                             out=io.StringIO()) != 0:
            raise BenchError("provisioning node01 failed")
        venv = self.lab.node("node01").dir / "upper" / "opt" / "gpufleet"
        for node in self.lab.nodes()[1:]:
            target = node.dir / "upper" / "opt"
            if not (target / "gpufleet").exists():
                subprocess.run(["cp", "-al", str(venv), str(target)], check=True)
        self.results["seed_s"] = round(time.monotonic() - start, 1)

    def provision(self, count: int) -> None:
        """Every node with every role; nodes that end unreachable (a reboot or the firewall's
        reconnect under the load of the whole lab on two cores) are provisioned again."""
        start = time.monotonic()
        limit = limit_pattern(count)
        passes: list[dict[str, Any]] = []
        for _ in range(3):
            report = WORK / "provision.json"
            code = app.provision_cmd(str(self.inventory), limit=limit, reboot=True,
                                     out=io.StringIO(), json_path=str(report),
                                     fleet=app.FleetArgs(forks=self.args.provision_forks))
            hosts = json.loads(report.read_text())["hosts"]
            left = sorted(h for h, r in hosts.items() if r["status"] in ("failed", "unreachable"))
            passes.append({"hosts": len(hosts), "exit": code, "not_done": left,
                           "errors": {h: hosts[h].get("error") for h in left}})
            if code in (0, 4) or not left:
                break
            limit = ":".join(left)
        self.results["provision"] = {"seconds": round(time.monotonic() - start, 1),
                                     "passes": passes}
        if passes[-1]["not_done"]:
            raise BenchError(f"provisioning left {passes[-1]['not_done']} not done")
        log(f"provisioned {count} nodes: {self.results['provision']}")

    # ---- measuring -----------------------------------------------------------------------

    def record(self, experiment: str, nodes: int, run: int, timed: Timed,
               node_cpu: float, **extra: Any) -> None:
        sample = {"experiment": experiment, "nodes": nodes, "run": run,
                  "wall_s": round(timed.wall_s, 3), "controller_cpu_s": round(timed.cpu_s, 3),
                  "node_cpu_s": round(node_cpu, 3), "rc": timed.rc,
                  "loadavg_1m": round(os.getloadavg()[0], 2), **extra}
        self.samples.append(sample)
        log(f"{experiment:22s} {nodes:4d} nodes run {run}: {timed.wall_s:7.2f}s wall, "
            f"{timed.cpu_s:6.2f}s controller cpu, {node_cpu:7.2f}s node cpu {extra or ''}")

    def timed(self, experiment: str, nodes: int, run: int, argv: list[str],
              env: dict[str, str] | None = None, **extra: Any) -> Timed:
        before = node_cpu_s(self.lab)
        result = run_timed(argv, env=env, cwd=ROOT, timeout=3600)
        time.sleep(0.3)
        self.record(experiment, nodes, run, result, node_cpu_s(self.lab) - before, **extra)
        return result

    def reachability(self, count: int) -> None:
        report = WORK / "reach.json"
        for mode in (self.args.sample, "all"):
            argv = [sys.executable, "-m", "pytest", str(ROOT / "conformance" /
                                                         "test_reachability.py"),
                    "-p", "gpufleet.conformance.plugin", "-p", "no:cacheprovider", "-q",
                    "--tb=no", "--rootdir", str(ROOT), "-k", "test_reachable_from_the_cluster",
                    "--gpufleet-inventory", str(self.inventory), "--gpufleet-pairs", mode,
                    "--gpufleet-json", str(report)]
            result = self.timed(f"reachability {mode}", count, 1, argv)
            if result.rc not in (0, 1) or not report.exists():
                raise fail(f"reachability {mode} on {count} nodes did not complete", result)
            doc = json.loads(report.read_text())
            matrix = doc["data"]["reachability"]["matrix"]
            states = [s for targets in matrix["matrix"].values() for ports in targets.values()
                      for s in ports.values()]
            pairs = sum(len(t) for t in matrix["matrix"].values())
            summary = {"mode": matrix["mode"], "pairs": pairs, "connects": len(states),
                       "open": states.count("open"), "wall_s": round(result.wall_s, 1),
                       "controller_cpu_s": round(result.cpu_s, 1),
                       "checks_passed": sum(r["outcome"] == "pass" for r in doc["results"])}
            self.results.setdefault("reachability", {})[mode] = summary
            log(f"reachability {mode}: {summary}")
            report.unlink()

    def fleet(self) -> None:
        reports = WORK / "reports"
        for n in self.args.nodes:
            for run in range(1, self.args.runs + 1):
                self.timed("facts", n, run, [
                    str(INVOKE), "-r", str(ROOT), "facts", "--inventory", str(self.inventory),
                    "--limit", limit_pattern(n), "--json", str(WORK / "facts.json")])
                result = self.timed("drift", n, run, [
                    str(INVOKE), "-r", str(ROOT), "drift", "--inventory", str(self.inventory),
                    "--limit", limit_pattern(n), "--report-dir", str(reports)])
                if result.rc != 0 or f"{n} hosts: {n} clean" not in result.stdout:
                    raise fail(f"drift on {n} converged nodes was not clean", result)
        largest = max(self.args.nodes)
        for run in range(1, self.args.runs + 1):
            for processes in ("1", "2"):
                self.timed(f"drift processes={processes}", largest, run, [
                    str(INVOKE), "-r", str(ROOT), "drift", "--inventory", str(self.inventory),
                    "--limit", limit_pattern(largest), "--report-dir", str(reports)],
                    env={"GPUFLEET_PROCESSES": processes})

    def conformance(self) -> None:
        report = WORK / "conformance.json"
        runs = [("conformance node-local", n, []) for n in self.args.conformance_nodes]
        runs += [("conformance light", n, ["-k", "not test_pytorch"])
                 for n in self.args.light_nodes]
        for experiment, n, extra in runs:
            for run in range(1, self.args.runs + 1):
                forks = self.args.conformance_forks
                fleet = f"fleet=app.FleetArgs(forks={forks}), " if forks else ""
                script = ("import sys\nfrom gpufleet import app\n"
                          f"sys.exit(app.conformance_cmd({str(self.inventory)!r}, "
                          f"limit={limit_pattern(n)!r}, suites={NODE_LOCAL!r}, {fleet}"
                          f"json_path={str(report)!r}, extra_args={extra!r}))")
                result = self.timed(experiment, n, run, [sys.executable, "-c", script])
                doc = json.loads(report.read_text())
                failed = [f"{r['host']} {r['check']}: {r['message']}" for r in doc["results"]
                          if r["outcome"] == "fail"]
                if result.rc != 0:
                    raise BenchError(f"conformance on {n} nodes failed: {failed[:5]}")
                summed = sum(r["duration_s"] for r in doc["results"] if r["host"] != "fleet")
                self.samples[-1]["sum_of_node_durations_s"] = round(summed, 1)

    # ---- analysis ------------------------------------------------------------------------

    def medians(self, experiment: str) -> dict[int, dict[str, float]]:
        out: dict[int, dict[str, float]] = {}
        for n in sorted({s["nodes"] for s in self.samples if s["experiment"] == experiment}):
            rows = [s for s in self.samples if s["experiment"] == experiment and s["nodes"] == n]
            out[n] = {k: median([r[k] for r in rows]) for k in
                      ("wall_s", "controller_cpu_s", "node_cpu_s")}
            if "sum_of_node_durations_s" in rows[0]:
                out[n]["sum_of_node_durations_s"] = median(
                    [r["sum_of_node_durations_s"] for r in rows])
        return out

    def chain(self, experiment: str, tables: dict[str, dict[int, dict[str, float]]],
              ) -> tuple[float, str] | None:
        """One node's wall time alone (startup and one host's chain of round trips), and
        where it was measured."""
        one = tables.get(experiment, {}).get(1)
        if one:
            return one["wall_s"], f"{experiment} on 1 node, this run"
        if self.args.chain_from:
            other = json.loads(self.args.chain_from.read_text())["medians"]
            if "1" in other.get(experiment, {}):
                return (other[experiment]["1"]["wall_s"],
                        f"{experiment} on 1 node, {self.args.chain_from.name}")
        return None

    def project(self, table: dict[int, dict[str, float]], chain: tuple[float, str],
                ) -> dict[str, Any]:
        """One node's run (startup and that host's round trips) plus every further host's
        controller CPU spread over ASSUMED_CORES worker processes: on a real fleet each node
        does its own work at the same time, so what grows with the fleet is the controller's
        CPU. It holds while each process has threads enough to keep its core busy while its
        hosts wait on the network (threads >= the host's chain / CPU per host)."""
        fixed, per_host = fit([(n, v["controller_cpu_s"]) for n, v in table.items()])
        _, wall_per_host = fit([(n, v["wall_s"]) for n, v in table.items()])
        chain_s, source = chain
        host_chain = max(chain_s - fixed, per_host)
        threads = math.ceil(host_chain / per_host) if per_host > 0 else 1
        rows = {}
        for n in PROJECT_TO:
            rows[str(n)] = {
                "projected_s": round(chain_s + (n - 1) * per_host / ASSUMED_CORES, 1),
                "one_process_s": round(chain_s + (n - 1) * per_host, 1),
                "latency_floor_forks_128_s": round(math.ceil(n / 128) * host_chain, 1)}
        return {"controller_cpu_fixed_s": round(fixed, 3),
                "controller_cpu_per_host_ms": round(per_host * 1000, 2),
                "wall_per_host_ms_on_this_lab": round(wall_per_host * 1000, 2),
                "one_node_s": round(chain_s, 2), "one_node_source": source,
                "host_chain_s": round(host_chain, 2), "cores_assumed": ASSUMED_CORES,
                "threads_per_process_needed": threads, "forks_needed": threads * ASSUMED_CORES,
                "rows": rows}

    def analyse(self) -> None:
        tables = {e: self.medians(e) for e in sorted({s["experiment"] for s in self.samples})}
        self.results["medians"] = {e: {str(n): v for n, v in t.items()} for e, t in
                                   tables.items()}
        projections: dict[str, Any] = {}
        for experiment in ("drift", "facts"):
            table = tables.get(experiment)
            if not table or len(table) < 2:
                continue
            chain = self.chain(experiment, tables)
            projections[experiment] = self.project(table, chain) if chain else {
                "not computed": f"no {experiment} run on 1 node (its latency chain)"}
        self.results["projection"] = projections
        self.results.pop("ratio_to_one_node", None)
        cores = self.results["machine"]["cores"]
        scaling: dict[str, Any] = {}
        for experiment in ("conformance node-local", "conformance light"):
            local = tables.get(experiment, {})
            if 1 not in local:
                continue
            one = local[1]["wall_s"]
            scaling[experiment] = {}
            for n, v in local.items():
                floor = max(one, v["node_cpu_s"] / cores)
                scaling[experiment][str(n)] = {
                    "wall_s": v["wall_s"], "to_one_node": round(v["wall_s"] / one, 2),
                    "lab_floor_s": round(floor, 2), "to_lab_floor": round(v["wall_s"] / floor, 2)}
        self.results["conformance_scaling"] = scaling

    def write(self) -> None:
        self.args.results.parent.mkdir(parents=True, exist_ok=True)
        doc = {**self.results, "samples": self.samples}
        self.args.results.write_text(json.dumps(doc, indent=1) + "\n")
        lab, cores = self.results["lab"], self.results["machine"]["cores"]
        lines = ["# Fleet scale", "", f"Lab {lab['name']} ({lab['network']}), {cores} cores, "
                 f"{self.results['runs']} runs per size (medians).", ""]
        for experiment, table in self.results.get("medians", {}).items():
            lines += [f"## {experiment}", "", "| nodes | wall | controller CPU | node CPU |",
                      "|---|---|---|---|"]
            lines += [f"| {n} | {v['wall_s']:.2f} s | {v['controller_cpu_s']:.2f} s | "
                      f"{v['node_cpu_s']:.1f} s |" for n, v in table.items()]
            lines.append("")
        for experiment, table in self.results.get("conformance_scaling", {}).items():
            lines += [f"## {experiment}: wall vs one node and vs the lab's floor", "",
                      "Floor: max(one node's wall, node CPU / the machine's cores).", "",
                      "| nodes | wall | vs one node | lab floor | vs floor |",
                      "|---|---|---|---|---|"]
            lines += [f"| {n} | {v['wall_s']:.2f} s | {v['to_one_node']:.2f}x | "
                      f"{v['lab_floor_s']:.2f} s | {v['to_lab_floor']:.2f}x |"
                      for n, v in table.items()]
            lines.append("")
        lines += ["## Projection", "", "```", json.dumps(self.results.get("projection"),
                                                          indent=1), "```", ""]
        lines += ["## Reachability", "", "```",
                  json.dumps(self.results.get("reachability"), indent=1), "```", "",
                  "## Lab", "", "```", json.dumps(self.results.get("lab_up"), indent=1), "```"]
        self.args.results.with_suffix(".md").write_text("\n".join(lines) + "\n")
        log(f"wrote {self.args.results} and its .md")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    bench = Bench(args)
    if args.analyse:
        done = json.loads(args.analyse.read_text())
        bench.samples = done.pop("samples")
        bench.results = done
        bench.analyse()
        bench.write()
        return 0
    WORK.mkdir(parents=True, exist_ok=True)
    largest = max(*args.nodes, *args.conformance_nodes)
    try:
        bench.up(max(largest, 0 if args.skip_reachability else args.reach_nodes))
        bench.seed()
        if not args.skip_reachability:
            bench.reachability(args.reach_nodes)
        bench.up(largest)
        bench.provision(largest)
        tools.gpufleet_drift(bench.inventory, largest, WORK / "reports")  # converged
        if not args.skip_fleet:
            bench.fleet()
        bench.conformance()
    finally:
        bench.analyse()
        bench.write()
        if not args.keep_lab:
            bench.lab.down()
    return 0


if __name__ == "__main__":
    sys.exit(main())
