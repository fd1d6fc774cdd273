"""run_fleet over worker processes gives each host the same outcome as the thread path:
statuses, errors, values, round trips, deadlines with the progress they keep, batches and
max-fail-percent, one progress report per host (hosts with ansible_connection: local)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from gpufleet.connect.connection import Connection, Unreachable
from gpufleet.connect.fleet import (
    PROCESS_MIN_HOSTS,
    FleetOptions,
    Outcome,
    TaskResult,
    run_fleet,
    worker_processes,
)
from gpufleet.errors import GpufleetError
from gpufleet.inventory.load import load_inventory
from gpufleet.inventory.model import Host


def hosts(tmp_path: Path, count: int) -> list[Host]:
    lines = ["all:", "  vars:", "    ansible_connection: local", "  hosts:"]
    lines += [f"    n{i:02d}:" for i in range(1, count + 1)]
    lines += ["    n05:", "      gpufleet_host_timeout: 1"] if count >= 5 else []
    path = tmp_path / "hosts.yml"
    path.write_text("\n".join(lines) + "\n")
    return load_inventory(path).select("all")


class Progress:
    def __init__(self) -> None:
        self.events: list[Any] = []
        self.lock = threading.Lock()

    def start(self, total: int) -> None:
        self.events.append(("start", total))

    def host_done(self, outcome: Outcome[object]) -> None:
        with self.lock:
            self.events.append(("done", outcome.host, outcome.status, os.getpid()))

    def finish(self) -> None:
        self.events.append(("finish",))


def task(host: Host, conn: Connection) -> TaskResult[Any]:
    """A different ending per host, decided by its number."""
    number = int(host.name[1:])
    kept: list[str] = []
    conn.budget.progress = kept
    out = conn.run(f"echo {host.name}; echo $$").stdout.split()
    kept.append(f"ran on {out[0]}")
    ending = number % 7
    if ending == 0:
        return TaskResult({"pid": int(out[1]) > 0, "worker": os.getpid()}, changed=True)
    if ending == 1:
        return TaskResult(out[0], failed=f"{host.name}: step failed")
    if ending == 2:
        raise Unreachable(f"connection to {host.name} dropped")
    if ending == 3:
        raise GpufleetError(f"{host.name}: bad variable")
    if ending == 4:
        raise KeyError("boom")
    if host.name == "n05":
        conn.run("sleep 20", timeout=60)  # n05 has a 1 s budget
        kept.append("never")
    return TaskResult([*kept, "done"])


def normal(outcomes: dict[str, Outcome[Any]]) -> dict[str, tuple[Any, ...]]:
    def value(v: Any) -> Any:
        return {k: x for k, x in v.items() if k != "worker"} if isinstance(v, dict) else v

    def error(text: str | None) -> str | None:
        # A host past its deadline is failed by the runner or by its own command's kill,
        # whichever comes first; the second form only adds what was stopped.
        return text.split(": stopped at the host's deadline")[0] if text else text

    return {n: (o.status, error(o.error), value(o.value), o.round_trips)
            for n, o in outcomes.items()}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> list[Host]:
    return hosts(tmp_path_factory.mktemp("fleet"), 21)


def test_processes_give_every_host_the_outcome_threads_give(fleet: list[Host]) -> None:
    threads, by_threads = Progress(), None
    start = time.monotonic()
    by_threads = run_fleet(fleet, task, FleetOptions(processes=1), threads)
    threads_s = time.monotonic() - start
    procs = Progress()
    start = time.monotonic()
    by_procs = run_fleet(fleet, task, FleetOptions(processes=3), procs)
    procs_s = time.monotonic() - start
    assert normal(by_procs) == normal(by_threads)
    assert list(by_procs) == [h.name for h in fleet]
    assert by_procs["n05"].status == "failed"
    assert str(by_procs["n05"].error).startswith("host timed out after 1s")
    assert by_procs["n05"].value == ["ran on n05"]
    assert str(by_procs["n04"].error).startswith("internal error at test_fleet_processes.py:")
    workers = {o.value["worker"] for o in by_procs.values() if isinstance(o.value, dict)}
    assert len(workers) == 3 and os.getpid() not in workers
    assert {o.value["worker"] for o in by_threads.values()
            if isinstance(o.value, dict)} == {os.getpid()}
    # one progress display, in this process: one report per host, then finish
    for progress in (threads, procs):
        done = [e for e in progress.events if e[0] == "done"]
        assert sorted(e[1] for e in done) == sorted(h.name for h in fleet)
        assert {e[3] for e in done} == {os.getpid()}
        assert progress.events[0] == ("start", 21) and progress.events[-1] == ("finish",)
    assert threads_s < 12 and procs_s < 12  # n05's 20 s sleep was cut at its deadline


def test_batches_and_max_fail_percent_work_the_same(fleet: list[Host]) -> None:
    for processes in (1, 2):
        outcomes = run_fleet(fleet[:8], task, FleetOptions(serial="4", max_fail_percent=10,
                                                           processes=processes))
        assert [o.status for o in outcomes.values()][4:] == ["skipped"] * 4, processes
        assert outcomes["n08"].error == (
            "not started: 4 of 4 hosts in the previous batch failed (max-fail-percent 10)")


def test_a_value_that_cannot_leave_its_worker_fails_that_host_only(fleet: list[Host]) -> None:
    def unpicklable(host: Host, conn: Connection) -> TaskResult[Any]:
        return TaskResult(threading.Lock() if host.name == "n02" else host.name)

    outcomes = run_fleet(fleet[:4], unpicklable, FleetOptions(processes=2))
    assert outcomes["n01"].value == "n01" and outcomes["n03"].status == "ok"
    assert outcomes["n02"].status == "failed"
    assert "could not leave its worker process" in str(outcomes["n02"].error)


def test_a_worker_that_dies_fails_its_hosts_and_not_the_others(fleet: list[Host]) -> None:
    def dies(host: Host, conn: Connection) -> TaskResult[str]:
        if host.name == "n02":
            time.sleep(0.5)
            os._exit(3)
        if host.name == "n04":  # same worker as n02, still busy when it dies
            time.sleep(3)
        return TaskResult(host.name)

    outcomes = run_fleet(fleet[:4], dies, FleetOptions(processes=2))
    assert (outcomes["n01"].status, outcomes["n03"].status) == ("ok", "ok")
    assert outcomes["n02"].status == outcomes["n04"].status == "failed"
    assert outcomes["n02"].error == ("internal error: its worker process ended (exit "
                                     "status 3) before the host did")


def test_processes_are_used_for_large_batches_only() -> None:
    cores = os.cpu_count() or 1
    assert worker_processes(PROCESS_MIN_HOSTS - 1, FleetOptions()) == 1
    assert worker_processes(PROCESS_MIN_HOSTS, FleetOptions()) == min(cores, 2)
    assert worker_processes(10_000, FleetOptions()) == cores
    assert worker_processes(3, FleetOptions(processes=8)) == 3
    assert worker_processes(5000, FleetOptions(processes=1)) == 1


def test_the_environment_can_set_the_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFLEET_PROCESSES", "3")
    assert worker_processes(10, FleetOptions()) == 3
    assert worker_processes(10, FleetOptions(processes=1)) == 1
    monkeypatch.setenv("GPUFLEET_PROCESSES", "many")
    with pytest.raises(GpufleetError, match="GPUFLEET_PROCESSES must be a positive number"):
        worker_processes(10, FleetOptions())
