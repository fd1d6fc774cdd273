"""The commands behind the ``gpufleet`` console command and the invoke tasks.

Each command checks its input (inventory, variables, flags, output paths) before any host
is contacted, calls the typed core (``provision``, ``check_fleet``, ``run_suites``,
``bootstrap``), prints its report, writes its outputs and returns its exit code. Nothing
here knows about invoke.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from gpufleet import exitcodes
from gpufleet import roles as role_registry
from gpufleet.bootstrap import BootstrapOptions, bootstrap
from gpufleet.conformance import container, registry
from gpufleet.conformance import junit as conformance_junit
from gpufleet.conformance import metrics as conformance_metrics
from gpufleet.conformance.results import FLEET, ConformanceReport
from gpufleet.conformance.runner import ConformanceOptions, run_suites
from gpufleet.connect.connection import Connection, ConnectOptions
from gpufleet.connect.fleet import (
    DEFAULT_FORKS,
    FleetOptions,
    Outcome,
    TaskResult,
    run_fleet,
    summarize,
)
from gpufleet.drift import report as drift_report
from gpufleet.drift.compare import HostDrift
from gpufleet.drift.history import History
from gpufleet.drift.run import DriftOptions, DriftRun, check_fleet, exit_code, history_dir
from gpufleet.drift.run import remediate as remediate_drift
from gpufleet.drift.schedule import SYSTEMD_RUNNING, Schedule, install
from gpufleet.errors import GpufleetError
from gpufleet.facts.catalog import json_safe
from gpufleet.facts.gather import FactRequest, gather_facts
from gpufleet.facts.summary import summarize_facts
from gpufleet.inventory import listing
from gpufleet.inventory.model import Host
from gpufleet.inventory.target import Target
from gpufleet.provision.engine import HostRun, RunOptions, active_roles, fact_request, provision
from gpufleet.provision.engine import validate as validate_roles
from gpufleet.provision.plan import ApplyOptions
from gpufleet.report import html, junit, prometheus, terminal
from gpufleet.report.jsonfile import envelope, write_json
from gpufleet.report.outputs import check_writable, to_stdout
from gpufleet.slurm import drain as scheduler
from gpufleet.slurm.client import RunFindings
from gpufleet.sources import load_source, load_target

# Each command's time budget per host when neither --timeout nor the inventory's
# gpufleet_host_timeout sets one: long enough for its slowest legitimate step (pip of a
# CUDA torch build, an apt transaction, a reboot), short enough to end a hung host.
HOST_TIMEOUTS = {"facts": 300.0, "drift": 900.0, "provision": 7200.0, "conformance": 3600.0,
                 "bootstrap": 7200.0, "tune": 14400.0}


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
        if not self.forks > 0:
            raise GpufleetError(f"--forks must be a positive number, got {self.forks}")
        return FleetOptions(
            forks=self.forks, host_timeout=self.timeout, default_timeout=HOST_TIMEOUTS[command],
            serial=self.serial, max_fail_percent=self.max_fail_percent,
            connect=ConnectOptions(connect_timeout=self.connect_timeout,
                                   accept_new_host_keys=self.accept_new_host_keys,
                                   known_hosts_base=target.inventory.base))


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


def _console(out: TextIO | None, *outputs: str | None) -> Any:
    """The terminal report's console: standard error when an output goes to stdout."""
    return terminal.console(out or (sys.stderr if to_stdout(*outputs) else None))


def _check_outputs(**paths: str | None) -> None:
    """Every output path checked writable before any host is contacted."""
    for flag, path in paths.items():
        check_writable(path, "--" + flag.replace("_", "-"))


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


# ---- hosts and inventory, without contacting anything --------------------------------------

@guarded
def list_hosts(inventory: str | None, *, limit: str | None = None,
               out: TextIO | None = None) -> int:
    """The hosts a command would act on, as ``ansible --list-hosts`` prints them."""
    target = load_target(inventory, limit)
    stream = out or sys.stdout
    stream.write(f"  hosts ({len(target.hosts)}):\n")
    for host in target.hosts:
        stream.write(f"    {terminal.plain(host.name)}\n")
    return exitcodes.OK


@guarded
def inventory_cmd(inventory: str | None, *, mode: str = "list", host: str | None = None,
                  origins: bool = False, out: TextIO | None = None) -> int:
    """What gpufleet resolved from the inventory: ``list`` (ansible-inventory --list JSON),
    ``graph`` (the group tree) or ``host`` (one host's variables, with ``origins`` where
    each is set). Templates are rendered, secrets redacted; no host is contacted."""
    inv = load_source(inventory)
    stream = out or sys.stdout
    if mode == "graph":
        stream.write(terminal.plain(listing.graph(inv), newlines=True))
        return exitcodes.OK
    if mode == "host":
        if not host or host not in inv.hosts:
            raise GpufleetError(f"--host {host!r} is not a host of {inv.path}")
        variables = listing.host_vars(inv.hosts[host])
        doc: Any = ({k: {"value": v, "origin": listing.origins(inv.hosts[host])[k]}
                     for k, v in variables.items()} if origins else variables)
    elif mode == "list":
        doc = listing.listing(inv)
    else:
        raise GpufleetError(f"inventory: give one of --list, --graph or --host HOST, not {mode}")
    stream.write(listing.dumps(doc) + "\n")
    return exitcodes.OK


# ---- facts ---------------------------------------------------------------------------------

def facts_request(host: Host) -> FactRequest:
    """What ``facts`` asks each host: the roles' needs, system NCCL and torch."""
    return (fact_request(active_roles(host, role_registry.ALL))
            | role_registry.consistency_request(host))


@guarded
def facts(inventory: str | None, *, limit: str | None = None, json_path: str | None = None,
          fleet: FleetArgs | None = None, out: TextIO | None = None) -> int:
    """Gather facts from every selected host in one round trip each; print and save them."""
    target = load_target(inventory, limit)
    fleet = fleet or FleetArgs()
    options = fleet.options(target, "facts")
    validate_roles(target.hosts, role_registry.ALL)
    _check_outputs(json=json_path)

    def task(host: Host, conn: Connection) -> TaskResult[dict[str, Any]]:
        gathered = gather_facts(conn, facts_request(host))
        return TaskResult({"summary": summarize_facts(gathered), "facts": gathered})

    started = time.monotonic()
    outcomes = run_fleet(target.hosts, task, options, terminal.TerminalProgress("facts"))
    duration = time.monotonic() - started
    con = _console(out, json_path)
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
        write_json(json_path, envelope(
            "gpufleet.facts/1", inventory=str(target.inventory.path),
            inventory_digest=target.inventory.digest(), duration_s=duration,
            summary=facts_summary(outcomes),
            hosts={n: _facts_json(o) for n, o in outcomes.items()}))
    return _facts_code(outcomes)


def facts_summary(outcomes: dict[str, Outcome[Any]]) -> dict[str, int]:
    """The facts report's counts: hosts, and how many ended each way (``ok``: gathered)."""
    counts = summarize(outcomes)
    return {"hosts": len(outcomes), **{k: n for k, n in counts.items() if k != "changed"}}


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
def provision_cmd(inventory: str | None, *, limit: str | None = None, check: bool = False,
                  diff: bool = False, roles: str | None = None, reboot: bool = False,
                  lock_timeout: int = 300, json_path: str | None = None,
                  fleet: FleetArgs | None = None, out: TextIO | None = None) -> int:
    """Plan every selected host and apply the plan (or only show it with ``check``)."""
    target = load_target(inventory, limit)
    fleet = fleet or FleetArgs()
    selected = role_registry.select(roles)
    validate_roles(target.hosts, selected)
    if lock_timeout < 0:
        raise GpufleetError(f"--lock-timeout must be 0 or more seconds, got {lock_timeout}")
    _check_outputs(json=json_path)
    options = RunOptions(check=check, apply=ApplyOptions(reboot=reboot,
                                                         lock_timeout_s=lock_timeout),
                         fleet=fleet.options(target, "provision"))
    started = time.monotonic()
    outcomes = provision(target.inventory, target.hosts, selected, options,
                         terminal.TerminalProgress("check" if check else "provision"))
    duration = time.monotonic() - started
    con = _console(out, json_path)
    print_plans(con, outcomes, diff, "PLAN" if check else "CHANGES")
    notes = {n: f"reboot required: {o.value.reboot_pending}" for n, o in outcomes.items()
             if o.value and o.value.reboot_pending}
    terminal.print_recap(con, outcomes, notes)
    if json_path:
        write_json(json_path, envelope(
            "gpufleet.provision/1", inventory=str(target.inventory.path),
            inventory_digest=target.inventory.digest(), duration_s=duration,
            summary=provision_summary(outcomes), check=check,
            hosts={n: run_json(o) for n, o in outcomes.items()}))
    code = _outcome_code(outcomes)
    if code == exitcodes.OK and notes and not check:
        return exitcodes.REBOOT_REQUIRED
    return code


def print_plans(con: Any, outcomes: dict[str, Outcome[HostRun]], diff: bool, title: str) -> None:
    """Each host's plan (check) or applied changes; hosts with the same are printed once,
    as a host set."""
    def shown(name: str) -> tuple[Any, ...]:
        run = outcomes[name].value
        assert run is not None and run.plan is not None
        done = {id(c) for c in run.applied}
        return (tuple((terminal.change_line(c), c.diff, id(c) in done)
                      for c in run.plan.changes), bool(run.reboot_pending))

    planned = [n for n, o in outcomes.items()
               if o.value is not None and o.value.plan is not None and not o.value.plan.empty]
    for hosts, _, members in terminal.fold(planned, shown):
        run = outcomes[members[0]].value
        assert run is not None and run.plan is not None
        con.print(f"[bold]{title} {terminal.markup(hosts)}[/bold] "
                  f"({len(run.plan.changes)} change(s))")
        terminal.print_plan(con, run.plan, diff, None if title == "PLAN" else run.applied,
                            bool(run.reboot_pending))


def provision_summary(outcomes: dict[str, Outcome[HostRun]]) -> dict[str, int]:
    """The provision report's counts: hosts per outcome as the recap counts them, hosts
    with a reboot pending, and the changes planned and applied (as the hosts' entries
    list them)."""
    counts = {"hosts": len(outcomes), **summarize(outcomes), "reboot_required": 0,
              "changes": 0, "applied": 0}
    for outcome in outcomes.values():
        run = outcome.value
        if run is None:
            continue
        counts["reboot_required"] += bool(run.reboot_pending)
        if run.plan:
            applied = {id(c) for c in run.applied}
            counts["changes"] += len(run.plan.changes)
            counts["applied"] += sum(id(c) in applied for c in run.plan.changes)
    return counts


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
    html_path: str | None = None


@guarded
def drift_cmd(inventory: str | None, *, limit: str | None = None, roles: str | None = None,
              outputs: DriftOutputs | None = None, remediate: bool = False,
              reboot: bool = False, diff: bool = True, fleet: FleetArgs | None = None,
              out: TextIO | None = None, drain_drifted: bool = False) -> int:
    """Report each host's distance from the inventory and its group; never writes on nodes
    (unless ``remediate`` asks to apply the plan to drifted hosts afterwards)."""
    target = load_target(inventory, limit)
    fleet = fleet or FleetArgs()
    outputs = outputs or DriftOutputs()
    selected = role_registry.select(roles)
    validate_roles(target.hosts, selected)
    if outputs.keep < 1:
        raise GpufleetError(f"--keep must be 1 or more, got {outputs.keep}")
    _check_outputs(json=outputs.json_path, junit=outputs.junit_path,
                   prometheus=outputs.prometheus_path, html=outputs.html_path)
    check_writable(outputs.report_dir, "--report-dir", directory=True)
    if drain_drifted:
        scheduler.check(target.hosts, "--drain-drifted")
    label = _metrics_target(target, outputs.prometheus_path, "drift")
    history = History(history_dir(Path(outputs.report_dir), target), "drift", outputs.keep)
    options = DriftOptions(selected, fleet.options(target, "drift"), history)
    remediation = fleet.options(target, "provision") if remediate else None
    run = check_fleet(target, options, terminal.TerminalProgress("drift"))
    if remediation is not None:
        remediate_drift(target, run, options, fleet=remediation, reboot=reboot,
                        progress=terminal.TerminalProgress("remediate"))
    document = drift_report.to_json(run)
    history.save(document)
    if outputs.json_path:
        write_json(outputs.json_path, document)
    if outputs.junit_path:
        junit.write(outputs.junit_path, drift_report.to_junit(run))
    con = _console(out, outputs.json_path, outputs.junit_path, outputs.prometheus_path,
                   outputs.html_path)
    drift_report.print_report(con, run, diff)
    if drain_drifted:
        _drain_drifted(target, run, con)
    if outputs.prometheus_path and label is not None:
        prometheus.update(outputs.prometheus_path, label, "drift", bool(limit),
                          lambda previous: drift_report.to_metrics(
                              run, prometheus.Textfile(label, "drift"), previous))
    if outputs.html_path:
        html.write_report(outputs.html_path,
                          lambda: html.render_drift(document, history.documents()))
    return exit_code(run)


def _metrics_target(target: Target, path: str | None, command: str) -> str | None:
    """The ``inventory`` label of the textfile, with the file it will replace checked
    before any host is contacted (it is read again, under its lock, when it is written)."""
    if not path:
        return None
    label = prometheus.inventory_label(target.inventory, target.hosts)
    prometheus.replaced(path, label, command)
    return label


def _drain_drifted(target: Target, run: DriftRun, con: Any) -> None:
    """Keep drift's findings in each host's drain reason: one per drifted role (and one for
    a host that could not be checked); the roles checked clean clear theirs."""
    results: list[tuple[Host, list[RunFindings]]] = []
    for host in target.hosts:
        entry: HostDrift = run.hosts[host.name]
        if entry.status in ("unreachable", "error"):
            results.append((host, [RunFindings("drift", {entry.status: str(entry.error)})]))
            continue
        failed: dict[str, str] = {}
        for item in entry.items:
            failed.setdefault(item.role, f"{item.resource}: desired {item.desired}, actual "
                                         f"{item.actual}")
        passed = [*run.roles_checked, "unreachable", "error"]
        results.append((host, [RunFindings("drift", failed, passed)]))
    _print_actions(con, scheduler.update(results))


def _print_actions(con: Any, actions: dict[str, str]) -> None:
    for name, action in actions.items():
        con.print(terminal.markup(f"  scheduler {name}: {action}"))


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

def _tune_group(target: Target, group: str | None) -> str:
    """The group whose ``nccl_env`` the winner goes to: ``group`` (it must hold every
    selected host), else the smallest group but ``all`` that does, else ``all``."""
    inventory, selected = target.inventory, {h.name for h in target.hosts}
    if group is not None:
        if group not in inventory.groups:
            raise GpufleetError(f"--group {group!r}: no such group in {inventory.path}")
        if not selected <= inventory.groups[group]:
            missing = sorted(selected - inventory.groups[group])
            raise GpufleetError(f"--group {group!r} does not hold every selected host "
                                f"({', '.join(missing[:5])} not in it)")
        return group
    holding = sorted((len(members), name) for name, members in inventory.groups.items()
                     if name not in ("all", "ungrouped") and selected <= members)
    return holding[0][1] if holding else "all"


@guarded
def tune_cmd(inventory: str | None, *, limit: str | None = None, group: str | None = None,
             diff_path: str | None = None, fleet: FleetArgs | None = None,
             out: TextIO | None = None) -> int:
    """Measure the DDP and AllReduce probes under the current environment and each candidate
    across the selected nodes; print the table and the winner's ``nccl_env`` diff (``diff_path``:
    also written there). 0 when measured (a winner or none), 1 when the current setting
    could not be measured, 3 when a node was unreachable."""
    # The session brings in testinfra: only this command and conformance load it.
    from gpufleet import tune as tuning  # noqa: PLC0415
    from gpufleet.conformance.session import (  # noqa: PLC0415
        ConformanceSession,
        SessionOptions,
    )

    out = out or sys.stdout
    target = load_target(inventory, limit)
    wanted = tuning.settings(target.hosts[0])
    registry.validate(target.hosts, [registry.suite("allreduce"), registry.suite("ddp")])
    chosen = _tune_group(target, group)
    path = tuning.group_file(target.inventory.base, chosen)
    _check_outputs(diff=diff_path)
    fleet = fleet or FleetArgs()
    session = ConformanceSession.start(target.inventory, target.hosts,
                                       SessionOptions(fleet=fleet.options(target, "tune")))
    try:
        unreachable = [n for n in session.nodes.values() if n.facts is None]
        for node in unreachable:
            print(f"{node.name}: {node.error}", file=sys.stderr)
        nodes = session.ready()
        if not nodes:
            return exitcodes.UNREACHABLE
        print(f"tune: {len(nodes)} node(s), {wanted.repeats} rounds; the current setting is "
              f"what the nodes have (group {chosen}'s nccl_env)", file=out)
        measured = tuning.tune(nodes, wanted, progress=lambda r, c: print(
            f"  round {r}: {c.name}", file=sys.stderr))
        best = tuning.winner(measured[0], measured[1:])
        print(tuning.table(measured, best), file=out)
        if measured[0].median() is None:
            print(f"the current setting could not be measured: {measured[0].errors[0]}",
                  file=out)
            return exitcodes.FAILED
        if best is None:
            print("no winner: no candidate beats the current setting by more than the noise",
                  file=out)
        else:
            (key, value), = best.candidate.change.items()
            proposal = tuning.propose(target.inventory, chosen, [n.host for n in nodes],
                                      key, value)
            print(f"winner: {best.candidate.name} ({tuning.gain(measured[0], best):+.1%} DDP "
                  f"samples/s); apply to {path}:", file=out)
            for note in proposal.notes:
                print(f"note: {terminal.plain(note)}", file=out)
            print(proposal.patch, file=out, end="")
            if diff_path and diff_path != "-" and proposal.patch:
                Path(diff_path).write_text(proposal.patch)
        return exitcodes.UNREACHABLE if unreachable else exitcodes.OK
    finally:
        session.close()


@guarded
def conformance_cmd(inventory: str | None, *, limit: str | None = None,
                    suites: str | None = None, junit_path: str | None = None,
                    json_path: str | None = None, pairs: str = "auto",
                    with_nccl_tests: bool = False, fleet: FleetArgs | None = None,
                    extra_args: list[str] | None = None, drain_failed: bool = False,
                    launcher: str = "ssh", partition: str | None = None,
                    record_baseline: bool = False, compare_baseline: bool = False,
                    prometheus_path: str | None = None, html_path: str | None = None,
                    image: str | None = None, out: TextIO | None = None) -> int:
    """Run the conformance suites; the exit code is 1 when any check failed, and for an
    acceptance run 3 when a node measured none of the acceptance figures. ``image``
    runs the image suite and the allreduce, ddp and p2p probes in that image on every
    selected node (``container_image`` for this run). ``launcher``
    ``slurm`` reaches the nodes as job steps of one Slurm allocation instead of SSH
    (node-local commands of many nodes in one step; ``slurm-per-node``: a step per
    command). With
    ``html_path``, an acceptance run (``acceptance`` or ``all``) writes the acceptance
    report, any other run the conformance report."""
    target = load_target(inventory, limit)
    fleet = fleet or FleetArgs()
    _check_outputs(json=json_path, junit=junit_path, prometheus=prometheus_path,
                   html=html_path)
    if image is not None:
        container.check_reference(image, "--image")
        for host in target.hosts:
            host.vars["container_image"] = image
    label = _metrics_target(target, prometheus_path, "conformance")
    if drain_failed:
        scheduler.check(target.hosts, "--drain-failed")
    artifacts = (Path(json_path).resolve().parent / "conformance-artifacts"
                 if json_path and json_path != "-" else Path("reports/conformance-artifacts"))
    console = (out or sys.stderr) if to_stdout(json_path, junit_path, prometheus_path,
                                               html_path) else out
    options = ConformanceOptions(
        suites=tuple((suites or "conformance").split(",")), pairs=pairs,
        with_nccl_tests=with_nccl_tests, record_baseline=record_baseline,
        compare_baseline=compare_baseline, launcher=launcher, partition=partition,
        source=inventory, fleet=fleet.options(target, "conformance"), artifacts=artifacts,
        console=console, pytest_args=tuple(extra_args or ()))
    report = run_suites(target, options)
    document = report.to_json()
    acceptance = bool({"acceptance", "all"} & set(options.suites))
    if acceptance:
        document["acceptance"] = html.acceptance([document]).to_json()
    if json_path:
        write_json(json_path, document)
    if junit_path:
        junit.write(junit_path, conformance_junit.to_junit(report))
    if drain_failed:
        drain_by_results(target, report, _console(out, json_path, junit_path, prometheus_path,
                                                  html_path))
    if prometheus_path and label is not None:
        prometheus.update(prometheus_path, label, "conformance", bool(limit),
                          lambda previous: conformance_metrics.to_metrics(
                              report, prometheus.Textfile(label, "conformance"), previous))
    if html_path:
        html.write_report(html_path, lambda: html.render_acceptance([document]) if acceptance
                          else html.render_conformance(document))
    if report.failed:
        return exitcodes.FAILED
    if acceptance and document["acceptance"]["verdict"] == html.NOT_MEASURED:
        return exitcodes.UNREACHABLE  # a node measured nothing: it is not accepted
    return exitcodes.OK


def drain_by_results(target: Target, report: ConformanceReport, con: Any) -> None:
    """Keep conformance's findings in each node's drain reason: one per failed check; the
    checks that passed on the node now (or, run once for the fleet, passed for the fleet)
    clear theirs."""
    # Nodes the Slurm launcher could not allocate were not measured: their state stays.
    hosts = [h for h in target.hosts if h.name not in report.left_out]
    fleet_passed = {r.name for r in report.results if r.host == FLEET and r.outcome == "pass"}
    results = []
    for host in hosts:
        mine = [r for r in report.results if r.host == host.name]
        failed: dict[str, str] = {}
        for r in mine:
            if r.outcome == "fail":
                failed.setdefault(r.name, r.message)
        passed = fleet_passed | {r.name for r in mine if r.outcome == "pass"}
        results.append((host, [RunFindings("conformance", failed, passed)]))
    _print_actions(con, scheduler.update(results))


# ---- bootstrap -----------------------------------------------------------------------------

@guarded
def bootstrap_cmd(inventory: str | None, options: BootstrapOptions,
                  json_path: str | None = None, out: TextIO | None = None,
                  html_path: str | None = None) -> int:
    """Take a new node to certified-ready and report each step; ``html_path``: the
    acceptance report of its certification."""
    inv = load_source(inventory)
    _check_outputs(json=json_path, html=html_path)
    started = time.monotonic()
    result = bootstrap(inv, options, source=inventory)
    duration = time.monotonic() - started
    con = _console(out, json_path, html_path)
    con.print(f"[bold]BOOTSTRAP {terminal.markup(result.host)}[/bold]")
    styles = {"ok": "green", "failed": "red bold", "skipped": "dim"}
    for step in result.steps:
        style = styles[step.status]
        con.print(f"  {step.name:<10} [{style}]{step.status:<8}[/{style}] {step.duration:6.1f}s  "
                  f"{terminal.markup(step.detail)}")
    verdict = "[green]READY[/green]" if result.ready else \
        f"[red]NOT READY[/red]: {terminal.markup(result.reason)}"
    con.print(f"{terminal.markup(result.host)}: {verdict}")
    document = envelope("gpufleet.bootstrap/1", inventory=str(inv.path),
                        inventory_digest=inv.digest(), duration_s=duration,
                        summary=result.summary(), **result.to_dict())
    if json_path:
        write_json(json_path, document)
    if html_path:
        html.write_report(html_path, lambda: html.render_acceptance(
            [r.to_json() for r in result.reports], bootstrap=[document]))
    return result.exit_code
