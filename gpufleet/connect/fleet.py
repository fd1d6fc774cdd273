"""Fan a per-host function out over many hosts: forks, timeouts, serial batches, max-fail.

Hosts are independent: one host's failure or hang never stops the others, and
every host ends with exactly one outcome. Each host works under its own budget: when
its time is up the host is reported failed at once, its connections are closed, and it
gets no further command, reconnect or reboot; the report keeps what the task had
published as its progress (``Budget.progress``) by then.

A large batch is spread over worker processes, each running the same thread pool over its
share of the hosts (``FleetOptions.processes``; by default one process per 128 hosts, up
to the controller's cores, from 256 hosts on), so the controller's CPU rather than one
interpreter's lock bounds the run. Workers are forked: the task is the caller's own
function, nothing is pickled but each outcome, which a worker sends back the moment its
host ends, so the caller keeps one progress display and one report.
"""

from __future__ import annotations

import logging
import math
import multiprocessing
import multiprocessing.connection
import os
import queue
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, Protocol, TypeVar

from gpufleet.connect.connection import Budget, Connection, ConnectOptions, Connector, Unreachable
from gpufleet.connect.open import connect as open_connection
from gpufleet.errors import GpufleetError
from gpufleet.inventory.model import Host

T = TypeVar("T")
log = logging.getLogger("gpufleet.fleet")
Status = Literal["ok", "changed", "failed", "unreachable", "skipped"]
DEFAULT_FORKS = 128
DEFAULT_HOST_TIMEOUT_S = 1800.0
HOST_TIMEOUT_VAR = "gpufleet_host_timeout"
PROCESS_MIN_HOSTS = 256
HOSTS_PER_PROCESS = 128
PROCESSES_ENV = "GPUFLEET_PROCESSES"
DEADLINE_SCAN_S = 0.5  # how often a batch looks for hosts past their deadline


@dataclass
class TaskResult(Generic[T]):
    """What a host task returns: its value, whether it changed the host, and a failure."""

    value: T
    changed: bool = False
    failed: str | None = None
    unreachable: str | None = None


@dataclass
class Outcome(Generic[T]):
    """How one host ended."""

    host: str
    status: Status
    error: str | None = None
    duration: float = 0.0
    value: T | None = None
    round_trips: int = 0


@dataclass
class FleetOptions:
    """How to fan out. ``host_timeout`` (``--timeout``) wins over the inventory's
    ``gpufleet_host_timeout``, which wins over the command's ``default_timeout``."""

    forks: int = DEFAULT_FORKS
    host_timeout: float | None = None
    default_timeout: float = DEFAULT_HOST_TIMEOUT_S
    serial: str | None = None
    max_fail_percent: float | None = None
    connect: ConnectOptions = field(default_factory=ConnectOptions)
    processes: int | None = None  # worker processes per batch; None: worker_processes()
    connector: Connector = open_connection  # SSH or local; the srun launcher brings its own


class ProgressSink(Protocol):
    """Receives progress events; the terminal reporter implements it."""

    def start(self, total: int) -> None: ...
    def host_done(self, outcome: Outcome[object]) -> None: ...
    def finish(self) -> None: ...


HostTask = Callable[[Host, Connection], TaskResult[T]]


def host_timeout(host: Host, options: FleetOptions) -> float:
    """The host's time budget in seconds."""
    if options.host_timeout is not None:
        return options.host_timeout
    value = host.vars.get(HOST_TIMEOUT_VAR)
    if value is None:
        return options.default_timeout
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = 0.0
    if isinstance(value, bool) or not seconds > 0:
        raise GpufleetError(f"host {host.name}: variable {HOST_TIMEOUT_VAR} must be a "
                            f"positive number of seconds, got {value!r}")
    return seconds


def worker_processes(count: int, options: FleetOptions) -> int:
    """How many processes work on a batch of ``count`` hosts: ``options.processes`` or the
    environment's ``GPUFLEET_PROCESSES`` when set, else one below PROCESS_MIN_HOSTS (threads
    alone are cheaper there) and one per HOSTS_PER_PROCESS hosts above, at most one per
    core."""
    wanted = options.processes
    if wanted is None and os.environ.get(PROCESSES_ENV, "").strip():
        text = os.environ[PROCESSES_ENV].strip()
        if not text.isdigit() or int(text) < 1:
            raise GpufleetError(f"{PROCESSES_ENV} must be a positive number of processes, "
                                f"got {text!r}")
        wanted = int(text)
    if wanted is not None:
        return max(1, min(wanted, count))
    if count < PROCESS_MIN_HOSTS:
        return 1
    return max(1, min(os.cpu_count() or 1, math.ceil(count / HOSTS_PER_PROCESS)))


def batches(hosts: Sequence[Host], serial: str | None) -> list[list[Host]]:
    """Split hosts into rolling batches: ``serial`` is N hosts or N% of them."""
    if not serial:
        return [list(hosts)] if hosts else []
    text = serial.strip()
    try:
        size = math.ceil(len(hosts) * float(text[:-1]) / 100) if text.endswith("%") else int(text)
    except ValueError:
        raise GpufleetError(f"--serial must be a number or a percentage, got {serial!r}"
                            ) from None
    size = max(1, size)
    return [list(hosts[i:i + size]) for i in range(0, len(hosts), size)]


def _run_one(host: Host, conn: Connection, task: HostTask[T]) -> Outcome[T]:
    start = time.monotonic()
    try:
        result = task(host, conn)
    except GpufleetError as exc:
        if conn.budget.spent:
            return Outcome(host.name, "failed", _timed_out(conn, str(exc)),
                           time.monotonic() - start, conn.budget.progress, conn.round_trips)
        status: Status = "unreachable" if isinstance(exc, Unreachable) else "failed"
        return Outcome(host.name, status, str(exc), time.monotonic() - start,
                       round_trips=conn.round_trips)
    except Exception as exc:  # a bug must fail one host, never the run
        last = traceback.extract_tb(exc.__traceback__)[-1]
        where = f"{last.filename.rsplit('/', 1)[-1]}:{last.lineno}"
        return Outcome(host.name, "failed", f"internal error at {where}: "
                       f"{type(exc).__name__}: {exc}", time.monotonic() - start,
                       round_trips=conn.round_trips)
    finally:
        conn.close()
    error = result.failed or result.unreachable
    if error and conn.budget.spent:
        return Outcome(host.name, "failed", _timed_out(conn, error), time.monotonic() - start,
                       result.value, conn.round_trips)
    status = "failed" if result.failed else (
        "unreachable" if result.unreachable else ("changed" if result.changed else "ok"))
    return Outcome(host.name, status, error, time.monotonic() - start, result.value,
                   conn.round_trips)


def _timed_out(conn: Connection, error: str) -> str:
    """A failure that happened because the host's time was up, said so first."""
    prefix = f"host timed out after {conn.budget.limit_s:g}s"
    return error if error.startswith(prefix) else f"{prefix}: {error}"


def run_fleet(hosts: Sequence[Host], task: HostTask[T], options: FleetOptions | None = None,
              progress: ProgressSink | None = None) -> dict[str, Outcome[T]]:
    """Run ``task`` on every host; return host name -> outcome, in the hosts' order."""
    options = options or FleetOptions()
    outcomes: dict[str, Outcome[T]] = {}
    if progress:
        progress.start(len(hosts))
    stopped: str | None = None
    for batch in batches(hosts, options.serial):
        if stopped:
            for host in batch:
                outcomes[host.name] = Outcome(host.name, "skipped", stopped)
            continue
        processes = worker_processes(len(batch), options)
        done = _run_threads(batch, task, options, progress) if processes == 1 else \
            _run_processes(batch, task, options, progress, processes)
        outcomes.update(done)
        if options.max_fail_percent is not None:
            bad = sum(o.status in ("failed", "unreachable") for o in done.values())
            if bad * 100 > options.max_fail_percent * len(batch):
                stopped = (f"not started: {bad} of {len(batch)} hosts in the previous batch "
                           f"failed (max-fail-percent {options.max_fail_percent:g})")
    if progress:
        progress.finish()
    return {h.name: outcomes[h.name] for h in hosts}


def _run_threads(batch: list[Host], task: HostTask[T], options: FleetOptions,
                 progress: ProgressSink | None) -> dict[str, Outcome[T]]:
    # A pool per batch: a host that timed out may still hold its thread, and must not hold
    # up the next batch.
    pool = ThreadPoolExecutor(max_workers=max(1, min(options.forks, len(batch))),
                              thread_name_prefix="gpufleet-host")
    try:
        return _run_batch(pool, batch, task, options, progress)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


class _Sender:
    """A worker's progress sink: every outcome goes to the parent the moment it is known."""

    def __init__(self, conn: multiprocessing.connection.Connection) -> None:
        self.conn = conn
        self.lock = threading.Lock()

    def start(self, total: int) -> None:
        return

    def finish(self) -> None:
        return

    def host_done(self, outcome: Outcome[object]) -> None:
        with self.lock:
            try:
                self.conn.send(outcome)
            except Exception as exc:  # a value that cannot be pickled fails its host only
                self.conn.send(Outcome(outcome.host, "failed", "internal error: the outcome "
                                       f"could not leave its worker process: {exc}",
                                       outcome.duration, round_trips=outcome.round_trips))


def _worker(shard: list[Host], task: HostTask[T], options: FleetOptions,
            conn: multiprocessing.connection.Connection) -> None:
    """A worker process: the thread path over its shard, then exit at once (a thread of a
    host past its deadline must not keep the process alive)."""
    code = 0
    try:
        _run_threads(shard, task, options, _Sender(conn))
    except BaseException:
        code = 70
    finally:
        conn.close()
        os._exit(code)


def _run_processes(batch: list[Host], task: HostTask[T], options: FleetOptions,
                   progress: ProgressSink | None, processes: int) -> dict[str, Outcome[T]]:
    """The batch dealt round-robin to ``processes`` forked workers, forks shared out."""
    context = multiprocessing.get_context("fork")
    share = FleetOptions(forks=max(1, math.ceil(options.forks / processes)),
                         host_timeout=options.host_timeout,
                         default_timeout=options.default_timeout, connect=options.connect)
    readers: dict[multiprocessing.connection.Connection, tuple[Any, list[Host]]] = {}
    for index in range(processes):
        shard = batch[index::processes]
        reader, writer = context.Pipe(duplex=False)
        worker = context.Process(target=_worker, args=(shard, task, share, writer),
                                 name=f"gpufleet-fleet-{index}", daemon=True)
        worker.start()
        writer.close()
        readers[reader] = (worker, shard)
    results: dict[str, Outcome[T]] = {}
    while readers:
        for ready in multiprocessing.connection.wait(list(readers), timeout=0.5):
            assert isinstance(ready, multiprocessing.connection.Connection)
            reader = ready
            try:
                outcome: Outcome[T] = reader.recv()
            except (EOFError, OSError):
                worker, shard = readers.pop(reader)
                worker.join()
                for host in shard:
                    if host.name not in results:
                        results[host.name] = Outcome(
                            host.name, "failed", "internal error: its worker process ended "
                            f"(exit status {worker.exitcode}) before the host did")
                        _report(progress, results[host.name])
                continue
            results[outcome.host] = outcome
            _report(progress, outcome)
    return results


def _run_batch(pool: ThreadPoolExecutor, batch: list[Host], task: HostTask[T],
               options: FleetOptions, progress: ProgressSink | None) -> dict[str, Outcome[T]]:
    budgets = {h.name: Budget() for h in batch}
    conns: dict[str, Connection] = {
        h.name: options.connector(h, options.connect, budgets[h.name]) for h in batch}
    limits: dict[str, float] = {}
    started: dict[str, float] = {}
    lock = threading.Lock()

    def job(host: Host) -> Outcome[T]:
        try:
            limit = host_timeout(host, options)
        except GpufleetError as exc:
            return Outcome(host.name, "failed", str(exc))
        budgets[host.name].start(limit)
        with lock:
            limits[host.name] = limit
            started[host.name] = time.monotonic()
        return _run_one(host, conns[host.name], task)

    # Finished futures arrive on a queue (no waiter over every pending future per
    # completion), and deadlines are scanned twice a second, not after every completion:
    # the controller's cost per host stays flat as the batch grows.
    done: queue.SimpleQueue[Future[Outcome[T]]] = queue.SimpleQueue()
    futures: dict[Future[Outcome[T]], Host] = {}
    for host in batch:
        future = pool.submit(job, host)
        futures[future] = host
        future.add_done_callback(done.put)
    results: dict[str, Outcome[T]] = {}
    pending = set(futures)
    next_scan = time.monotonic() + DEADLINE_SCAN_S
    while pending:
        try:
            fut = done.get(timeout=max(0.0, next_scan - time.monotonic()))
        except queue.Empty:
            fut = None
        if fut is not None and fut in pending:
            pending.discard(fut)
            host = futures[fut]
            results[host.name] = fut.result()
            _report(progress, results[host.name])
        now = time.monotonic()
        if now < next_scan:
            continue
        next_scan = now + DEADLINE_SCAN_S
        with lock:
            running = {name: (started[name], limits[name]) for name in started}
        for fut in list(pending):
            host = futures[fut]
            began, limit = running.get(host.name, (None, None))
            if began is not None and limit is not None and now - began > limit:
                pending.discard(fut)
                budget = budgets[host.name]
                budget.cancel(f"host timed out after {limit:g}s")
                results[host.name] = Outcome(
                    host.name, "failed", f"host timed out after {limit:g}s", now - began,
                    budget.progress, round_trips=conns[host.name].round_trips)
                _report(progress, results[host.name])
    return results


def _report(progress: ProgressSink | None, outcome: Outcome[T]) -> None:
    log.info("%s: %s in %.1fs%s", outcome.host, outcome.status, outcome.duration,
             f": {outcome.error}" if outcome.error else "")
    if progress:
        progress.host_done(outcome)  # type: ignore[arg-type]


def summarize(outcomes: dict[str, Outcome[T]]) -> dict[str, int]:
    """Count outcomes per status."""
    counts = {s: 0 for s in ("ok", "changed", "failed", "unreachable", "skipped")}
    for outcome in outcomes.values():
        counts[outcome.status] += 1
    return counts
