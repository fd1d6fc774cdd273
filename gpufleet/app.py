"""The commands behind ``invoke`` tasks and the ``gpufleet`` console script.

Each command takes plain arguments, prints its report and returns an exit code;
nothing here knows about invoke or argparse.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, TextIO

from gpufleet import exitcodes
from gpufleet import roles as role_registry
from gpufleet.bootstrap import BootstrapOptions, bootstrap
from gpufleet.conformance import verdict
from gpufleet.conformance.allreduce_vars import check_variables as check_allreduce_variables
from gpufleet.connect.connection import Connection, ConnectOptions
from gpufleet.connect.fleet import DEFAULT_FORKS, FleetOptions, Outcome, TaskResult, run_fleet
from gpufleet.drift import compare as drift
from gpufleet.drift import report as drift_report
from gpufleet.drift.history import History
from gpufleet.drift.schedule import SYSTEMD_RUNNING, Schedule, install
from gpufleet.errors import GpufleetError
from gpufleet.facts.catalog import json_safe
from gpufleet.facts.gather import FactRequest, gather_facts
from gpufleet.facts.summary import summarize_facts
from gpufleet.inventory.model import Host, Inventory
from gpufleet.provision.engine import (
    HostRun,
    RunOptions,
    active_roles,
    fact_request,
    provision,
    validate,
)
from gpufleet.provision.plan import ApplyOptions
from gpufleet.report import junit, prometheus, terminal
from gpufleet.report.jsonfile import envelope, write_json
from gpufleet.slurm import drain as scheduler
from gpufleet.target import load_source


@dataclass
class Target:
    """An inventory and the hosts a command acts on."""

    inventory: Inventory
    hosts: list[Host]

# Each command's time budget per host when neither --timeout nor the inventory's
# gpufleet_host_timeout sets one: long enough for its slowest legitimate step (pip of a
# CUDA torch build, an apt transaction, a reboot), short enough to end a hung host.
HOST_TIMEOUTS = {"facts": 300.0, "drift": 900.0, "provision": 7200.0, "conformance": 3600.0,
                 "bootstrap": 7200.0}


@dataclass
class FleetArgs:
    """Fan-out options shared by every command; ``timeout`` is ``--timeout``."""

    forks: int = DEFAULT_FORKS
    timeout: float | None = None
    serial: str | None = None
    max_fail_percent: float | None = None
    accept_new_host_keys: bool = False
    connect_timeout: float = 10.0

    def options(self, target: Target, command: str) -> FleetOptions:
        if self.timeout is not None and not self.timeout > 0:
            raise GpufleetError(f"--timeout must be a positive number of seconds, "
                                f"got {self.timeout:g}")
        return FleetOptions(
            forks=self.forks, host_timeout=self.timeout, default_timeout=HOST_TIMEOUTS[command],
            serial=self.serial, max_fail_percent=self.max_fail_percent,
            connect=ConnectOptions(connect_timeout=self.connect_timeout,
                                   accept_new_host_keys=self.accept_new_host_keys,
                                   known_hosts_base=target.inventory.base))


def load_target(inventory: str, limit: str | None) -> Target:
    """Load the inventory and select hosts; an empty selection is an error."""
    inv = load_source(inventory)
    if not inv.hosts:
        raise GpufleetError(f"inventory {inv.path} has no hosts")
    hosts = inv.select(limit)
    if not hosts:
        raise GpufleetError(f"--limit {limit!r} selects no host of {inv.path}")
    return Target(inv, hosts)


def guarded(func: Any) -> Any:
    """Print a GpufleetError as one line on stderr and return its exit code."""
    def wrapper(*args: Any, **kwargs: Any) -> int:
        try:
            code: int = func(*args, **kwargs)
        except GpufleetError as exc:
            print(f"error: {terminal.plain(exc)}", file=sys.stderr)
            return exc.exit_code
        return code
    wrapper.__doc__ = func.__doc__
    wrapper.__name__ = func.__name__
    return wrapper


def _outcome_code(outcomes: dict[str, Outcome[Any]]) -> int:
    statuses = {o.status for o in outcomes.values()}
    if "failed" in statuses:
        return exitcodes.FAILED
    if statuses & {"unreachable", "skipped"}:
        return exitcodes.UNREACHABLE
    return exitcodes.OK


def _facts_code(outcomes: dict[str, Outcome[Any]]) -> int:
    """``facts`` changes nothing, so a failed host means its facts could not be gathered:
    exit 3, the same as an unreachable one (README's exit code table)."""
    if any(o.status != "ok" for o in outcomes.values()):
        return exitcodes.UNREACHABLE
    return exitcodes.OK


# ---- facts ---------------------------------------------------------------------------------

def facts_request(host: Host) -> FactRequest:
    """What ``facts`` asks each host: the roles' needs, system NCCL and torch."""
    return (fact_request(active_roles(host, role_registry.ALL))
            | role_registry.consistency_request(host))


@guarded
def facts(inventory: str, *, limit: str | None = None, json_path: str | None = None,
          fleet: FleetArgs | None = None, out: TextIO | None = None) -> int:
    """Gather facts from every selected host in one round trip each; print and save them."""
    target = load_target(inventory, limit)
    fleet = fleet or FleetArgs()
    validate(target.hosts, role_registry.ALL)

    def task(host: Host, conn: Connection) -> TaskResult[dict[str, Any]]:
        gathered = gather_facts(conn, facts_request(host))
        return TaskResult({"summary": summarize_facts(gathered), "facts": gathered})

    outcomes = run_fleet(target.hosts, task, fleet.options(target, "facts"),
                         terminal.TerminalProgress("facts"))
    con = terminal.console(out)
    con.print(terminal.facts_table({n: _summary_only(o) for n, o in outcomes.items()}))
    for name, outcome in outcomes.items():
        if outcome.value:
            by_reason: dict[str, list[str]] = {}
            for fact, reason in outcome.value["facts"].absent.items():
                by_reason.setdefault(reason, []).append(fact)
            for reason, names in by_reason.items():
                con.print(f"  [dim]{terminal.markup(name)}: unknown "
                          f"{terminal.markup(', '.join(names))}: {terminal.markup(reason)}[/dim]")
    if json_path:
        write_json(json_path, envelope("gpufleet.facts/1", inventory=str(target.inventory.path),
                                       hosts={n: _facts_json(o) for n, o in outcomes.items()}))
    return _facts_code(outcomes)


def _summary_only(outcome: Outcome[dict[str, Any]]) -> Outcome[Any]:
    value = outcome.value["summary"] if outcome.value else None
    return Outcome(outcome.host, outcome.status, outcome.error, outcome.duration, value,
                   outcome.round_trips)


def _facts_json(outcome: Outcome[dict[str, Any]]) -> dict[str, Any]:
    doc: dict[str, Any] = {"status": outcome.status, "error": outcome.error,
                           "duration_s": round(outcome.duration, 3),
                           "round_trips": outcome.round_trips}
    if outcome.value:
        gathered = outcome.value["facts"]
        doc["summary"] = outcome.value["summary"]
        doc["facts"] = json_safe(gathered.values)
        doc["absent"] = gathered.absent
    return doc


# ---- provision -----------------------------------------------------------------------------

@guarded
def provision_cmd(inventory: str, *, limit: str | None = None, check: bool = False,
                  diff: bool = False, roles: str | None = None, reboot: bool = False,
                  lock_timeout: int = 300, json_path: str | None = None,
                  fleet: FleetArgs | None = None, out: TextIO | None = None) -> int:
    """Plan every selected host and apply the plan (or only show it with ``check``)."""
    target = load_target(inventory, limit)
    fleet = fleet or FleetArgs()
    selected = role_registry.select(roles)
    validate(target.hosts, selected)
    options = RunOptions(check=check, apply=ApplyOptions(reboot=reboot,
                                                         lock_timeout_s=lock_timeout),
                         fleet=fleet.options(target, "provision"))
    outcomes = provision(target.inventory, target.hosts, selected, options,
                         terminal.TerminalProgress("check" if check else "provision"))
    con = terminal.console(out)
    print_plans(con, outcomes, diff, "PLAN" if check else "CHANGES")
    notes = {n: f"reboot required: {o.value.reboot_pending}" for n, o in outcomes.items()
             if o.value and o.value.reboot_pending}
    terminal.print_recap(con, outcomes, notes)
    if json_path:
        write_json(json_path, envelope("gpufleet.provision/1", check=check,
                                       inventory=str(target.inventory.path),
                                       hosts={n: run_json(o) for n, o in outcomes.items()}))
    code = _outcome_code(outcomes)
    if code == exitcodes.OK and notes and not check:
        return exitcodes.REBOOT_REQUIRED
    return code


def print_plans(con: Any, outcomes: dict[str, Outcome[HostRun]], diff: bool, title: str) -> None:
    """Each host's plan (check) or applied changes."""
    for name, outcome in outcomes.items():
        run = outcome.value
        if run is None or run.plan is None or run.plan.empty:
            continue
        con.print(f"[bold]{title} {terminal.markup(name)}[/bold] "
                  f"({len(run.plan.changes)} change(s))")
        terminal.print_plan(con, run.plan, diff, None if title == "PLAN" else run.applied,
                            bool(run.reboot_pending))


def run_json(outcome: Outcome[HostRun]) -> dict[str, Any]:
    """One host's provisioning result for the JSON report."""
    run = outcome.value
    doc: dict[str, Any] = {"status": outcome.status, "error": outcome.error,
                           "duration_s": round(outcome.duration, 3)}
    if run and run.plan:
        applied = {id(c) for c in run.applied}
        doc["changes"] = [dict(c.to_dict(), applied=id(c) in applied) for c in run.plan.changes]
        doc["reboot_required"] = run.reboot_pending
        doc["rebooted"] = run.rebooted
    return doc


# ---- drift ---------------------------------------------------------------------------------

@dataclass
class DriftOutputs:
    """Where drift writes its reports."""

    json_path: str | None = None
    junit_path: str | None = None
    prometheus_path: str | None = None
    report_dir: str = "reports/drift"
    keep: int = 30


@guarded
def drift_cmd(inventory: str, *, limit: str | None = None, roles: str | None = None,
              outputs: DriftOutputs | None = None, remediate: bool = False,
              reboot: bool = False, diff: bool = True, fleet: FleetArgs | None = None,
              out: TextIO | None = None, drain_drifted: bool = False) -> int:
    """Report each host's distance from the inventory and its group; never writes on nodes
    (unless ``remediate`` asks to apply the plan to drifted hosts afterwards)."""
    target = load_target(inventory, limit)
    fleet = fleet or FleetArgs()
    outputs = outputs or DriftOutputs()
    selected = role_registry.select(roles)
    validate(target.hosts, selected)
    if drain_drifted:
        scheduler.check(target.hosts)
    started = time.time()
    options = RunOptions(check=True, fleet=fleet.options(target, "drift"),
                         extra_facts=role_registry.consistency_request)
    outcomes = provision(target.inventory, target.hosts, selected, options,
                         terminal.TerminalProgress("drift"))
    hosts = {name: drift.host_drift(o) for name, o in outcomes.items()}
    facts = {n: o.value.facts for n, o in outcomes.items() if o.value and o.value.facts}
    inconsistencies = drift.check_consistency(target.inventory, facts)
    managed = {n: set(o.value.plan.roles) for n, o in outcomes.items()
               if o.value and o.value.plan}
    drift.add_consistency_items(hosts, inconsistencies, managed)
    history = History(Path(outputs.report_dir) / _slug(target.inventory.path), "drift",
                      outputs.keep)
    checked = {r.name for r in selected}
    new, resolved = drift.mark_new(hosts, history.last_items(), checked)
    run = drift_report.DriftRun(str(target.inventory.path), target.inventory.digest(), hosts,
                                inconsistencies, new, resolved, started,
                                time.time() - started,
                                sorted(checked | {drift.CONSISTENCY_ROLE}))
    if remediate:
        run.remediation = _remediate(target, selected, hosts, fleet, reboot)
    document = drift_report.to_json(run)
    history.save(document)
    if outputs.json_path:
        write_json(outputs.json_path, document)
    if outputs.junit_path:
        junit.write(outputs.junit_path, "gpufleet.drift", drift_report.to_junit(run))
    if outputs.prometheus_path:
        prometheus.write(outputs.prometheus_path, drift_report.to_metrics(run))
    con = terminal.console(out)
    drift_report.print_report(con, run, diff)
    if drain_drifted:
        _drain_drifted(target, hosts, run.roles_checked, con)
    return _drift_code(run)


def _drain_drifted(target: Target, hosts: dict[str, drift.HostDrift], roles: list[str],
                   con: Any) -> None:
    """Drain drifted (and unreachable) hosts, naming the first item; resume the clean ones
    that drift drained for one of the roles checked now."""
    failed: list[tuple[Host, str, str]] = []
    cleared: list[tuple[Host, list[str]]] = []
    for host in target.hosts:
        entry = hosts[host.name]
        if entry.status == "clean":
            cleared.append((host, [f"drift/{r}/" for r in roles]
                            + ["drift/unreachable:", "drift/error:"]))
        elif entry.items:
            item = entry.items[0]
            more = f" (+{len(entry.items) - 1} more)" if len(entry.items) > 1 else ""
            failed.append((host, f"drift/{item.item}",
                           f"desired {item.desired}, actual {item.actual}{more}"))
        else:
            failed.append((host, f"drift/{entry.status}", str(entry.error)))
    _print_actions(con, scheduler.drain(failed) | scheduler.resume(cleared))


def _print_actions(con: Any, actions: dict[str, str]) -> None:
    for name, action in actions.items():
        con.print(terminal.markup(f"  scheduler {name}: {action}"))


def _slug(path: Path) -> str:
    """A directory name for an inventory's drift history."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in str(path)).strip("_.")


def _remediate(target: Target, selected: list[Any], hosts: dict[str, drift.HostDrift],
               fleet: FleetArgs, reboot: bool) -> dict[str, dict[str, Any]]:
    """Apply the plan to drifted hosts, honouring serial and max-fail-percent."""
    drifted = [h for h in target.hosts if hosts[h.name].status == "drifted"]
    if not drifted:
        return {}
    options = RunOptions(apply=ApplyOptions(reboot=reboot),
                         fleet=fleet.options(target, "provision"))
    outcomes = provision(target.inventory, drifted, selected, options,
                         terminal.TerminalProgress("remediate"))
    return {name: {"status": "reboot required" if o.value and o.value.reboot_pending
                   else o.status, "error": o.error,
                   "applied": [c.item for c in (o.value.applied if o.value else [])
                               if not c.pending_reboot]}
            for name, o in outcomes.items()}


def _drift_code(run: drift_report.DriftRun) -> int:
    if run.count("unreachable") or run.count("error"):
        return exitcodes.UNREACHABLE
    if run.remediation:
        failed = any(r["status"] not in ("ok", "changed") for r in run.remediation.values())
        unfixable = any(i.role == drift.CONSISTENCY_ROLE
                        for h in run.hosts.values() for i in h.items)
        return exitcodes.FAILED if failed or unfixable else exitcodes.OK
    return exitcodes.FAILED if run.items else exitcodes.OK


@guarded
def schedule_cmd(schedule: Schedule, unit_dir: str | None = None,
                 out: TextIO | None = None) -> int:
    """Install the nightly drift timer (systemd), or print the cron line without systemd."""
    con = terminal.console(out)
    if unit_dir is None and not SYSTEMD_RUNNING.is_dir():
        con.print("systemd is not running on this machine; add this line to "
                  "/etc/cron.d/gpufleet-drift instead:")
        con.print(terminal.markup(schedule.cron_line()), soft_wrap=True)
        return exitcodes.OK
    for line in install(schedule, Path(unit_dir) if unit_dir else Path("/etc/systemd/system")):
        con.print(terminal.markup(line))
    con.print(f"nightly at {schedule.at}: {terminal.markup(schedule.command)}")
    return exitcodes.OK


# ---- conformance ---------------------------------------------------------------------------

SUITES = Path(str(resources.files("gpufleet.suites")))
SUITE_SETS = {
    "conformance": ("stack", "firewall", "reachability", "allreduce", "rdma", "gpu"),
    "acceptance": ("ddp", "thermal", "storage", "host_sizing", "p2p"),
}


def suite_files(suites: str | None) -> list[str]:
    """The check files of the named suites or sets (``conformance`` when None; ``all``)."""
    available = sorted(p.stem.removeprefix("test_")
                       for p in SUITES.glob("test_*.py"))
    sets = dict(SUITE_SETS, all=tuple(available))
    wanted: list[str] = []
    for name in [s.strip() for s in (suites or "conformance").split(",") if s.strip()]:
        wanted += [s for s in sets.get(name, (name,)) if s not in wanted]
    unknown = [s for s in wanted if s not in available]
    if unknown:
        raise GpufleetError(f"unknown suite(s) {', '.join(unknown)}; suites are "
                            f"{', '.join(available)}")
    return [str(SUITES / f"test_{s}.py") for s in wanted]


@guarded
def conformance_cmd(inventory: str, *, limit: str | None = None, suites: str | None = None,
                    junit_path: str | None = None, json_path: str | None = None,
                    pairs: str = "auto", with_nccl_tests: bool = False,
                    fleet: FleetArgs | None = None, extra_args: list[str] | None = None,
                    drain_failed: bool = False, launcher: str = "ssh",
                    partition: str | None = None, record_baseline: bool = False,
                    compare_baseline: bool = False) -> int:
    """Run the conformance suites as pytest; the exit code is non-zero on any failure.
    ``launcher`` ``slurm`` reaches the nodes as steps of one Slurm allocation instead of SSH."""
    import pytest  # noqa: PLC0415 - only this command needs it; every other one starts faster
    target = load_target(inventory, limit)
    fleet = fleet or FleetArgs()
    fleet.options(target, "conformance")
    validate(target.hosts, role_registry.ALL)
    verdict.check_hosts(target.hosts)
    check_allreduce_variables(target.hosts)
    if drain_failed:
        scheduler.check(target.hosts)
    args = [*suite_files(suites), "-p", "gpufleet.conformance.plugin", "-p", "no:cacheprovider",
            "--rootdir", str(SUITES), "-q", "--tb=no", "--no-header", "-rN",
            "--gpufleet-inventory", inventory, "--gpufleet-pairs", pairs,
            "--gpufleet-forks", str(fleet.forks),
            "--gpufleet-connect-timeout", str(fleet.connect_timeout)]
    if fleet.timeout is not None:
        args += ["--gpufleet-timeout", str(fleet.timeout)]
    if limit:
        args += ["--gpufleet-limit", limit]
    if with_nccl_tests:
        args.append("--gpufleet-with-nccl-tests")
    args += ["--gpufleet-record-baseline"] * record_baseline
    args += ["--gpufleet-compare-baseline"] * compare_baseline
    if launcher not in ("ssh", "slurm"):
        raise GpufleetError(f"--launcher must be ssh or slurm, got {launcher!r}")
    args += ["--gpufleet-launcher", launcher]
    if partition:
        args += ["--gpufleet-partition", partition]
    if drain_failed and not json_path:
        json_path = str(Path(tempfile.mkdtemp(prefix="gpufleet-conformance-")) / "c.json")
    if json_path:
        args += ["--gpufleet-json", json_path]
    if junit_path:
        args += [f"--junitxml={junit_path}", "-o", "junit_family=xunit1",
                 "-o", "junit_suite_name=gpufleet.conformance"]
    code = int(pytest.main([*args, *(extra_args or [])]))
    if code not in (0, 1):
        raise GpufleetError(f"the conformance run could not complete (pytest exit {code})")
    if drain_failed and json_path:
        _drain_by_results(target, Path(json_path), terminal.console(None))
    return code


def _drain_by_results(target: Target, report: Path, con: Any) -> None:
    """Drain every node with a failed check (the first one names the reason); resume the
    nodes without a failure that conformance drained for a check that now passed on them
    (or, for a check run once for the fleet, passed for the fleet)."""
    document = json.loads(report.read_text())
    results = document.get("results", [])
    # Nodes the Slurm launcher could not allocate were not measured: their state stays.
    left_out = document.get("data", {}).get("launcher", {}).get("slurm", {}).get("left_out", {})
    hosts = {h.name: h for h in target.hosts if h.name not in left_out}
    failed: dict[str, tuple[Host, str, str]] = {}
    passed: dict[str, list[str]] = {name: [] for name in hosts}
    for r in results:
        check = f"conformance/{r['suite']}/{r['check'].removeprefix('test_')}"
        if r["outcome"] == "fail" and r["host"] in hosts:
            failed.setdefault(r["host"], (hosts[r["host"]], check, r["message"]))
        elif r["outcome"] == "pass":
            for name in hosts if r["host"] == "fleet" else [r["host"]]:
                passed.get(name, []).append(f"{check}:")
    cleared = [(host, passed[name]) for name, host in hosts.items() if name not in failed]
    _print_actions(con, scheduler.drain(list(failed.values())) | scheduler.resume(cleared))


# ---- bootstrap -----------------------------------------------------------------------------

@guarded
def bootstrap_cmd(inventory: str, options: BootstrapOptions, json_path: str | None = None,
                  out: TextIO | None = None) -> int:
    """Take a new node to certified-ready and report each step."""
    inv = load_source(inventory)
    result = bootstrap(inv, inventory, options, conformance_cmd)
    con = terminal.console(out)
    con.print(f"[bold]BOOTSTRAP {terminal.markup(result.host)}[/bold]")
    styles = {"ok": "green", "failed": "red bold", "skipped": "dim"}
    for step in result.steps:
        style = styles[step.status]
        con.print(f"  {step.name:<10} [{style}]{step.status:<8}[/{style}] {step.duration:6.1f}s  "
                  f"{terminal.markup(step.detail)}")
    verdict = "[green]READY[/green]" if result.ready else \
        f"[red]NOT READY[/red]: {terminal.markup(result.reason)}"
    con.print(f"{terminal.markup(result.host)}: {verdict}")
    if json_path:
        write_json(json_path, envelope("gpufleet.bootstrap/1", inventory=str(inv.path),
                                       **result.to_dict()))
    return result.exit_code
