"""gpufleet's benchmarks, one entry point (run as root from the project root):

    sudo .venv/bin/python bench/fanout.py --nodes 8,16,32 --runs 3

1. Fan-out: `invoke drift` vs `ansible-playbook --check` vs `pyinfra --dry` of equivalent
   checks on a converged fleet of 8, 16, 32 lab nodes (forks/parallel = node count).
2. Converged re-provision: `invoke provision` vs `invoke drift` on the same fleet.
3. Latency: `invoke drift` at 4..32 nodes with ~20 ms added RTT, the per-host cost
   breakdown, and a projection to 1,000 nodes.
Also: `invoke facts` on 16 nodes.

Everything runs on the bench's own lab (gfbench, 10.141.0.0/16, /srv/gpufleet-lab-bench),
which is torn down at the end (--keep-lab keeps it). Results: bench/results/latest.json
and bench/results/latest.md; plots: docs/img/.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import common
import tools
from common import (
    BENCH_LAB,
    ROOT,
    WORK,
    Sample,
    Timed,
    bench_lab,
    ensure_tools,
    log,
    median,
    node_cpu_s,
)

from gpufleet import app
from gpufleet.connect.fleet import DEFAULT_FORKS

TARGETS = {"gpufleet/ansible": 0.2, "gpufleet/pyinfra": 0.25, "provision/drift": 1.5}


def _ints(text: str) -> list[int]:
    return sorted({int(x) for x in text.split(",") if x.strip()})


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--nodes", type=_ints, default=[8, 16, 32], help="fan-out sizes")
    p.add_argument("--runs", type=int, default=3, help="runs per tool and size (median)")
    p.add_argument("--gpufleet-runs", type=int, default=5,
                   help="runs of the gpufleet-only experiments (facts, re-provision, latency)")
    p.add_argument("--latency-nodes", type=_ints, default=[4, 8, 16, 32])
    p.add_argument("--one-way-ms", type=float, default=10.0, help="added delay each way")
    p.add_argument("--facts-nodes", type=int, default=16)
    p.add_argument("--provision-forks", type=int, default=8,
                   help="forks for the initial provisioning (pip-installing torch is "
                        "CPU-bound; more forks do not help on 2 cores)")
    p.add_argument("--skip-tools", action="store_true", help="gpufleet only (no Ansible, "
                   "no pyinfra)")
    p.add_argument("--tools", default="gpufleet,ansible,pyinfra",
                   help="tools compared in the fan-out (comma-separated)")
    p.add_argument("--skip-gpufleet-only", action="store_true",
                   help="skip facts and re-provision (the fan-out only)")
    p.add_argument("--skip-latency", action="store_true")
    p.add_argument("--keep-lab", action="store_true", help="leave the bench lab up")
    p.add_argument("--results", type=Path, default=ROOT / "bench" / "results" / "latest.json")
    p.add_argument("--img", type=Path, default=ROOT / "docs" / "img")
    return p.parse_args(argv)


def machine() -> dict[str, Any]:
    mem_kb = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                  if line.startswith("MemTotal:"))
    os_release = dict(line.split("=", 1) for line in Path("/etc/os-release").read_text()
                      .splitlines() if "=" in line)
    return {"cores": os.cpu_count(), "memory_gib": round(mem_kb / 1024 / 1024, 1),
            "os": os_release.get("PRETTY_NAME", "").strip('"'), "kernel": platform.release(),
            "loadavg_start": os.getloadavg()}


def git_state() -> dict[str, Any]:
    """The commit measured, and whether engine files differed from it."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True,
                              check=False).stdout.strip()

    dirty = [line[3:] for line in git("status", "--porcelain").splitlines()
             if line[3:].startswith(("gpufleet/", "roles/", "templates/", "tasks.py"))]
    return {"commit": git("rev-parse", "--short", "HEAD"), "engine_files_modified": dirty}


class Bench:
    """The state of one bench run: lab, inventory, rendered desired state, samples."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.lab = bench_lab()
        self.inventory = BENCH_LAB.inventory_dir
        self.samples: list[Sample] = []
        self.results: dict[str, Any] = {"runs": args.runs, "gpufleet_runs": args.gpufleet_runs,
                                        "machine": machine(),
                                        "lab": {"name": BENCH_LAB.name,
                                                "subnet": str(BENCH_LAB.network)}}
        self.desired = WORK / "desired"
        self.reports = WORK / "drift-reports"

    # ---- setup -----------------------------------------------------------------------

    def setup(self) -> None:
        self.results["git"] = git_state()
        self.results["versions"] = {} if self.args.skip_tools else ensure_tools()
        if self.args.skip_tools:
            self.results["versions"] = common.tool_versions()
        total = max([*self.args.nodes,
                     *([] if self.args.skip_latency else self.args.latency_nodes),
                     *([] if self.args.skip_gpufleet_only else [self.args.facts_nodes])])
        WORK.mkdir(parents=True, exist_ok=True)
        start = time.monotonic()
        statuses = self.lab.up(total)
        if not all(s.up for s in statuses):
            raise common.BenchError("the bench lab did not come up")
        log(f"lab {BENCH_LAB.name}: {total} nodes up in {time.monotonic() - start:.1f}s")
        start = time.monotonic()
        log(f"provisioning {total} nodes with gpufleet (all roles, --reboot, forks "
            f"{self.args.provision_forks}); torch takes a while per node")
        code = app.provision_cmd(str(self.inventory), reboot=True, out=io.StringIO(),
                                 fleet=app.FleetArgs(forks=self.args.provision_forks))
        if code != 0:
            raise common.BenchError(f"provisioning the bench lab failed (exit {code})")
        self.results["provision_initial_s"] = round(time.monotonic() - start, 1)
        log(f"provisioned in {self.results['provision_initial_s']}s")
        from desired import render_all

        render_all(self.inventory, self.desired, BENCH_LAB.controller_address)
        shutil.rmtree(self.reports, ignore_errors=True)
        tools.gpufleet_drift(self.inventory, total, self.reports / "check")
        log("fleet converged: invoke drift reports every node clean")

    # ---- measurements ----------------------------------------------------------------

    def _record(self, experiment: str, tool: str, nodes: int, run: int,
                measure: Callable[[], Timed]) -> None:
        """Run one measurement; also account the CPU the nodes spent serving it (their
        sshd's reaped children), which on the lab shares the controller's cores."""
        before = node_cpu_s(self.lab)
        timed = measure()
        time.sleep(0.3)  # let each node's sshd reap the sessions that just ended
        node_cpu = node_cpu_s(self.lab) - before
        extra = {"loadavg_1m": round(os.getloadavg()[0], 2), "node_cpu_s": round(node_cpu, 3)}
        self.samples.append(Sample(experiment, tool, nodes, run, timed.wall_s, timed.cpu_s,
                                   extra))
        log(f"{experiment:16s} {tool:9s} {nodes:3d} nodes run {run}: {timed.wall_s:7.2f}s "
            f"wall, {timed.cpu_s:6.2f}s controller cpu, {node_cpu:6.2f}s node cpu")

    def _runners(self) -> dict[str, Callable[[int], Timed]]:
        known_hosts = BENCH_LAB.known_hosts
        runners: dict[str, Callable[[int], Timed]] = {
            "gpufleet": lambda n: tools.gpufleet_drift(self.inventory, n,
                                                       self.reports / f"fanout-{n}")}
        wanted = {t.strip() for t in self.args.tools.split(",")}
        if not self.args.skip_tools:
            runners["ansible"] = lambda n: tools.ansible_check(self.inventory, n, self.desired,
                                                               known_hosts)
            runners["pyinfra"] = lambda n: tools.pyinfra_dry(self.inventory, n, self.desired)
        return {name: run for name, run in runners.items() if name in wanted}

    def facts(self) -> None:
        n = self.args.facts_nodes
        for run in range(1, self.args.gpufleet_runs + 1):
            self._record("facts", "gpufleet", n, run,
                         lambda: tools.gpufleet_facts(self.inventory, n, WORK / "facts.json"))

    def fanout(self) -> None:
        runners = self._runners()
        log("warm-up: one untimed run of each tool on 2 nodes (bytecode, caches)")
        for runner in runners.values():
            runner(2)
        names = list(runners)
        for n in self.args.nodes:
            for run in range(1, self.args.runs + 1):
                shift = (run - 1) % len(names)
                for tool in names[shift:] + names[:shift]:  # alternate the order
                    self._record("fanout", tool, n, run, partial(runners[tool], n))

    def reprovision(self) -> None:
        n = max(self.args.nodes)
        for run in range(1, self.args.gpufleet_runs + 1):
            order = ["provision", "drift"] if run % 2 else ["drift", "provision"]
            for what in order:
                measure = partial(tools.gpufleet_provision, self.inventory, n) \
                    if what == "provision" else \
                    partial(tools.gpufleet_drift, self.inventory, n, self.reports / "reprov")
                self._record("reprovision", what, n, run, measure)

    def latency(self) -> None:
        """drift with and without added latency, interleaved run by run so that both see
        the same background load; the known_hosts experiment the same way."""
        import latency as lat

        sizes = self.args.latency_nodes
        largest = max(sizes)
        runs = range(1, self.args.gpufleet_runs + 1)
        info: dict[str, Any] = {"one_way_ms": self.args.one_way_ms,
                                "method": "TCP relay + nftables redirect (no sch_netem in "
                                          "this kernel); see bench/delay_relay.py"}
        info["rtt_without_delay"] = lat.rtt_report(self.inventory)
        with lat.added_latency(self.args.one_way_ms):
            info["rtt_with_delay"] = lat.rtt_report(self.inventory)
        log(f"SSH RTT without / with added delay: {info['rtt_without_delay']['ssh']} / "
            f"{info['rtt_with_delay']['ssh']}")
        for n in sizes:
            for run in runs:
                for delayed in ((False, True) if run % 2 else (True, False)):
                    report = self.reports / f"lat{int(delayed)}-{n}"
                    measure = partial(tools.gpufleet_drift, self.inventory, n, report)
                    if delayed:
                        with lat.added_latency(self.args.one_way_ms):
                            self._record("drift_delay", "gpufleet", n, run, measure)
                    else:
                        self._record("drift_no_delay", "gpufleet", n, run, measure)
        info["breakdown_without_delay"] = lat.breakdown(self.inventory, largest)
        with lat.added_latency(self.args.one_way_ms):
            info["breakdown_with_delay"] = lat.breakdown(self.inventory, largest)
        info["known_hosts_load_cpu_ms"] = {
            str(k): lat.known_hosts_cost(BENCH_LAB.known_hosts, k) for k in (32, 1000, 5000)}
        padded = lat.padded_inventory(self.inventory, 1000)
        for run in runs:
            for inventory, label in ((self.inventory, "known_hosts_32"),
                                     (padded, "known_hosts_1000"))[::1 if run % 2 else -1]:
                self._record(label, "gpufleet", largest, run, partial(
                    tools.gpufleet_drift, inventory, largest, self.reports / label))
        shutil.rmtree(padded, ignore_errors=True)
        self.results["latency"] = info

    # ---- analysis --------------------------------------------------------------------

    def analyse(self) -> None:
        table: dict[str, dict[str, dict[str, float]]] = {}
        cpu: dict[str, dict[str, dict[str, float]]] = {}
        node_cpu: dict[str, dict[str, dict[str, float]]] = {}
        groups: dict[tuple[str, str, str], list[Sample]] = {}
        for s in self.samples:
            groups.setdefault((s.experiment, s.tool, str(s.nodes)), []).append(s)
        for (exp, tool, size), runs in groups.items():
            table.setdefault(exp, {}).setdefault(tool, {})[size] = round(
                median([r.wall_s for r in runs]), 3)
            cpu.setdefault(exp, {}).setdefault(tool, {})[size] = round(
                median([r.cpu_s for r in runs]), 3)
            node_cpu.setdefault(exp, {}).setdefault(tool, {})[size] = round(
                median([float(r.extra.get("node_cpu_s", 0.0)) for r in runs]), 3)
        self.results["medians"] = table
        self.results["cpu_medians"] = cpu
        self.results["node_cpu_medians"] = node_cpu
        fan = table.get("fanout", {})
        ratios: dict[str, dict[str, float]] = {}
        for other in ("ansible", "pyinfra"):
            for size, value in fan.get("gpufleet", {}).items():
                if size in fan.get(other, {}):
                    ratios.setdefault(f"gpufleet/{other}", {})[size] = round(
                        value / fan[other][size], 3)
        rep = table.get("reprovision", {})
        if rep:
            size = next(iter(rep["provision"]))
            ratios["provision/drift"] = {
                size: round(rep["provision"][size] / rep["drift"][size], 3)}
        self.results["ratios"] = ratios
        largest = str(max(self.args.nodes))
        verdicts = {}
        for key, limit in TARGETS.items():
            at = ratios.get(key, {})
            chosen = largest if largest in at else next(iter(at), None)
            if chosen is not None:
                verdicts[key] = {"nodes": int(chosen), "ratio": at[chosen], "target": limit,
                                 "met": at[chosen] <= limit}
        self.results["targets"] = verdicts
        if "latency" in self.results:
            self.results["projection"] = self.projection()

    def projection(self) -> dict[str, Any]:
        """1,000 nodes at the default forks: latency-bound and controller-CPU-bound."""
        lat = self.results["latency"]
        delay_wall = self.results["medians"]["drift_delay"]["gpufleet"]
        delay_cpu = self.results["cpu_medians"]["drift_delay"]["gpufleet"]
        sizes = sorted(int(n) for n in delay_wall)
        lo, hi = str(sizes[0]), str(sizes[-1])
        span = int(hi) - int(lo)
        wall_slope = (delay_wall[hi] - delay_wall[lo]) / span
        cpu_slope = (delay_cpu[hi] - delay_cpu[lo]) / span
        cpu_fixed = delay_cpu[lo] - cpu_slope * int(lo)
        seq = lat["breakdown_with_delay"]["sequential"]
        per_host_s = (seq["connect_wall"] + seq["facts_wall"] + seq["parse_cpu"]
                      + seq["plan_cpu"]) / 1000
        fixed_s = max(0.0, delay_wall[lo] - per_host_s)
        forks, fleet = DEFAULT_FORKS, 1000
        waves = math.ceil(fleet / forks)
        latency_bound = fixed_s + waves * per_host_s
        cpu_bound = cpu_fixed + fleet * cpu_slope
        # What a 1,000-line known_hosts costs a run, measured end to end over ``largest``
        # connections; scaled as if it were paid per connection (an upper bound: gpufleet
        # parses known_hosts once per run).
        cpu = self.results["cpu_medians"]
        largest = str(max(self.args.latency_nodes))
        kh_run = max(0.0, cpu["known_hosts_1000"]["gpufleet"][largest]
                     - cpu["known_hosts_32"]["gpufleet"][largest])
        kh_extra = kh_run * fleet / int(largest)
        return {
            "fleet": fleet, "forks": forks, "waves": waves,
            "per_host_s_no_contention": round(per_host_s, 3),
            "fixed_overhead_s": round(fixed_s, 3),
            "wall_slope_s_per_host_measured": round(wall_slope, 4),
            "controller_cpu_s_per_host": round(cpu_slope, 4),
            "latency_bound_s": round(latency_bound, 1),
            "cpu_bound_s": round(cpu_bound, 1),
            "known_hosts_1000_extra_cpu_s_measured": round(kh_run, 2),
            "known_hosts_extra_cpu_s_at_1000_upper_bound": round(kh_extra, 1),
            "projected_s": round(max(latency_bound, cpu_bound) + kh_extra, 1),
            "dominant": "controller CPU" if cpu_bound + kh_extra > latency_bound
                        else "latency (connection setup + facts round trip)",
        }

    # ---- output ----------------------------------------------------------------------

    def write(self) -> None:
        """The results, their tables and plots; a failed run writes only its samples and
        error, beside the results (``NAME-failed.json``), leaving earlier results as they
        are."""
        self.results["machine"]["loadavg_end"] = os.getloadavg()
        self.results["samples"] = [s.to_dict() for s in self.samples]
        self.args.results.parent.mkdir(parents=True, exist_ok=True)
        if "error" in self.results or "medians" not in self.results:
            self.results.setdefault("error", "the run ended before its analysis")
            failed = self.args.results.with_name(self.args.results.stem + "-failed.json")
            failed.write_text(json.dumps(self.results, indent=2) + "\n")
            log(f"samples and error of the failed run: {failed}")
            return
        self.args.results.write_text(json.dumps(self.results, indent=2) + "\n")
        summary = self.args.results.with_suffix(".md")
        summary.write_text(summary_markdown(self.results))
        log(f"results: {self.args.results}, {summary}")
        try:
            from plots import plot

            for path in plot(self.results, self.args.img):
                log(f"plot: {path}")
        except ImportError as exc:
            log(f"no plots ({exc}); pip install matplotlib into .venv")


def summary_markdown(r: dict[str, Any]) -> str:
    """The tables of docs/benchmarks.md, from a results document."""
    med, cpu, lines = r.get("medians", {}), r.get("cpu_medians", {}), []
    node = r.get("node_cpu_medians", {})
    fan = med.get("fanout", {})
    names = ("gpufleet", "ansible", "pyinfra")
    if fan:
        lines += ["| nodes | gpufleet drift | ansible-playbook --check | pyinfra --dry | "
                  "gpufleet/ansible | gpufleet/pyinfra |", "|---|---|---|---|---|---|"]
        for n in sorted(fan.get("gpufleet", {}), key=int):
            g, a, p = (fan.get(t, {}).get(n) for t in names)
            lines.append(f"| {n} | {_s(g)} | {_s(a)} | {_s(p)} | {_x(g, a)} | {_x(g, p)} |")
        lines += ["", "CPU seconds, controller / nodes (median):", "",
                  "| nodes | gpufleet | ansible | pyinfra |", "|---|---|---|---|"]
        for n in sorted(fan.get("gpufleet", {}), key=int):
            node_fan = node.get("fanout", {})
            cells = [f"{cpu['fanout'][t][n]:.1f} / {_cpu(node_fan.get(t, {}).get(n))}"
                     if n in cpu["fanout"].get(t, {}) else "-" for t in names]
            lines.append(f"| {n} | " + " | ".join(cells) + " |")
        lines.append("")
    for key, v in r.get("targets", {}).items():
        lines.append(f"- {key} at {v['nodes']} nodes: {v['ratio']:.3f}x (target <= "
                     f"{v['target']}x): {'MET' if v['met'] else 'MISSED'}")
    for exp in ("reprovision", "facts", "known_hosts_32", "known_hosts_1000", "drift_no_delay",
                "drift_delay"):
        if exp in med:
            lines += ["", f"{exp}:"]
            for tool, rows in med[exp].items():
                lines.append(f"- {tool}: " + ", ".join(
                    f"{n} nodes {v:.2f}s (cpu {cpu[exp][tool][n]:.2f}s)"
                    for n, v in sorted(rows.items(), key=lambda kv: int(kv[0]))))
    if "projection" in r:
        lines += ["", "projection: " + json.dumps(r["projection"])]
    return "\n".join(lines) + "\n"


def _s(wall: float | None) -> str:
    return "-" if wall is None else f"{wall:.2f} s"


def _cpu(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.1f}"


def _x(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None else f"{a / b:.3f}x"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if os.geteuid() != 0:
        print("error: run as root (the bench lab creates namespaces, mounts and sshd nodes)",
              file=sys.stderr)
        return 2
    try:
        common.check_checkout()
    except common.BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    bench = Bench(args)
    started = time.monotonic()
    try:
        bench.setup()
        if not args.skip_gpufleet_only:
            bench.facts()
        bench.fanout()
        if not args.skip_gpufleet_only:
            bench.reprovision()
        if not args.skip_latency:
            bench.latency()
        bench.analyse()
    except (common.BenchError, subprocess.CalledProcessError) as exc:
        bench.results["error"] = str(exc)
    except BaseException as exc:
        bench.results["error"] = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        bench.results["bench_total_s"] = round(time.monotonic() - started, 1)
        bench.write()
        if not args.keep_lab:
            log("tearing the bench lab down")
            bench.lab.down()
            shutil.rmtree(WORK, ignore_errors=True)
    if "error" in bench.results:
        print(f"bench failed, nothing compared: {bench.results['error']}", file=sys.stderr)
        return 1
    print(summary_markdown(bench.results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
