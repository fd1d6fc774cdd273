"""The ``gpufleet`` command: invoke's Program over gpufleet's task collection (as Fabric's
``fab`` is), from any directory. The same collection is ``tasks.py``'s, so ``invoke
provision ...`` in a checkout runs the very same tasks.

Flags parse into typed options for :mod:`gpufleet.app`, never into a second command line.
Exit codes mean one thing each: 0/1/3/4 as the commands define them, 2 for bad usage or
bad input (before any host is contacted), 70 for an internal error (its traceback with
``-vvv``).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from invoke.collection import Collection
from invoke.config import Config
from invoke.context import Context
from invoke.exceptions import Exit, ParseError
from invoke.program import Program
from invoke.tasks import Task
from invoke.tasks import task as invoke_task

from gpufleet import __version__, app, exitcodes, sources
from gpufleet.bootstrap import BootstrapOptions
from gpufleet.conformance import registry
from gpufleet.drift.schedule import Schedule
from gpufleet.errors import GpufleetError
from gpufleet.inventory.secrets import redact
from gpufleet.lab import commands as lab_commands
from gpufleet.report.outputs import check_writable
from gpufleet.report.terminal import plain

SHORT_FLAGS = {"inventory": "i", "limit": "l", "forks": "f", "verbose": "v"}
DEFAULTS = {"gpufleet": {"forks": 128, "drift_report_dir": "reports/drift",
                         "inventory_dir": None}}
log = logging.getLogger("gpufleet")
# invoke's core options that mean something for gpufleet (the rest concern shell commands
# run through invoke, which gpufleet does not use); the others stay accepted, unlisted.
CORE_FLAGS = ("help", "version", "list", "config", "complete", "print-completion-script")
EPILOG = """Examples:

  gpufleet provision -i prod --check --diff
  gpufleet drift -i prod --json drift.json --prometheus /var/lib/node_exporter/textfile/g.prom
  gpufleet conformance -i prod --suite gpu -l 'gpu0*'
  gpufleet watch silence -i prod -l gpu07 --finding rdma/mlx5_0/1/symbol_error --until +12h
  gpufleet inventory -i prod --graph

Exit codes: 0 success; 1 a host failed, drift found or a check failed; 2 bad usage or bad
input; 3 a host unreachable; 4 a reboot pending; 70 an internal error (-vvv shows it).
Configuration: /etc/gpufleet.yaml, ~/.gpufleet.yaml or -f FILE (keys under gpufleet:).
"""


class FleetTask(Task):  # type: ignore[type-arg]
    """A task whose common flags have Ansible's one-letter names: -i, -l, -f, -v."""

    def arg_opts(self, name: str, default: str, taken_names: set[str]) -> dict[str, Any]:
        opts: dict[str, Any] = super().arg_opts(name, default, taken_names)
        if name in SHORT_FLAGS:
            opts["names"] = [*opts["names"], SHORT_FLAGS[name]]
        return opts


def task(**kwargs: Any) -> Callable[[Callable[..., None]], FleetTask]:
    """invoke's @task with the common one-letter flags and ``-v`` counting; no automatic
    one-letter flags, which would differ from task to task."""
    decorator: Callable[[Callable[..., None]], FleetTask] = invoke_task(
        klass=FleetTask, auto_shortflags=False, incrementable=["verbose"], **kwargs)
    return decorator


FLEET_HELP = {
    "inventory": "inventory: a path, or a name looked up in ./inventory/ and "
                 "$GPUFLEET_INVENTORY_DIR",
    "limit": "Ansible host pattern: names, groups, globs, a:b, a:&b, a:!b",
    "forks": "hosts worked on in parallel",
    "serial": "rolling batches: N hosts or N%",
    "max_fail_percent": "stop starting batches once this % of a batch failed",
    "accept_new_host_keys": "trust unknown host keys and record them (never the default)",
    "timeout": "seconds each host may take in all; a host past it is failed and gets no "
               "further command (default per command, or gpufleet_host_timeout)",
    "json": "write the JSON report to this file (- for standard output)",
    "verbose": "-v: each host's commands and their durations; -vv: their output; -vvv: "
               "connection debug and tracebacks",
    "list_hosts": "print the hosts the command would act on and exit",
}


def _help(*names: str, **extra: str) -> dict[str, str]:
    return {**{n: FLEET_HELP[n] for n in names}, **extra}


class _Redacting(logging.Filter):
    """Every log line goes through the same redaction as the reports."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = redact(plain(record.getMessage(), newlines=True))
        record.args = ()
        return True


def configure_logging(verbose: int) -> None:
    """Warnings always, as ``warning: ...`` lines; -v: INFO from gpufleet; -vv: DEBUG from
    gpufleet; -vvv: DEBUG from paramiko and Fabric too. Everything goes to standard error,
    secrets redacted."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, "gpufleet", False):
            root.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr)
    handler.gpufleet = True  # type: ignore[attr-defined]
    handler.addFilter(_Redacting())
    handler.setFormatter(logging.Formatter(
        "warning: %(message)s" if verbose <= 0 else
        "%(asctime)s %(name)s %(levelname)s %(message)s"))
    root.addHandler(handler)
    log.setLevel(logging.WARNING if verbose <= 0 else
                 logging.INFO if verbose == 1 else logging.DEBUG)
    for name in ("paramiko", "fabric", "invoke"):
        logging.getLogger(name).setLevel(logging.DEBUG if verbose >= 3 else logging.WARNING)
    root.setLevel(logging.DEBUG if verbose >= 3 else logging.WARNING)


_TERMINATED: list[bool] = []


def _terminate(signum: int, frame: object) -> None:
    """SIGTERM unwinds the run as Ctrl-C does, so every ``finally`` runs: a Slurm allocation
    is cancelled, connections close, node locks are released."""
    _TERMINATED.append(True)
    raise KeyboardInterrupt


def _run(c: Context, verbose: int, command: Callable[[], int]) -> None:
    """Run a command: one line and exit 2 for bad input, one line and exit 70 for an
    internal error (its traceback at -vvv), otherwise the command's own code."""
    configure_logging(int(verbose or 0))
    sources.configure(c.config.get("gpufleet", {}).get("inventory_dir"))
    signal.signal(signal.SIGTERM, _terminate)
    try:
        code = command()
    except GpufleetError as exc:
        print(f"error: {plain(exc)}", file=sys.stderr)
        code = exc.exit_code
    except KeyboardInterrupt:
        terminated = bool(_TERMINATED)
        print(f"error: {'terminated (SIGTERM)' if terminated else 'interrupted'}",
              file=sys.stderr)
        code = exitcodes.TERMINATED if terminated else exitcodes.INTERRUPTED
    except Exception as exc:  # the one place an unexpected error of a command is reported
        code = internal_error(exc, int(verbose or 0))
    if code:
        raise Exit(code=code)


def internal_error(exc: BaseException, verbose: int) -> int:
    """Report an unexpected exception in one line (and its traceback at -vvv)."""
    where = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
    place = f" at {Path(where.filename).name}:{where.lineno}" if where else ""
    print(f"internal error{place}: {type(exc).__name__}: {plain(redact(str(exc)))} (run with "
          "-vvv for the traceback)", file=sys.stderr)
    if verbose >= 3:
        print(redact("".join(traceback.format_exception(exc))), file=sys.stderr, end="")
    return exitcodes.INTERNAL


N = TypeVar("N", int, float)


def _number(kind: type[N], flag: str, value: Any) -> N | None:
    """A numeric flag's value; a clear error (exit 2) when it is not a number."""
    if value is None or value == "":
        return None
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise GpufleetError(f"{flag} must be a number, got {value!r}") from None


def _fleet(c: Context, forks: Any, serial: str | None, max_fail_percent: Any,
           accept_new_host_keys: bool, timeout: Any = None) -> app.FleetArgs:
    default_forks = c.config.get("gpufleet", {}).get("forks", 128)
    return app.FleetArgs(forks=_number(int, "--forks", forks or default_forks) or 128,
                         serial=serial,
                         max_fail_percent=_number(float, "--max-fail-percent",
                                                  max_fail_percent),
                         accept_new_host_keys=accept_new_host_keys,
                         timeout=_number(float, "--timeout", timeout))


@task(help=_help("inventory", "limit", "forks", "accept_new_host_keys", "json", "timeout",
                 "verbose", "list_hosts"))
def facts(c: Context, inventory: str | None = None, limit: str | None = None,
          json: str | None = None, forks: str | None = None,
          accept_new_host_keys: bool = False, timeout: str | None = None, verbose: int = 0,
          list_hosts: bool = False) -> None:
    """Gather facts from each host in one round trip and show the key ones."""
    _run(c, verbose, lambda: app.list_hosts(inventory, limit=limit) if list_hosts else app.facts(
        inventory, limit=limit, json_path=json,
        fleet=_fleet(c, forks, None, None, accept_new_host_keys, timeout)))


@task(help=_help(*FLEET_HELP, check="show the plan, change nothing",
                 diff="show unified diffs of the files that would change",
                 roles="comma-separated roles to run (default: all)",
                 reboot="reboot hosts whose loaded driver differs",
                 lock_timeout="seconds to wait for a held lock: another gpufleet run's on the "
                              "node, or apt's/dpkg's (default 300)"))
def provision(c: Context, inventory: str | None = None, limit: str | None = None,
              check: bool = False, diff: bool = False, roles: str | None = None,
              reboot: bool = False, lock_timeout: str | None = None, json: str | None = None,
              forks: str | None = None, serial: str | None = None,
              max_fail_percent: str | None = None, accept_new_host_keys: bool = False,
              timeout: str | None = None, verbose: int = 0, list_hosts: bool = False) -> None:
    """Bring hosts to the inventory's pinned stack and configuration."""
    def command() -> int:
        if list_hosts:
            return int(app.list_hosts(inventory, limit=limit))
        return int(app.provision_cmd(
            inventory, limit=limit, check=check, diff=diff, roles=roles, reboot=reboot,
            lock_timeout=300 if lock_timeout is None else
            _number(int, "--lock-timeout", lock_timeout) or 0, json_path=json,
            fleet=_fleet(c, forks, serial, max_fail_percent, accept_new_host_keys, timeout)))

    _run(c, verbose, command)


@task(help=_help(*FLEET_HELP, roles="comma-separated roles to check (default: all)",
                 junit="write a JUnit XML report to this file (- for standard output)",
                 prometheus="write a node_exporter textfile (metrics) to this file",
                 html="write the HTML report to this file (- for standard output)",
                 report_dir="directory keeping the history of drift runs",
                 keep="number of past runs kept in the report directory (default 30)",
                 remediate="apply the plan to drifted hosts after reporting",
                 drain_drifted="drain drifted hosts in the scheduler (gpufleet_scheduler), "
                               "resume the clean ones drift drained",
                 reboot="with --remediate: reboot hosts whose loaded driver differs",
                 no_diff="leave file diffs out of the terminal report"))
def drift(c: Context, inventory: str | None = None, limit: str | None = None,
          roles: str | None = None, json: str | None = None, junit: str | None = None,
          prometheus: str | None = None, report_dir: str | None = None,
          keep: str | None = None, remediate: bool = False, reboot: bool = False,
          no_diff: bool = False, forks: str | None = None, serial: str | None = None,
          max_fail_percent: str | None = None, accept_new_host_keys: bool = False,
          timeout: str | None = None, drain_drifted: bool = False, html: str | None = None,
          verbose: int = 0, list_hosts: bool = False) -> None:
    """Report every host's drift from the inventory and from its group (read-only)."""
    def command() -> int:
        if list_hosts:
            return int(app.list_hosts(inventory, limit=limit))
        kept = _number(int, "--keep", keep)
        outputs = app.DriftOutputs(json, junit, prometheus,
                                   report_dir or c.config.get("gpufleet", {}).get(
                                       "drift_report_dir", "reports/drift"),
                                   30 if kept is None else kept, html)
        return int(app.drift_cmd(
            inventory, limit=limit, roles=roles, outputs=outputs, remediate=remediate,
            reboot=reboot, diff=not no_diff, drain_drifted=drain_drifted,
            fleet=_fleet(c, forks, serial, max_fail_percent, accept_new_host_keys, timeout)))

    _run(c, verbose, command)


@task(help={"inventory": FLEET_HELP["inventory"], "at": "time of day, HH:MM (24-hour)",
            "json": "JSON report written by each nightly run",
            "junit": "JUnit report written by each nightly run",
            "prometheus": "node_exporter textfile written by each nightly run",
            "limit": FLEET_HELP["limit"],
            "remediate": "apply the plan to drifted hosts after each report",
            "timeout": "seconds each host may take in each nightly run (the unit's start "
                       "timeout follows from it)",
            "unit_dir": "write the systemd units here instead of /etc/systemd/system",
            "verbose": FLEET_HELP["verbose"]})
def drift_schedule(c: Context, inventory: str | None = None, at: str = "02:30",
                   json: str | None = None, junit: str | None = None,
                   prometheus: str | None = None, limit: str | None = None,
                   remediate: bool = False, timeout: str | None = None,
                   unit_dir: str | None = None, verbose: int = 0) -> None:
    """Run drift nightly: a systemd timer, or the cron line to use without systemd."""
    def command() -> int:
        if not inventory:
            raise sources.NoInventory("drift.schedule needs -i/--inventory: the inventory "
                                      "the nightly run checks")
        found = sources.find(inventory, c.config.get("gpufleet", {}).get("inventory_dir"))
        host_timeout = _number(float, "--timeout", timeout)
        if host_timeout is not None and not host_timeout > 0:
            raise GpufleetError(f"--timeout must be a positive number of seconds, "
                                f"got {host_timeout:g}")
        args = ["--inventory", str(found.resolve())]
        writes: list[Path] = []
        for flag, value in (("--json", json), ("--junit", junit),
                            ("--prometheus", prometheus)):
            if value:
                check_writable(value, flag)
                path = Path(value).resolve()
                args += [flag, str(path)]
                writes.append(path.parent)
        if limit:
            args += ["--limit", limit]
        if remediate:
            args.append("--remediate")
        if host_timeout is not None:
            args += ["--timeout", f"{host_timeout:g}"]
        schedule = Schedule(Path.cwd().resolve(), args, at,
                            timeout_s=Schedule.start_timeout(host_timeout, remediate),
                            writes=tuple(writes))
        for directory in writes:  # what the unit may write must exist when it starts
            directory.mkdir(parents=True, exist_ok=True)
        return int(app.schedule_cmd(schedule, unit_dir))

    _run(c, verbose, command)


@task(help=_help("inventory", "limit", "forks", "json", "timeout", "verbose", "list_hosts",
                 suite=f"comma-separated suites or sets: {registry.sets_help()}",
                 junit="write a JUnit XML report to this file (- for standard output)",
                 prometheus="write a node_exporter textfile (metrics) to this file",
                 html="write the HTML report to this file (the acceptance report for "
                      "--suite acceptance or all; - for standard output)",
                 pairs="reachability pairs: auto (all up to 256 nodes), all, ring, sample:K",
                 with_nccl_tests="also run nccl-tests' all_reduce_perf where installed",
                 drain_failed="drain nodes with a failed check in the scheduler "
                              "(gpufleet_scheduler), resume the ones that now pass",
                 launcher="reach nodes by ssh (default) or as job steps of one Slurm allocation: "
                          "slurm (node-local commands of many nodes in one step) or "
                          "slurm-per-node (a step per command)",
                 partition="with --launcher slurm: the partition to allocate from (default: "
                           "the slurm: inventory's, else Slurm's default)",
                 record_baseline="record each passing node's performance figures on the node "
                                 "(/etc/gpufleet/baseline.json)",
                 compare_baseline="gate performance figures at max(floor, baseline_fraction "
                                  "x the node's baseline) and report the trend",
                 image="certify this training image on every node (container_image for the "
                       "run): the image suite, and allreduce, ddp and p2p in the image"))
def conformance(c: Context, inventory: str | None = None, limit: str | None = None,
                suite: str | None = None, junit: str | None = None, json: str | None = None,
                pairs: str = "auto", with_nccl_tests: bool = False, forks: str | None = None,
                timeout: str | None = None, drain_failed: bool = False, launcher: str = "ssh",
                partition: str | None = None, record_baseline: bool = False,
                compare_baseline: bool = False, prometheus: str | None = None,
                html: str | None = None, image: str | None = None, verbose: int = 0,
                list_hosts: bool = False) -> None:
    """Certify nodes: versions, reachability, AllReduce bandwidth, RDMA QoS, GPU health."""
    def command() -> int:
        if list_hosts:
            return int(app.list_hosts(inventory, limit=limit))
        return int(app.conformance_cmd(
            inventory, limit=limit, suites=suite, junit_path=junit, json_path=json, pairs=pairs,
            with_nccl_tests=with_nccl_tests, fleet=_fleet(c, forks, None, None, False, timeout),
            drain_failed=drain_failed, launcher=launcher, partition=partition,
            record_baseline=record_baseline, compare_baseline=compare_baseline,
            prometheus_path=prometheus, html_path=html, image=image))

    _run(c, verbose, command)


@task(help={"inventory": FLEET_HELP["inventory"], "host": "the new node (inventory name)",
            "peer": "a known-good node of the same group (default: the first other one)",
            "expect_fingerprint": "refuse unless the host key has this SHA256 fingerprint",
            "reboot": "reboot when the installed driver needs it",
            "recertify": "run the conformance suites even on a node already certified",
            "json": "write the bootstrap report to this file (- for standard output)",
            "html": "write the acceptance report of the node to this file (- for standard "
                    "output)",
            "timeout": "seconds the whole bootstrap may take (default 7200, or "
                       "gpufleet_host_timeout)",
            "verbose": FLEET_HELP["verbose"]})
def bootstrap(c: Context, host: str, inventory: str | None = None, peer: str | None = None,
              expect_fingerprint: str | None = None, reboot: bool = False,
              recertify: bool = False, json: str | None = None, timeout: str | None = None,
              html: str | None = None, verbose: int = 0) -> None:
    """Take a new node to certified-ready: trust, preflight, provision, certify, mark."""
    def command() -> int:
        options = BootstrapOptions(host=host, peer=peer, expect_fingerprint=expect_fingerprint,
                                   reboot=reboot, recertify=recertify,
                                   timeout=_number(float, "--timeout", timeout))
        return int(app.bootstrap_cmd(inventory, options, json, html_path=html))

    _run(c, verbose, command)


@task(name="inventory",
      help={"inventory": FLEET_HELP["inventory"], "verbose": FLEET_HELP["verbose"],
            "list": "the ansible-inventory --list JSON (rendered, secrets redacted)",
            "graph": "the group tree", "host": "one host's merged variables (JSON)",
            "origins": "with --host: where each variable is set (file:line)"})
def inventory_task(c: Context, inventory: str | None = None, list: bool = False,
                   graph: bool = False, host: str | None = None, origins: bool = False,
                   verbose: int = 0) -> None:
    """Show what gpufleet resolved from an inventory, without contacting any host."""
    def command() -> int:
        modes = [m for m, on in (("list", list), ("graph", graph), ("host", host is not None))
                 if on]
        if len(modes) != 1:
            raise GpufleetError("inventory: give exactly one of --list, --graph or --host HOST")
        if origins and modes != ["host"]:
            raise GpufleetError("inventory: --origins goes with --host HOST")
        return int(app.inventory_cmd(inventory, mode=modes[0], host=host, origins=origins))

    _run(c, verbose, command)


@task(help={"nodes": "number of lab nodes (1-1000)",
            "slurm": "also run Slurm: slurmctld and munged here, slurmd on every node"})
def lab_up(c: Context, nodes: int = 3, slurm: bool = False) -> None:
    """Bring the local lab cluster up with N nodes (idempotent)."""
    _run(c, 0, lambda: lab_commands.up(_number(int, "--nodes", nodes) or 3, slurm=slurm))


@task(help={"purge": "also delete the lab's state directory (key, apt repository); the "
                     "torch wheelhouse /srv/gpufleet-wheels is shared and kept"})
def lab_down(c: Context, purge: bool = False) -> None:
    """Tear the lab down: namespaces, mounts, processes, links and bridge."""
    _run(c, 0, lambda: lab_commands.down(purge))


@task()
def lab_status(c: Context) -> None:
    """Show the lab's nodes."""
    _run(c, 0, lab_commands.status)


@task()
def lab_add(c: Context) -> None:
    """Add a fresh node that is not in known_hosts yet (for bootstrap)."""
    _run(c, 0, lab_commands.add)


@task(help={"node": "node name (node01) or number"})
def lab_remove(c: Context, node: str) -> None:
    """Destroy one lab node and drop it from the inventory and known_hosts."""
    _run(c, 0, lambda: lab_commands.remove(node))


@task(help={"node": "node name (node01) or number", "command": "shell command to run"})
def lab_exec(c: Context, node: str, command: str) -> None:
    """Run a command inside a lab node: gpufleet lab.exec node01 'ip addr'."""
    _run(c, 0, lambda: lab_commands.node_exec(node, command))


@task(positional=["action"],
      help=_help("inventory", "limit", "forks", "accept_new_host_keys", "timeout", "verbose",
                 action="silence or unsilence",
                 finding="the finding's id, as its report names it (gpufleet facts shows it): "
                         "rdma/mlx5_0/1/symbol_error",
                 until="with silence: when the silence ends: Unix seconds, +N with s, m, h, d "
                       "or w (+12h), or ISO 8601 with its zone (2025-12-10T18:00Z); at most "
                       "a year ahead",
                 reason="with silence: why, shown with the silence in every report"))
def watch(c: Context, action: str, inventory: str | None = None, limit: str | None = None,
          finding: str | None = None, until: str | None = None, reason: str | None = None,
          forks: str | None = None, accept_new_host_keys: bool = False,
          timeout: str | None = None, verbose: int = 0) -> None:
    """Silence one finding of the standing watch on nodes until a time, or lift the silence."""
    _run(c, verbose, lambda: int(app.watch_cmd(
        inventory, action, limit=limit, finding=finding, until=until, reason=reason,
        fleet=_fleet(c, forks, None, None, accept_new_host_keys, timeout))))


@task(help=_help("inventory", "limit", "forks", "timeout", "verbose",
                 group="the group whose nccl_env the winner goes to (default: the smallest "
                       "group holding every selected host, else all)",
                 diff="also write the winner's nccl_env change as a unified diff to this "
                      "file"))
def tune(c: Context, inventory: str | None = None, limit: str | None = None,
         group: str | None = None, diff: str | None = None, forks: str | None = None,
         timeout: str | None = None, verbose: int = 0) -> None:
    """Measure DDP and AllReduce under candidate NCCL settings; show the winner as a diff."""
    _run(c, verbose, lambda: int(app.tune_cmd(
        inventory, limit=limit, group=group, diff_path=diff,
        fleet=_fleet(c, forks, None, None, False, timeout))))


def namespace() -> Collection:
    """Every task: facts, provision, drift (+ drift.schedule), conformance, bootstrap, tune,
    watch, inventory, and the lab's."""
    lab = Collection("lab")
    lab.add_task(lab_up, "up")
    lab.add_task(lab_down, "down")
    lab.add_task(lab_status, "status")
    lab.add_task(lab_add, "add")
    lab.add_task(lab_remove, "remove")
    lab.add_task(lab_exec, "exec", aliases=("node-exec",))
    drift_tasks = Collection("drift")
    drift_tasks.add_task(drift, "check", default=True)
    drift_tasks.add_task(drift_schedule, "schedule")
    ns = Collection(facts, provision, conformance, bootstrap, tune, watch)
    ns.add_task(inventory_task, "inventory")
    ns.add_collection(drift_tasks)
    ns.add_collection(lab)
    ns.configure(DEFAULTS)
    return ns


class GpufleetConfig(Config):
    """Configuration files /etc/gpufleet.yaml and ~/.gpufleet.yaml (and ``-f FILE``), with
    keys under ``gpufleet:`` (``forks``, ``drift_report_dir``, ``inventory_dir``)."""

    prefix = "gpufleet"


class GpufleetProgram(Program):
    """invoke's Program with gpufleet's exit codes: a bad flag, an unknown task or option
    exits 2 with one line; an unexpected error exits 70."""

    def print_help(self) -> None:
        print(f"Usage: {self.binary} [--core-opts] <command> [--command-opts] ...")
        print("")
        print("Core options:")
        print("")
        self.print_columns([row for row in self.initial_context.help_tuples()
                            if any(f"--{name}" in row[0] for name in CORE_FLAGS)])
        self.list_tasks()
        print(EPILOG, end="")

    def run(self, argv: list[str] | None = None, exit: bool = True) -> None:
        try:
            self.create_config()
            self.parse_core(argv)
            self.parse_collection()
            self.parse_tasks()
            self.parse_cleanup()
            self.update_config()
            self.execute()
        except ParseError as exc:
            print(f"error: {exc} (gpufleet --help lists the commands, gpufleet --help "
                  "COMMAND its flags)", file=sys.stderr)
            code = exitcodes.USAGE
        except Exit as exc:
            if exc.message:
                print(exc.message, file=sys.stderr)
            code = exc.code
        except BrokenPipeError:  # the reader went away (| head): stop quietly, as cat does
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - replaces the closed stdout
            code = exitcodes.BROKEN_PIPE
        except Exception as exc:  # failures of the program itself
            code = internal_error(exc, 0)
        else:
            code = exitcodes.OK
        if exit:
            sys.exit(code)
        if code:
            raise Exit(code=code)


def program() -> GpufleetProgram:
    return GpufleetProgram(namespace=namespace(), name="gpufleet", binary="gpufleet",
                           version=__version__, config_class=GpufleetConfig)


def main(argv: list[str] | None = None) -> None:
    """The ``gpufleet`` console script."""
    program().run(argv)
