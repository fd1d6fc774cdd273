"""The commands behind the ``gpufleet`` console command and the invoke tasks.

Each command checks its input (inventory, variables, flags, output paths) before any host
is contacted, calls the typed core beside the command's own modules (``facts.report``,
``provision``, ``run_drift``, ``run_suites``, ``tune``, ``bootstrap``), prints its report,
writes its outputs and returns its exit code. Nothing here knows about invoke.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from gpufleet import exitcodes, watch
from gpufleet import roles as role_registry
from gpufleet.bootstrap import BootstrapOptions, bootstrap
from gpufleet.conformance import drain as conformance_drain
from gpufleet.conformance import junit as conformance_junit
from gpufleet.conformance import metrics as conformance_metrics
from gpufleet.conformance.options import ConformanceOptions
from gpufleet.conformance.runner import run_suites
from gpufleet.connect.connection import ConnectOptions
from gpufleet.connect.fleet import DEFAULT_FORKS, FleetOptions, Outcome
from gpufleet.drift import drain as drift_drain
from gpufleet.drift import report as drift_report
from gpufleet.drift.history import History
from gpufleet.drift.run import DriftOptions, exit_code, history_dir, run_drift
from gpufleet.drift.schedule import SYSTEMD_RUNNING, Schedule, install
from gpufleet.errors import GpufleetError
from gpufleet.facts import report as facts_report
from gpufleet.inventory import listing
from gpufleet.inventory.target import Target
from gpufleet.provision import report as provision_report
from gpufleet.provision.engine import RunOptions, provision
from gpufleet.provision.engine import validate as validate_roles
from gpufleet.provision.plan import ApplyOptions
from gpufleet.report import html, junit, prometheus, terminal
from gpufleet.report.jsonfile import write_json
from gpufleet.report.outputs import check_writable, to_stdout
from gpufleet.slurm import drain
from gpufleet.sources import load_source, load_target

# Each command's time budget per host when neither --timeout nor the inventory's
# gpufleet_host_timeout sets one: long enough for its slowest legitimate step (pip of a
# CUDA torch build, an apt transaction, a reboot), short enough to end a hung host.
HOST_TIMEOUTS = {"facts": 300.0, "drift": 900.0, "provision": 7200.0, "conformance": 3600.0,
                 "bootstrap": 7200.0, "tune": 14400.0, "watch": 120.0}


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

@guarded
def facts(inventory: str | None, *, limit: str | None = None, json_path: str | None = None,
          fleet: FleetArgs | None = None, out: TextIO | None = None) -> int:
    """Gather facts from every selected host in one round trip each; print and save them."""
    target = load_target(inventory, limit)
    fleet = fleet or FleetArgs()
    options = fleet.options(target, "facts")
    validate_roles(target.hosts, role_registry.ALL)
    _check_outputs(json=json_path)

    started = time.monotonic()
    outcomes = facts_report.gather(target.hosts, role_registry.host_request, options,
                                   terminal.TerminalProgress("facts"))
    duration = time.monotonic() - started
    con = _console(out, json_path)
    con.print(terminal.facts_table({n: facts_report.summary_only(o)
                                    for n, o in outcomes.items()}))
    for name, outcome in outcomes.items():
        if outcome.value:
            for reason, names in facts_report.absent_by_reason(outcome.value["facts"]).items():
                con.print(f"  [dim]{terminal.markup(name)}: unknown "
                          f"{terminal.markup(', '.join(names))}: {terminal.markup(reason)}[/dim]")
            for line in facts_report.watch_lines(outcome.value["facts"]):
                con.print(f"  {terminal.markup(name)}: {terminal.markup(line)}")
    if json_path:
        write_json(json_path, facts_report.to_json(target, outcomes, duration))
    return _facts_code(outcomes)


# ---- watch ---------------------------------------------------------------------------------

@guarded
def watch_cmd(inventory: str | None, action: str, *, limit: str | None = None,
              finding: str | None = None, until: str | None = None, reason: str | None = None,
              fleet: FleetArgs | None = None, out: TextIO | None = None) -> int:
    """Silence one finding of the standing watch on the selected nodes until a time, or lift
    the silence (``action``: silence or unsilence): every value checked before any host is
    contacted; 0 when every node took it, 1 when the program refused on one, 3 when one was
    unreachable."""
    silence = watch.plan(action, finding, until, reason, time.time())
    if not limit:
        raise watch.WatchUsage(f"watch {action} needs -l/--limit: the node(s) whose finding "
                               "it is")
    target = load_target(inventory, limit)
    validate_roles(target.hosts, role_registry.select("slurm_healthcheck"))
    where = watch.setups(target.hosts)
    options = (fleet or FleetArgs()).options(target, "watch")
    outcomes = watch.run(target.hosts, silence, where, options,
                         terminal.TerminalProgress(f"watch {action}"))
    con = _console(out)
    con.print(f"[bold]WATCH[/bold] {terminal.markup(silence.describe())}")
    terminal.print_recap(con, outcomes, {n: o.value for n, o in outcomes.items()
                                         if o.value and o.status != "failed"})
    return _outcome_code(outcomes)


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
    provision_report.print_plans(con, outcomes, diff, "PLAN" if check else "CHANGES")
    reboots = {n: f"reboot required: {o.value.reboot_pending}" for n, o in outcomes.items()
               if o.value and o.value.reboot_pending}
    notes = dict(reboots)
    for name, note in provision_report.manual_notes(outcomes).items():
        notes[name] = f"{notes[name]}; {note}" if name in notes else note
    terminal.print_recap(con, outcomes, notes)
    if json_path:
        write_json(json_path, provision_report.to_json(target, outcomes, duration, check))
    code = _outcome_code(outcomes)
    if code == exitcodes.OK and reboots and not check:
        return exitcodes.REBOOT_REQUIRED
    return code


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
        drain.check(target.hosts, "--drain-drifted")
    label = _metrics_target(target, outputs.prometheus_path, "drift")
    history = History(history_dir(Path(outputs.report_dir), target), "drift", outputs.keep)
    options = DriftOptions(selected, fleet.options(target, "drift"), history,
                           remediate=fleet.options(target, "provision") if remediate else None,
                           reboot=reboot)
    run = run_drift(target, options, terminal.TerminalProgress("drift"),
                    terminal.TerminalProgress("remediate"))
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
        _print_actions(con, drift_drain.drain_drifted(target, run))
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

    out = out or sys.stdout
    target = load_target(inventory, limit)
    plan = tuning.plan(target, group)
    _check_outputs(diff=diff_path)
    fleet = fleet or FleetArgs()

    def started(nodes: int, unreachable: dict[str, str]) -> None:
        for name, error in unreachable.items():
            print(f"{name}: {error}", file=sys.stderr)
        if nodes:
            print(f"tune: {nodes} node(s), {plan.wanted.repeats} rounds; the current "
                  f"setting is what the nodes have (group {plan.group}'s nccl_env)", file=out)

    run = tuning.run(target, plan, fleet.options(target, "tune"), started=started,
                     progress=lambda r, c: print(f"  round {r}: {c.name}", file=sys.stderr))
    if not run.measured:
        return exitcodes.UNREACHABLE
    current = run.measured[0]
    print(tuning.table(run.measured, run.best), file=out)
    if current.median() is None:
        print(f"the current setting could not be measured: {current.errors[0]}", file=out)
        return exitcodes.FAILED
    if run.best is None or run.proposal is None:
        print("no winner: no candidate beats the current setting by more than the noise",
              file=out)
    else:
        print(f"winner: {run.best.candidate.name} ({tuning.gain(current, run.best):+.1%} DDP "
              f"samples/s); apply to {plan.path}:", file=out)
        for note in run.proposal.notes:
            print(f"note: {terminal.plain(note)}", file=out)
        print(run.proposal.patch, file=out, end="")
        if diff_path and diff_path != "-" and run.proposal.patch:
            Path(diff_path).write_text(run.proposal.patch)
    return exitcodes.UNREACHABLE if run.unreachable else exitcodes.OK


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
    label = _metrics_target(target, prometheus_path, "conformance")
    if drain_failed:
        drain.check(target.hosts, "--drain-failed")
    artifacts = (Path(json_path).resolve().parent / "conformance-artifacts"
                 if json_path and json_path != "-" else Path("reports/conformance-artifacts"))
    console = (out or sys.stderr) if to_stdout(json_path, junit_path, prometheus_path,
                                               html_path) else out
    options = ConformanceOptions(
        suites=tuple((suites or "conformance").split(",")), pairs=pairs,
        with_nccl_tests=with_nccl_tests, record_baseline=record_baseline,
        compare_baseline=compare_baseline, launcher=launcher, partition=partition,
        image=image, source=inventory, fleet=fleet.options(target, "conformance"),
        artifacts=artifacts, console=console, pytest_args=tuple(extra_args or ()))
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
        _print_actions(_console(out, json_path, junit_path, prometheus_path, html_path),
                       conformance_drain.drain_failed(target, report))
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
    document = result.to_json(inv, duration)
    if json_path:
        write_json(json_path, document)
    if html_path:
        html.write_report(html_path, lambda: html.render_acceptance(
            [r.to_json() for r in result.reports], bootstrap=[document]))
    return result.exit_code
