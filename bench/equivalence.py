"""gpufleet's roles and their Ansible and pyinfra equivalents converge to one end state, and
each tool's check finds the same drift. Run as root from the project root:

    sudo .venv/bin/python bench/equivalence.py

On three fresh nodes of the bench lab, pyinfra provisions node01, Ansible node02 and gpufleet
node03 (``--reboot``); every tool's check must then find all three clean (gpufleet's drift
also compares them with each other). Then the same drift is made on every node (:data:`DRIFT`):
every tool's check must report every node. Each tool repairs another node than the one it
provisioned, and the three checks must find all three clean again.
"""

from __future__ import annotations

import argparse
import io
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable

import tools
from common import (
    BENCH_LAB,
    INVOKE,
    ROOT,
    WORK,
    BenchError,
    Timed,
    bench_lab,
    check_checkout,
    ensure_tools,
    fail,
    limit_pattern,
    log,
    node_names,
    run_timed,
)
from desired import render_all

from gpufleet import app
from gpufleet.lab.cluster import Lab

NODES = 3
# What a node's operator might change; each is state a role manages.
DRIFT = {
    "nccl.conf edited": "echo '# local edit' >> /etc/nccl.conf",
    "ruleset file mode": "chmod 0644 /etc/gpufleet/firewall.nft",
    "libnccl2 not held": "apt-mark unhold libnccl2 >/dev/null",
    "driver pin removed": "rm -f /etc/apt/preferences.d/gpufleet-driver.pref",
    "port range": "sysctl -q -w net.ipv4.ip_local_port_range='32768 60999'",
    "rule added to the live ruleset": "nft add rule inet gpufleet input tcp dport 9999 accept",
    "cluster sets file edited": "echo '# local edit' >> /etc/gpufleet/firewall-cluster.nft",
    "live cluster set flushed": "nft flush set inet gpufleet cluster4",
    "CUDA link": "ln -sfn /usr/local/cuda-12.6 /usr/local/cuda",
    "iptables chain of the other backend": "iptables -N GPUFLEET-INPUT",
    "another module loaded": "sed -i 's/550.127.05/550.144.03/' /proc/driver/nvidia/version",
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--keep-lab", action="store_true", help="leave the bench lab up")
    return p.parse_args(argv)


class Equivalence:
    """One run on the bench lab's three nodes."""

    def __init__(self, lab: Lab) -> None:
        self.lab = lab
        self.inventory = BENCH_LAB.inventory_dir
        self.desired = WORK / "desired"
        self.hosts = node_names(NODES)

    def provision(self, by: dict[str, str]) -> None:
        """Each tool converges its node (``by``: tool -> node)."""
        for tool, node in by.items():
            log(f"{tool} converges {node}")
            if tool == "gpufleet":
                code = app.provision_cmd(str(self.inventory), limit=node, reboot=True,
                                         out=io.StringIO())
                if code != 0:
                    raise BenchError(f"gpufleet provision --reboot on {node} failed (exit "
                                     f"{code})")
            elif tool == "ansible":
                tools.ansible_apply(self.inventory, [node], self.desired, BENCH_LAB.known_hosts)
            else:
                tools.pyinfra_apply(self.inventory, [node], self.desired)

    def checks(self) -> dict[str, Callable[[], Timed]]:
        return {
            "gpufleet": lambda: tools.gpufleet_drift(self.inventory, NODES, WORK / "reports"),
            "ansible": lambda: tools.ansible_check(self.inventory, NODES, self.desired,
                                                   BENCH_LAB.known_hosts),
            "pyinfra": lambda: tools.pyinfra_dry(self.inventory, NODES, self.desired),
        }

    def all_clean(self) -> None:
        for tool, check in self.checks().items():
            check()
            log(f"{tool}: all {NODES} nodes clean")

    def drift(self) -> None:
        """Make every change of :data:`DRIFT` on every node (inside it, not over SSH)."""
        script = "\n".join(DRIFT.values())
        for node in self.hosts:
            proc = subprocess.run(self.lab.exec_argv(node, script), capture_output=True,
                                  text=True, timeout=120, check=False)
            if proc.returncode != 0:
                raise BenchError(f"{node}: making the drift failed: {proc.stderr.strip()}")

    def all_report_drift(self) -> None:
        """Every tool's check must report every node; logs what each found per node."""
        found = {"gpufleet": self._gpufleet_items(), "ansible": self._ansible_changed(),
                 "pyinfra": self._pyinfra_changed()}
        for tool, per_node in found.items():
            log(f"{tool} reports " + ", ".join(f"{n}: {per_node.get(n, 0)}" for n in self.hosts))
            missed = [n for n in self.hosts if not per_node.get(n)]
            if missed:
                raise BenchError(f"{tool} did not report the drift on {', '.join(missed)}")

    def _gpufleet_items(self) -> dict[str, int]:
        """Drift items per node, from the run's JSON report."""
        reports = WORK / "reports-drifted"
        shutil.rmtree(reports, ignore_errors=True)
        timed = run_timed([str(INVOKE), "-r", str(ROOT), "drift", "--inventory",
                           str(self.inventory), "--limit", limit_pattern(NODES),
                           "--report-dir", str(reports)], cwd=ROOT)
        written = sorted(reports.rglob("drift-*.json"))
        if not written:
            raise fail("invoke drift wrote no report", timed)
        hosts = json.loads(written[-1].read_text())["hosts"]
        return {name: len(host["items"]) for name, host in hosts.items()}

    def _ansible_changed(self) -> dict[str, int]:
        _, changed = tools.ansible_changes(self.inventory, NODES, self.desired,
                                           BENCH_LAB.known_hosts)
        return changed

    def _pyinfra_changed(self) -> dict[str, int]:
        """Operations with a change, per node (pyinfra names the nodes unless all have it)."""
        _, rows = tools.pyinfra_changes(self.inventory, NODES, self.desired)
        counts = dict.fromkeys(self.hosts, 0)
        for row in rows:
            named = re.search(r"\s\d+ \(([^)]*)\)\s", row)
            for node in named.group(1).split(", ") if named else self.hosts:
                counts[node] += 1
        return counts


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        check_checkout()
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    lab = bench_lab()
    try:
        ensure_tools()
        lab.down()
        if not all(s.up for s in lab.up(NODES)):
            raise BenchError("the bench lab did not come up")
        run = Equivalence(lab)
        render_all(run.inventory, run.desired, BENCH_LAB.controller_address)
        run.provision({"pyinfra": "node01", "ansible": "node02", "gpufleet": "node03"})
        run.all_clean()
        log(f"drift on every node: {', '.join(DRIFT)}")
        run.drift()
        run.all_report_drift()
        run.provision({"pyinfra": "node02", "ansible": "node03", "gpufleet": "node01"})
        run.all_clean()
    except BenchError as exc:
        print(f"equivalence failed: {exc}", file=sys.stderr)
        return 1
    finally:
        if not args.keep_lab:
            lab.down()
    log("one end state: every tool's check finds every tool's work clean, and the same drift")
    return 0


if __name__ == "__main__":
    sys.exit(main())

