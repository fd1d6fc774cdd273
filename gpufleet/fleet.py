"""Fan a per-host function out over many hosts: forks, timeouts, serial batches, max-fail.

Hosts are independent: one host's failure or hang never stops the others, and
every host ends with exactly one outcome. Each host works under its own budget: when
its time is up the host is reported failed at once, its connections are closed, and it
gets no further command, reconnect or reboot; the report keeps what the task had
published as its progress (``Budget.progress``) by then.
"""

from __future__ import annotations

import math
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Generic, Literal, Protocol, TypeVar

from gpufleet.connection import Budget, Connection, ConnectOptions, Unreachable, connect
from gpufleet.errors import GpufleetError
from gpufleet.inventory import Host

T = TypeVar("T")
Status = Literal["ok", "changed", "failed", "unreachable", "skipped"]
DEFAULT_FORKS = 128
DEFAULT_HOST_TIMEOUT_S = 1800.0
HOST_TIMEOUT_VAR = "gpufleet_host_timeout"


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
        # A pool per batch: a host that timed out may still hold its thread, and must not
        # hold up the next batch.
        pool = ThreadPoolExecutor(max_workers=max(1, min(options.forks, len(batch))),
                                  thread_name_prefix="gpufleet-host")
        try:
            done = _run_batch(pool, batch, task, options, progress)
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
        outcomes.update(done)
        if options.max_fail_percent is not None:
            bad = sum(o.status in ("failed", "unreachable") for o in done.values())
            if bad * 100 > options.max_fail_percent * len(batch):
                stopped = (f"not started: {bad} of {len(batch)} hosts in the previous batch "
                           f"failed (max-fail-percent {options.max_fail_percent:g})")
    if progress:
        progress.finish()
    return {h.name: outcomes[h.name] for h in hosts}


def _run_batch(pool: ThreadPoolExecutor, batch: list[Host], task: HostTask[T],
               options: FleetOptions, progress: ProgressSink | None) -> dict[str, Outcome[T]]:
    budgets = {h.name: Budget() for h in batch}
    conns: dict[str, Connection] = {h.name: connect(h, options.connect, budgets[h.name])
                                    for h in batch}
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

    futures: dict[Future[Outcome[T]], Host] = {pool.submit(job, h): h for h in batch}
    results: dict[str, Outcome[T]] = {}
    pending = set(futures)
    while pending:
        finished, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
        for fut in finished:
            host = futures[fut]
            if host.name not in results:
                results[host.name] = fut.result()
                _report(progress, results[host.name])
        now = time.monotonic()
        for fut in list(pending):
            host = futures[fut]
            with lock:
                began, limit = started.get(host.name), limits.get(host.name)
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
    if progress:
        progress.host_done(outcome)  # type: ignore[arg-type]


def summarize(outcomes: dict[str, Outcome[T]]) -> dict[str, int]:
    """Count outcomes per status."""
    counts = {s: 0 for s in ("ok", "changed", "failed", "unreachable", "skipped")}
    for outcome in outcomes.values():
        counts[outcome.status] += 1
    return counts
