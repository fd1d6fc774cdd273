"""The terminal at fleet scale: hosts alike folded into host sets (ClusterShell's NodeSet),
failing hosts first; progress without a terminal in a few lines, not one per host."""

from __future__ import annotations

import io

from gpufleet.conformance.plugin import summary_lines
from gpufleet.conformance.results import Result
from gpufleet.connect.fleet import Outcome
from gpufleet.drift import report as drift_report
from gpufleet.drift.compare import DriftItem, HostDrift
from gpufleet.drift.run import DriftRun
from gpufleet.report import terminal


def test_host_sets_fold_names_and_keep_the_ones_a_set_cannot_hold() -> None:
    assert terminal.host_set([f"node{i:03d}" for i in range(1, 999)]) == "node[001-998]"
    assert terminal.host_set(["gpu01", "gpu02", "login", "gpu04"]) == "gpu[01-02,04],login"
    assert terminal.host_set(["a[1", "gpu01", "b,c"]) == "gpu01,a[1,b,c"


def _drift_run(hosts: int) -> DriftRun:
    found = {f"node{i:04d}": HostDrift(f"node{i:04d}", "clean") for i in range(1, hosts + 1)}
    for name in ("node0007", "node0500"):
        found[name] = HostDrift(name, "drifted", [DriftItem(
            name, "nccl_env", "file /etc/nccl.conf", "file", "127 bytes", "143 bytes (differs)",
            "-NCCL_DEBUG=WARN\n+NCCL_DEBUG=INFO\n")])
    found["node0999"] = HostDrift("node0999", "unreachable", error="connect timed out")
    return DriftRun("inv", "0" * 64, found, [], [], [], 0.0, 60.0, ["nccl_env"])


def _text(write: object) -> str:
    buffer = io.StringIO()
    con = terminal.console(buffer)
    write(con)  # type: ignore[operator]
    return buffer.getvalue()


def test_a_1000_host_drift_report_is_a_few_lines_worst_first() -> None:
    text = _text(lambda con: drift_report.print_report(con, _drift_run(1000)))
    lines = text.splitlines()
    assert len(lines) < 20, text
    assert lines[1].split() == ["node0999", "unreachable", "connect", "timed", "out"]
    assert lines[2].split()[:2] == ["node[0007,0500]", "drifted"]
    assert "node[0001-0006,0008-0499,0501-0998,1000]" in lines[3]
    assert text.count("+NCCL_DEBUG=INFO") == 1  # the two hosts' one table and diff


def test_conformance_summary_folds_hosts_alike_failing_first() -> None:
    results = [Result("gpu", "test_health", f"gpu{i:03d}", "pass", "", 0.1, {})
               for i in range(1, 301)]
    results[41] = Result("gpu", "test_health", "gpu042", "fail", "Xid 79", 0.1, {})
    lines = [line for line, _ in summary_lines(results, {})]
    assert lines[0].split()[:2] == ["gpu042", "FAIL"]
    assert lines[1].strip() == "FAIL gpu/test_health: Xid 79"
    assert lines[2].split()[:2] == ["gpu[001-041,043-300]", "PASS"]
    assert len(lines) == 3


def test_the_recap_folds_hosts_with_the_same_outcome() -> None:
    outcomes = {f"n{i}": Outcome(f"n{i}", "ok", duration=float(i)) for i in range(1, 6)}
    outcomes["n3"] = Outcome("n3", "failed", error="apt failed", duration=2.0)
    text = _text(lambda con: terminal.print_recap(con, outcomes))
    lines = text.splitlines()
    assert lines[1].split()[:2] == ["n3", "failed"] and "apt failed" in lines[2]
    assert lines[3].split() == ["n[1-2,4-5]", "ok", "5.0s"]


def test_progress_without_a_terminal_is_a_line_per_failure_and_a_summary() -> None:
    buffer = io.StringIO()
    progress = terminal.TerminalProgress("drift", buffer)
    progress.start(1000)
    for i in range(1000):
        status = "unreachable" if i == 17 else "ok"
        progress.host_done(Outcome(f"node{i:04d}", status, error="timed out"
                                   if status != "ok" else None))
    progress.finish()
    lines = buffer.getvalue().splitlines()
    assert lines[0] == "drift: node0017 unreachable: timed out"
    assert lines[-1].startswith("drift: 1000/1000 done, 0 failed, 1 unreachable, ")
    assert len(lines) <= 3


def test_progress_of_a_small_fleet_names_each_host() -> None:
    buffer = io.StringIO()
    progress = terminal.TerminalProgress("facts", buffer)
    progress.start(2)
    progress.host_done(Outcome("node01", "ok", duration=0.25))
    progress.host_done(Outcome("node02", "failed", error="x"))
    assert buffer.getvalue().splitlines() == ["[1/2] node01 ok (0.2s)",
                                              "[2/2] node02 failed (0.0s)"]
