"""invoke tasks: parse flags, call gpufleet's engine, exit with its code."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, TypeVar

from invoke.collection import Collection
from invoke.context import Context
from invoke.exceptions import Exit
from invoke.tasks import task as invoke_task

from gpufleet import app
from gpufleet.lab import commands as lab_commands


def task(**kwargs: Any) -> Any:
    """invoke's @task without automatic one-letter flags: the long names are the same in
    every task, one-letter ones would not be."""
    return invoke_task(auto_shortflags=False, **kwargs)


FLEET_HELP = {
    "inventory": "inventory name under inventory/ (lab, prod ...) or a path",
    "limit": "Ansible host pattern: names, groups, globs, a:b, a:&b, a:!b",
    "forks": "hosts worked on in parallel",
    "serial": "rolling batches: N hosts or N%",
    "max_fail_percent": "stop starting batches once this % of a batch failed",
    "accept_new_host_keys": "trust unknown host keys and record them (never the default)",
    "timeout": "seconds each host may take in all; a host past it is failed and gets no "
               "further command (default per command, or gpufleet_host_timeout)",
    "json": "write the JSON report to this file",
}


def _help(*names: str, **extra: str) -> dict[str, str]:
    return {**{n: FLEET_HELP[n] for n in names}, **extra}


def _exit(code: int) -> None:
    if code:
        raise Exit(code=code)


def _fleet(c: Context, forks: int | None, serial: str | None, max_fail_percent: float | None,
           accept_new_host_keys: bool, timeout: float | None = None) -> app.FleetArgs:
    default_forks = c.config.get("gpufleet", {}).get("forks", 128)
    return app.FleetArgs(forks=_number(int, "--forks", forks or default_forks), serial=serial,
                         max_fail_percent=_number(float, "--max-fail-percent",
                                                  max_fail_percent),
                         accept_new_host_keys=accept_new_host_keys,
                         timeout=_number(float, "--timeout", timeout))


N = TypeVar("N", int, float)


def _number(kind: type[N], flag: str, value: Any) -> N | None:
    """A numeric flag's value; a clear error (exit 2) when it is not a number."""
    if value is None or value == "":
        return None
    try:
        return kind(value)
    except ValueError:
        print(f"error: {flag} must be a number, got {value!r}", file=sys.stderr)
        raise Exit(code=2) from None


@task(help=_help("inventory", "limit", "forks", "accept_new_host_keys", "json", "timeout"))
def facts(c, inventory="lab", limit=None, json=None, forks=None, accept_new_host_keys=False,
          timeout=None):
    """Gather facts from each host in one round trip and show the key ones."""
    _exit(app.facts(inventory, limit=limit, json_path=json,
                    fleet=_fleet(c, forks, None, None, accept_new_host_keys, timeout)))


@task(help=_help(*FLEET_HELP, check="show the plan, change nothing",
                 diff="show unified diffs of the files that would change",
                 roles="comma-separated roles to run (default: all)",
                 reboot="reboot hosts whose loaded driver differs (one at a time)",
                 lock_timeout="seconds to wait for a held apt/dpkg lock"))
def provision(c, inventory="lab", limit=None, check=False, diff=False, roles=None, reboot=False,
              lock_timeout=300, json=None, forks=None, serial=None, max_fail_percent=None,
              accept_new_host_keys=False, timeout=None):
    """Bring hosts to the inventory's pinned stack and configuration."""
    _exit(app.provision_cmd(inventory, limit=limit, check=check, diff=diff, roles=roles,
                            reboot=reboot, lock_timeout=int(lock_timeout), json_path=json,
                            fleet=_fleet(c, forks, serial, max_fail_percent,
                                         accept_new_host_keys, timeout)))


@task(help=_help(*FLEET_HELP, roles="comma-separated roles to check (default: all)",
                 junit="write a JUnit XML report to this file",
                 prometheus="write a node_exporter textfile (metrics) to this file",
                 report_dir="directory keeping the history of drift runs",
                 keep="number of past runs kept in the report directory",
                 remediate="apply the plan to drifted hosts after reporting",
                 drain_drifted="drain drifted hosts in the scheduler (gpufleet_scheduler), "
                               "resume the clean ones drift drained",
                 reboot="with --remediate: reboot hosts whose loaded driver differs",
                 no_diff="leave file diffs out of the terminal report"))
def drift(c, inventory="lab", limit=None, roles=None, json=None, junit=None, prometheus=None,
          report_dir=None, keep=30, remediate=False, reboot=False, no_diff=False, forks=None,
          serial=None, max_fail_percent=None, accept_new_host_keys=False, timeout=None,
          drain_drifted=False):
    """Report every host's drift from the inventory and from its group (read-only)."""
    outputs = app.DriftOutputs(json, junit, prometheus,
                               report_dir or c.config.get("gpufleet", {}).get(
                                   "drift_report_dir", "reports/drift"), int(keep))
    _exit(app.drift_cmd(inventory, limit=limit, roles=roles, outputs=outputs,
                        remediate=remediate, reboot=reboot, diff=not no_diff,
                        drain_drifted=drain_drifted,
                        fleet=_fleet(c, forks, serial, max_fail_percent, accept_new_host_keys,
                                     timeout)))


@task(help={"inventory": FLEET_HELP["inventory"], "at": "time of day, HH:MM (24-hour)",
            "json": "JSON report written by each nightly run",
            "junit": "JUnit report written by each nightly run",
            "prometheus": "node_exporter textfile written by each nightly run",
            "limit": FLEET_HELP["limit"],
            "remediate": "apply the plan to drifted hosts after each report",
            "unit_dir": "write the systemd units here instead of /etc/systemd/system"})
def drift_schedule(c, inventory="lab", at="02:30", json=None, junit=None, prometheus=None,
                   limit=None, remediate=False, unit_dir=None):
    """Run drift nightly: a systemd timer, or the cron line to use without systemd."""
    args = ["--inventory", inventory]
    for flag, value in (("--json", json), ("--junit", junit), ("--prometheus", prometheus),
                        ("--limit", limit)):
        if value:
            args += [flag, str(Path(value).resolve()) if flag != "--limit" else value]
    if remediate:
        args.append("--remediate")
    _exit(app.schedule_cmd(app.Schedule(Path.cwd().resolve(), args, at), unit_dir))


@task(help=_help("inventory", "limit", "forks", "json", "timeout",
                 suite="comma-separated suites or sets: conformance (default: stack, firewall, "
                       "reachability, allreduce, rdma, gpu), acceptance (ddp, thermal, storage, "
                       "host_sizing, p2p), all",
                 junit="write a JUnit XML report to this file",
                 pairs="reachability pairs: auto (all up to 256 nodes), all, ring, sample:K",
                 with_nccl_tests="also run nccl-tests' all_reduce_perf where installed",
                 drain_failed="drain nodes with a failed check in the scheduler "
                              "(gpufleet_scheduler), resume the ones that now pass",
                 launcher="reach nodes by ssh (default) or as steps of one Slurm allocation "
                          "(slurm)",
                 partition="with --launcher slurm: the partition to allocate from (default: "
                           "the slurm: inventory's, else Slurm's default)",
                 record_baseline="record each passing node's performance figures on the node "
                                 "(/etc/gpufleet/baseline.json)",
                 compare_baseline="gate performance figures at max(floor, baseline_fraction "
                                  "x the node's baseline) and report the trend"))
def conformance(c, inventory="lab", limit=None, suite=None, junit=None, json=None,
                pairs="auto", with_nccl_tests=False, forks=None, timeout=None,
                drain_failed=False, launcher="ssh", partition=None, record_baseline=False,
                compare_baseline=False):
    """Certify nodes: versions, reachability, AllReduce bandwidth, RDMA QoS, GPU health."""
    _exit(app.conformance_cmd(inventory, limit=limit, suites=suite, junit_path=junit,
                              json_path=json, pairs=pairs, with_nccl_tests=with_nccl_tests,
                              fleet=_fleet(c, forks, None, None, False, timeout),
                              drain_failed=drain_failed, launcher=launcher,
                              partition=partition, record_baseline=record_baseline,
                              compare_baseline=compare_baseline))


@task(help={"inventory": FLEET_HELP["inventory"], "host": "the new node (inventory name)",
            "peer": "a known-good node of the same group (default: the first other one)",
            "expect_fingerprint": "refuse unless the host key has this SHA256 fingerprint",
            "reboot": "reboot when the installed driver needs it",
            "recertify": "run the conformance suites even on a node already certified",
            "json": "write the bootstrap report to this file",
            "timeout": "seconds the whole bootstrap may take (default 7200, or "
                       "gpufleet_host_timeout)"})
def bootstrap(c, host, inventory="lab", peer=None, expect_fingerprint=None, reboot=False,
              recertify=False, json=None, timeout=None):
    """Take a new node to certified-ready: trust, preflight, provision, certify, mark."""
    options = app.BootstrapOptions(host=host, peer=peer, expect_fingerprint=expect_fingerprint,
                                   reboot=reboot, recertify=recertify,
                                   timeout=_number(float, "--timeout", timeout))
    _exit(app.bootstrap_cmd(inventory, options, json))


@task(help={"nodes": "number of lab nodes (1-1000)",
            "slurm": "also run Slurm: slurmctld and munged here, slurmd on every node"})
def lab_up(c, nodes=3, slurm=False):
    """Bring the local lab cluster up with N nodes (idempotent)."""
    _exit(lab_commands.up(int(nodes), slurm=slurm))


@task(help={"purge": "also delete the lab's state directory (key, apt repository); the "
                     "torch wheelhouse /srv/gpufleet-wheels is shared and kept"})
def lab_down(c, purge=False):
    """Tear the lab down: namespaces, mounts, processes, links and bridge."""
    _exit(lab_commands.down(purge))


@task()
def lab_status(c):
    """Show the lab's nodes."""
    _exit(lab_commands.status())


@task()
def lab_add(c):
    """Add a fresh node that is not in known_hosts yet (for bootstrap)."""
    _exit(lab_commands.add())


@task(help={"node": "node name (node01) or number"})
def lab_remove(c, node):
    """Destroy one lab node and drop it from the inventory and known_hosts."""
    _exit(lab_commands.remove(node))


@task(help={"node": "node name (node01) or number", "command": "shell command to run"})
def lab_exec(c, node, command):
    """Run a command inside a lab node: invoke lab.exec node01 'ip addr'."""
    _exit(lab_commands.node_exec(node, command))


lab = Collection("lab")
lab.add_task(lab_up, "up")
lab.add_task(lab_down, "down")
lab.add_task(lab_status, "status")
lab.add_task(lab_add, "add")
lab.add_task(lab_remove, "remove")
lab.add_task(lab_exec, "exec", aliases=["node-exec"])

drift_tasks = Collection("drift")
drift_tasks.add_task(drift, "check", default=True)
drift_tasks.add_task(drift_schedule, "schedule")

ns = Collection(facts, provision, conformance, bootstrap)
ns.add_collection(drift_tasks)
ns.add_collection(lab)
