"""Drift and the standing watch: one item per node with an open finding, named after the
first with the count; silenced findings shown, never failing; a report that could not be
read shown, never failing; the JSON document, the terminal and the exit code."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from gpufleet.drift import report as drift_report
from gpufleet.drift.compare import HostDrift, watch_item
from gpufleet.drift.run import DriftOptions, DriftRun, check_fleet, exit_code
from gpufleet.errors import VarError
from gpufleet.facts.parsers.watch import watch_report
from gpufleet.facts.watch import Reading, from_fact
from gpufleet.inventory.target import Target
from gpufleet.report import html
from gpufleet.report.schemas import validate
from gpufleet.roles import select
from tests.unit.test_watch_facts import CLEAN, COMPACT, MIXED, fresh, inventory

# ---- drift -------------------------------------------------------------------------------


def test_a_node_with_open_findings_is_one_drift_item_naming_the_first() -> None:
    item = watch_item("node01", Reading(from_fact(watch_report(COMPACT))))
    assert item is not None
    assert (item.item, item.kind, item.desired, item.actual) == (
        "watch/rdma/mlx5_1/1/flaps", "watch", "no open finding",
        "2 open: mlx5_1/1 went down 3 times in 12h0m (limit 3 within 12h)")
    silenced_only = json.loads(MIXED)
    silenced_only["findings"] = silenced_only["findings"][1:]  # pending and silenced
    assert watch_item("node01", Reading(from_fact(watch_report(json.dumps(silenced_only))))
                      ) is None
    assert watch_item("node01", Reading(None, "no watch report at /x", 1800.0)) is None


def test_a_watch_that_stopped_is_one_drift_item_naming_the_age_and_what_it_had_open() -> None:
    old = from_fact(watch_report(COMPACT), clock=1765007200.0 + 86400)
    item = watch_item("node01", Reading(old, max_age_s=1800.0))
    assert item is not None
    assert (item.item, item.kind, item.desired, item.actual) == (
        "watch/stopped", "watch", "a report at most 1800 s old",
        "the watch's last report is 1d old (2025-12-06T07:46:40Z), more than "
        "watch_max_age_s 1800: the watch stopped running; it had 2 open: mlx5_1/1 went down 3 "
        "times in 12h0m (limit 3 within 12h)")
    clean = watch_item("node01", Reading(from_fact(watch_report(CLEAN), clock=1765009400.25),
                                         max_age_s=1800.0))
    assert clean is not None and clean.actual == (
        "the watch's last report is 1h36m old (2025-12-06T06:46:40Z), more than "
        "watch_max_age_s 1800: the watch stopped running")
    assert watch_item("node01", Reading(from_fact(watch_report(CLEAN), clock=1765005400.25),
                                        max_age_s=1800.0)) is None


@pytest.fixture
def watched(tmp_path: Path) -> Target:
    """Three hosts over local connections: one whose watch has an open, a pending and a
    silenced finding, one whose watch has not run, one without the watch."""
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "watch-report.json").write_text(fresh(MIXED))
    inv = inventory(tmp_path, f"""all:
  vars:
    ansible_connection: local
    slurm_healthcheck: true
    slurm_healthcheck_state_dir: {tmp_path}/state
  hosts:
    failing:
    silent:
      slurm_healthcheck_state_dir: {tmp_path}/none
    unwatched:
      node_watch: false
""")
    return Target.select(inv, None)


def _printed(run: DriftRun) -> str:
    out = io.StringIO()
    drift_report.print_report(Console(file=out, width=200, color_system=None), run)
    return out.getvalue()


def test_drift_reports_the_open_finding_shows_the_silence_and_the_unread_report(
        watched: Target) -> None:
    run = check_fleet(watched, DriftOptions(roles=select("nccl_env")))
    failing, silent, unwatched = (run.hosts[h] for h in ("failing", "silent", "unwatched"))
    assert [i.item for i in failing.items] == ["watch/rdma/mlx5_0/1/symbol_error"]
    assert failing.status == "drifted"
    assert (silent.status, silent.items, unwatched.status) == ("clean", [], "clean")
    assert "watch" in run.roles_checked
    assert exit_code(run) == 1
    run.remediation = {"failing": {"status": "ok", "error": None, "applied": []}}
    assert exit_code(run) == 1  # no provisioning run clears a watch finding
    document = json.loads(json.dumps(drift_report.to_json(run)))
    validate(document)
    hosts = document["hosts"]
    assert [f["id"] for f in hosts["failing"]["watch"]["silenced"]] == [
        "nvlink/GPU3/link7/replay"]
    assert [f["id"] for f in hosts["failing"]["watch"]["pending"]] == [
        "pcie/0000:3b:00.0/width"]
    assert hosts["silent"]["watch"]["unknown"].startswith("no watch report at ")
    assert hosts["unwatched"]["watch"] is None
    text = _printed(run)
    assert ("watch: nvlink/GPU3/link7/replay silenced until 2025-12-07T06:46:40Z (RMA ticket "
            "4471, cable swap on Friday)") in text
    assert "watch report unknown: no watch report at " in text
    assert "1 open: mlx5_0/1 symbol_error +14 in 1h0m" in text
    page = html.render_drift(document, [])
    assert '<section id="watch">' in page
    assert "silenced nvlink/GPU3/link7/replay" in page
    assert "until 2025-12-07T06:46:40Z (RMA ticket 4471, cable swap on Friday)" in page
    assert "watch report unknown" in page


def test_a_node_whose_findings_are_all_silenced_is_clean(watched: Target, tmp_path: Path
                                                         ) -> None:
    doc = json.loads(fresh(MIXED))
    doc["findings"][0].update(status="silenced", silenced_until=1765100000,
                              silence_reason="\x1b[31mred\x1b[0m [bold]x[/bold] <script>")
    (tmp_path / "state" / "watch-report.json").write_text(json.dumps(doc))
    run = check_fleet(Target.select(watched.inventory, "failing"), DriftOptions(roles=[]))
    host: HostDrift = run.hosts["failing"]
    assert (host.status, host.items) == ("clean", [])
    assert exit_code(run) == 0
    text = _printed(run)
    assert "rdma/mlx5_0/1/symbol_error silenced until 2025-12-07T09:33:20Z" in text
    assert "\x1b" not in text and "[bold]x[/bold]" in text
    page = html.render_drift(json.loads(json.dumps(drift_report.to_json(run))), [])
    assert "[bold]x[/bold] &lt;script&gt;" in page and "<script>" not in page.split(
        '<section id="watch">')[1].split("</section>")[0]


def test_drift_reports_a_watch_that_stopped_running(watched: Target, tmp_path: Path) -> None:
    """A report two hours old, past watch_max_age_s (1800 by default): the node drifts with
    watch/stopped, in the terminal, the JSON (validated) and the page; a site whose watch
    runs every 3 hours sets the bound higher and the same node is clean."""
    (tmp_path / "state" / "watch-report.json").write_text(fresh(CLEAN, age=7200))
    run = check_fleet(Target.select(watched.inventory, "failing"), DriftOptions(roles=[]))
    host: HostDrift = run.hosts["failing"]
    assert host.status == "drifted" and [i.item for i in host.items] == ["watch/stopped"]
    assert host.items[0].actual is not None and host.items[0].actual.startswith(
        "the watch's last report is 2h old (")
    assert host.items[0].actual.endswith(
        "more than watch_max_age_s 1800: the watch stopped running")
    assert exit_code(run) == 1
    document = json.loads(json.dumps(drift_report.to_json(run)))
    validate(document)
    watch = document["hosts"]["failing"]["watch"]
    assert watch["stale"] == host.items[0].actual and watch["age_s"] >= 7200
    assert "the watch stopped running" in _printed(run)
    assert "the watch stopped running" in html.render_drift(document, [])
    inv = inventory(tmp_path, f"""all:
  hosts:
    failing:
      ansible_connection: local
      slurm_healthcheck: true
      slurm_healthcheck_state_dir: {tmp_path}/state
      watch_max_age_s: 10800
""")
    relaxed = check_fleet(Target.select(inv, None), DriftOptions(roles=[]))
    assert (relaxed.hosts["failing"].status, relaxed.hosts["failing"].items) == ("clean", [])
    assert relaxed.hosts["failing"].to_dict()["watch"]["stale"] is None
    bad = inventory(tmp_path, """all:
  hosts:
    failing:
      ansible_connection: local
      slurm_healthcheck: true
      watch_max_age_s: 0
""")
    with pytest.raises(VarError, match="watch_max_age_s must be a number above 0, got 0"):
        check_fleet(Target.select(bad, None), DriftOptions(roles=[]))
