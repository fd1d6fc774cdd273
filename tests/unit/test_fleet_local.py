"""run_fleet over hosts with ansible_connection: local (commands run with sh on this machine)."""

from __future__ import annotations

import itertools
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from gpufleet.connect.connection import Connection, Unreachable
from gpufleet.connect.fleet import FleetOptions, Outcome, TaskResult, batches, run_fleet, summarize
from gpufleet.connect.local import LocalConnection
from gpufleet.errors import GpufleetError
from gpufleet.inventory.load import load_inventory
from gpufleet.inventory.model import Host, Inventory


def local_inventory(tmp_path: Path, count: int) -> Inventory:
    lines = ["all:", "  vars:", "    ansible_connection: local", "  hosts:"]
    lines += [f"    n{i:02d}:" for i in range(1, count + 1)]
    path = tmp_path / "hosts.yml"
    path.write_text("\n".join(lines) + "\n")
    return load_inventory(path)


def hosts(tmp_path: Path, count: int) -> list[Host]:
    return local_inventory(tmp_path, count).select("all")


class Progress:
    def __init__(self) -> None:
        self.events: list[Any] = []
        self.lock = threading.Lock()

    def start(self, total: int) -> None:
        self.events.append(("start", total))

    def host_done(self, outcome: Outcome[object]) -> None:
        with self.lock:
            self.events.append(("done", outcome.host, outcome.status))

    def finish(self) -> None:
        self.events.append(("finish",))


# --------------------------------------------------------------------------- batches


@pytest.mark.parametrize(("count", "serial", "sizes"), [
    (5, None, [5]),
    (5, "", [5]),
    (5, "2", [2, 2, 1]),
    (4, "50%", [2, 2]),
    (3, "50%", [2, 1]),
    (10, "25%", [3, 3, 3, 1]),
    (3, "1%", [1, 1, 1]),
    (3, "0", [1, 1, 1]),
    (3, " 10 ", [3]),
    (0, None, []),
    (0, "2", []),
])
def test_batches(tmp_path: Path, count: int, serial: str | None, sizes: list[int]) -> None:
    hs = hosts(tmp_path, count) if count else []
    result = batches(hs, serial)
    assert [len(b) for b in result] == sizes
    assert [h for b in result for h in b] == hs


@pytest.mark.parametrize("serial", ["two", "%", "5x"])
def test_batches_rejects_nonsense(tmp_path: Path, serial: str) -> None:
    with pytest.raises(GpufleetError, match=r"^--serial must be a number or a percentage, got "):
        batches(hosts(tmp_path, 2), serial)


# --------------------------------------------------------------------------- outcomes


def test_outcomes_ok_changed_failed_unreachable_and_internal_error(tmp_path: Path) -> None:
    where: dict[str, int] = {}

    def task(host: Host, conn: Connection) -> TaskResult[str]:
        assert isinstance(conn, LocalConnection)
        out = conn.run(f"printf '%s' {host.name}").stdout
        if host.name == "n01":
            return TaskResult(out)
        if host.name == "n02":
            return TaskResult(out, changed=True)
        if host.name == "n03":
            return TaskResult(out, changed=True, failed="package foo=1 failed")
        if host.name == "n04":
            raise GpufleetError("facts script produced no sections")
        if host.name == "n05":
            raise Unreachable("connection to n05 was lost")
        where["line"] = sys._getframe().f_lineno + 1
        return TaskResult({"a": 1}["missing"])

    progress = Progress()
    outcomes = run_fleet(hosts(tmp_path, 6), task, FleetOptions(), progress)
    assert list(outcomes) == ["n01", "n02", "n03", "n04", "n05", "n06"]
    assert {n: (o.status, o.error, o.value) for n, o in outcomes.items()} == {
        "n01": ("ok", None, "n01"),
        "n02": ("changed", None, "n02"),
        "n03": ("failed", "package foo=1 failed", "n03"),
        "n04": ("failed", "facts script produced no sections", None),
        "n05": ("unreachable", "connection to n05 was lost", None),
        "n06": ("failed", f"internal error at test_fleet_local.py:{where['line']}: "
                          "KeyError: 'missing'", None),
    }
    assert all(o.round_trips == 1 for o in outcomes.values())
    assert all(o.duration >= 0 for o in outcomes.values())
    assert progress.events[0] == ("start", 6)
    assert progress.events[-1] == ("finish",)
    assert sorted(progress.events[1:-1]) == sorted(
        ("done", n, o.status) for n, o in outcomes.items())
    assert summarize(outcomes) == {"ok": 1, "changed": 1, "failed": 3, "unreachable": 1,
                                   "skipped": 0}


def test_internal_error_names_the_frame_that_raised(tmp_path: Path) -> None:
    def task(host: Host, conn: Connection) -> TaskResult[None]:
        conn.run("true")
        int("not a number")
        return TaskResult(None)

    [outcome] = run_fleet(hosts(tmp_path, 1), task).values()
    line = task.__code__.co_firstlineno + 2
    assert outcome.status == "failed"
    assert outcome.error == (f"internal error at test_fleet_local.py:{line}: ValueError: "
                             "invalid literal for int() with base 10: 'not a number'")
    assert outcome.round_trips == 1


def test_each_host_gets_its_own_local_connection(tmp_path: Path) -> None:
    seen: dict[str, tuple[str, int]] = {}
    lock = threading.Lock()

    def task(host: Host, conn: Connection) -> TaskResult[None]:
        conn.run("true")
        conn.run("true")
        with lock:
            seen[host.name] = (conn.host.name, id(conn))
        return TaskResult(None)

    outcomes = run_fleet(hosts(tmp_path, 3), task, FleetOptions(forks=3))
    assert {n: o.round_trips for n, o in outcomes.items()} == {"n01": 2, "n02": 2, "n03": 2}
    assert {n: s[0] for n, s in seen.items()} == {"n01": "n01", "n02": "n02", "n03": "n03"}
    assert len({s[1] for s in seen.values()}) == 3


# --------------------------------------------------------------------------- serial


class Timeline:
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def task(self, host: Host, conn: Connection) -> TaskResult[None]:
        with self.lock:
            self.events.append(("start", host.name))
        conn.run("sleep 0.05")
        with self.lock:
            self.events.append(("end", host.name))
        return TaskResult(None, changed=True)


def test_serial_batches_run_one_after_another(tmp_path: Path) -> None:
    timeline = Timeline()
    outcomes = run_fleet(hosts(tmp_path, 5), timeline.task, FleetOptions(serial="2"))
    assert [o.status for o in outcomes.values()] == ["changed"] * 5
    index = {event: i for i, event in enumerate(timeline.events)}
    groups = [["n01", "n02"], ["n03", "n04"], ["n05"]]
    for earlier, later in itertools.pairwise(groups):
        last_end = max(index[("end", h)] for h in earlier)
        first_start = min(index[("start", h)] for h in later)
        assert last_end < first_start, timeline.events


def test_serial_percentage(tmp_path: Path) -> None:
    timeline = Timeline()
    run_fleet(hosts(tmp_path, 4), timeline.task, FleetOptions(serial="50%"))
    starts = [h for kind, h in timeline.events if kind == "start"]
    assert set(starts[:2]) == {"n01", "n02"}
    assert set(starts[2:]) == {"n03", "n04"}
    index = {event: i for i, event in enumerate(timeline.events)}
    assert max(index[("end", "n01")], index[("end", "n02")]) < \
        min(index[("start", "n03")], index[("start", "n04")])


def test_forks_one_runs_hosts_one_at_a_time(tmp_path: Path) -> None:
    timeline = Timeline()
    run_fleet(hosts(tmp_path, 3), timeline.task, FleetOptions(forks=1))
    assert [kind for kind, _ in timeline.events] == ["start", "end"] * 3


# --------------------------------------------------------------------------- max fail percent


def failing_on(*names: str) -> Any:
    def task(host: Host, conn: Connection) -> TaskResult[None]:
        if host.name in names:
            return TaskResult(None, failed="boom")
        return TaskResult(None)
    return task


def test_max_fail_percent_skips_later_batches(tmp_path: Path) -> None:
    progress = Progress()
    outcomes = run_fleet(hosts(tmp_path, 6), failing_on("n02"),
                         FleetOptions(serial="2", max_fail_percent=40), progress)
    assert {n: o.status for n, o in outcomes.items()} == {
        "n01": "ok", "n02": "failed", "n03": "skipped", "n04": "skipped", "n05": "skipped",
        "n06": "skipped"}
    assert outcomes["n03"].error == ("not started: 1 of 2 hosts in the previous batch failed "
                                     "(max-fail-percent 40)")
    # skipped hosts never started, and are not reported as done
    assert sorted(e[1] for e in progress.events if e[0] == "done") == ["n01", "n02"]


def test_max_fail_percent_is_a_strict_threshold(tmp_path: Path) -> None:
    outcomes = run_fleet(hosts(tmp_path, 4), failing_on("n02"),
                         FleetOptions(serial="2", max_fail_percent=50))
    assert [o.status for o in outcomes.values()] == ["ok", "failed", "ok", "ok"]


def test_max_fail_percent_zero_stops_at_the_first_failure(tmp_path: Path) -> None:
    outcomes = run_fleet(hosts(tmp_path, 3), failing_on("n01"),
                         FleetOptions(serial="1", max_fail_percent=0))
    assert [o.status for o in outcomes.values()] == ["failed", "skipped", "skipped"]
    assert outcomes["n02"].error == ("not started: 1 of 1 hosts in the previous batch failed "
                                     "(max-fail-percent 0)")


def test_unreachable_counts_as_failed_for_max_fail(tmp_path: Path) -> None:
    def task(host: Host, conn: Connection) -> TaskResult[None]:
        if host.name == "n01":
            raise Unreachable("no route to host")
        return TaskResult(None)

    outcomes = run_fleet(hosts(tmp_path, 2), task, FleetOptions(serial="1",
                                                                max_fail_percent=0))
    assert [o.status for o in outcomes.values()] == ["unreachable", "skipped"]


def test_without_max_fail_percent_every_batch_runs(tmp_path: Path) -> None:
    outcomes = run_fleet(hosts(tmp_path, 3), failing_on("n01", "n02", "n03"),
                         FleetOptions(serial="1"))
    assert [o.status for o in outcomes.values()] == ["failed"] * 3


# --------------------------------------------------------------------------- timeout


def test_per_host_timeout_fails_only_the_slow_host(tmp_path: Path) -> None:
    release = threading.Event()

    def task(host: Host, conn: Connection) -> TaskResult[str]:
        conn.run("true")
        if host.name == "n02":
            release.wait(5)
            return TaskResult("late", changed=True)
        return TaskResult("fast")

    progress = Progress()

    def finish_late() -> None:
        # let the hung task end once the timeout has been reported, so the run can return
        while not any(e[0] == "done" and e[1] == "n02" for e in list(progress.events)):
            time.sleep(0.05)
        release.set()

    helper = threading.Thread(target=finish_late)
    helper.start()
    start = time.monotonic()
    outcomes = run_fleet(hosts(tmp_path, 3), task, FleetOptions(host_timeout=1.0), progress)
    elapsed = time.monotonic() - start
    helper.join(5)
    assert {n: (o.status, o.error, o.value) for n, o in outcomes.items()} == {
        "n01": ("ok", None, "fast"),
        "n02": ("failed", "host timed out after 1s", None),
        "n03": ("ok", None, "fast"),
    }
    assert 1.0 <= outcomes["n02"].duration < 3.0
    assert outcomes["n02"].round_trips == 1
    assert elapsed < 4.5
    # one report per host: the late result of the timed-out task is dropped
    assert sorted(e[1] for e in progress.events if e[0] == "done") == ["n01", "n02", "n03"]


def test_a_timed_out_host_does_not_hold_up_the_next_batch(tmp_path: Path) -> None:
    started: dict[str, float] = {}
    release = threading.Event()

    def task(host: Host, conn: Connection) -> TaskResult[None]:
        started[host.name] = time.monotonic()
        if host.name == "n01":
            release.wait(2.5)
        return TaskResult(None)

    begin = time.monotonic()
    try:
        outcomes = run_fleet(hosts(tmp_path, 2), task,
                             FleetOptions(forks=1, serial="1", host_timeout=0.5))
    finally:
        release.set()
    assert outcomes["n01"].status == "failed"
    assert started["n02"] - begin < 1.6


def test_a_timed_out_host_keeps_the_progress_it_published(tmp_path: Path) -> None:
    def task(host: Host, conn: Connection) -> TaskResult[list[str]]:
        done: list[str] = []
        conn.budget.progress = done
        done.append("first change")
        conn.run("sleep 30", timeout=600)
        done.append("never")
        return TaskResult(done)

    start = time.monotonic()
    [outcome] = run_fleet(hosts(tmp_path, 1), task, FleetOptions(host_timeout=1.0)).values()
    assert time.monotonic() - start < 5
    assert outcome.status == "failed"
    assert outcome.error is not None and outcome.error.startswith("host timed out after 1s")
    assert outcome.value == ["first change"]


def test_the_inventory_sets_a_hosts_budget_and_the_flag_wins(tmp_path: Path) -> None:
    path = tmp_path / "hosts.yml"
    path.write_text("all:\n  vars:\n    ansible_connection: local\n  hosts:\n"
                    "    slow:\n      gpufleet_host_timeout: 1\n    fast:\n")
    inventory = load_inventory(path)

    def task(host: Host, conn: Connection) -> TaskResult[float | None]:
        return TaskResult(conn.budget.limit_s)

    outcomes = run_fleet(inventory.select("all"), task, FleetOptions(default_timeout=99))
    assert {n: o.value for n, o in outcomes.items()} == {"slow": 1.0, "fast": 99}
    outcomes = run_fleet(inventory.select("all"), task, FleetOptions(host_timeout=7))
    assert {n: o.value for n, o in outcomes.items()} == {"slow": 7, "fast": 7}


def test_a_bad_host_timeout_fails_that_host_with_its_name(tmp_path: Path) -> None:
    path = tmp_path / "hosts.yml"
    path.write_text("all:\n  vars:\n    ansible_connection: local\n  hosts:\n"
                    "    bad:\n      gpufleet_host_timeout: soon\n    good:\n")
    outcomes = run_fleet(load_inventory(path).select("all"), lambda h, c: TaskResult(None))
    assert outcomes["good"].status == "ok"
    assert (outcomes["bad"].status, outcomes["bad"].error) == (
        "failed", "host bad: variable gpufleet_host_timeout must be a positive number of "
                  "seconds, got 'soon'")


def test_a_task_reports_a_host_lost_with_what_it_kept(tmp_path: Path) -> None:
    def task(host: Host, conn: Connection) -> TaskResult[str]:
        return TaskResult("applied one", changed=True, unreachable="connection dropped")

    [outcome] = run_fleet(hosts(tmp_path, 1), task).values()
    assert (outcome.status, outcome.error, outcome.value) == (
        "unreachable", "connection dropped", "applied one")
