"""The watch suite: its verdict on the standing watch's report (an open finding fails with
the first one's message and the silences, silenced and pending findings pass and are
recorded, an unread report is unknown) and a run of the suite over local connections, each
node judged by its own report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpufleet import app
from gpufleet.conformance import registry
from gpufleet.conformance.checks.watch import verdict
from gpufleet.errors import GpufleetError
from gpufleet.facts.parsers.watch import watch_report
from gpufleet.facts.watch import Reading, from_fact
from gpufleet.inventory.load import load_inventory
from gpufleet.report.schemas import validate
from tests.unit.test_watch_facts import CLEAN, COMPACT, MIXED, fresh


def _only(status: str) -> str:
    doc = json.loads(MIXED)
    doc["findings"] = [f for f in doc["findings"] if f["status"] == status]
    return json.dumps(doc)


def test_an_open_finding_fails_with_the_first_and_the_silences() -> None:
    judged = verdict(Reading(from_fact(watch_report(COMPACT))))
    assert judged.failure == (
        "rdma/mlx5_1/1/flaps: mlx5_1/1 went down 3 times in 12h0m (limit 3 within 12h) "
        "(+1 more); pcie/0000:18:00.0/aer_fatal silenced until 2025-12-07T09:33:20Z")
    assert [f["id"] for f in judged.properties["watch"]["open"]] == [
        "rdma/mlx5_1/1/flaps", "ecc/GPU5/uncorrectable_aggregate"]


def test_silenced_and_pending_findings_pass_and_are_recorded() -> None:
    silenced = verdict(Reading(from_fact(watch_report(_only("silenced")))))
    assert silenced.failure is None
    assert silenced.properties["silenced"] == [
        "nvlink/GPU3/link7/replay silenced until 2025-12-07T06:46:40Z (RMA ticket 4471, cable "
        "swap on Friday)"]
    pending = verdict(Reading(from_fact(watch_report(_only("pending")))))
    assert pending.failure is None
    assert [f["id"] for f in pending.properties["watch"]["pending"]] == [
        "pcie/0000:3b:00.0/width"]
    assert verdict(Reading(from_fact(watch_report(CLEAN)))).failure is None


def test_a_report_older_than_the_bound_fails_naming_its_age() -> None:
    stale = from_fact(watch_report(COMPACT), clock=1765007200.0 + 3600)
    judged = verdict(Reading(stale, max_age_s=1800.0))
    assert judged.failure == (
        "the watch's last report is 1h old (2025-12-06T07:46:40Z), more than "
        "watch_max_age_s 1800: the watch stopped running; rdma/mlx5_1/1/flaps: mlx5_1/1 went "
        "down 3 times in 12h0m (limit 3 within 12h) (+1 more); pcie/0000:18:00.0/aer_fatal "
        "silenced until 2025-12-07T09:33:20Z")
    assert verdict(Reading(stale, max_age_s=3600.0)).failure is not None  # still open
    assert verdict(Reading(from_fact(watch_report(CLEAN), clock=1765003600.25 + 3600),
                           max_age_s=3600.0)).failure is None


def test_the_bound_is_a_suite_setting_above_zero(tmp_path: Path) -> None:
    suite = registry.suite("watch")
    assert suite.variables["watch_max_age_s"].default == 1800
    (tmp_path / "hosts.yml").write_text("all:\n  hosts:\n    n1:\n      watch_max_age_s: -5\n")
    with pytest.raises(GpufleetError, match="watch_max_age_s must be a number above 0, got -5"):
        registry.validate(load_inventory(tmp_path / "hosts.yml").hosts.values(), [suite])


def test_a_report_that_could_not_be_read_is_unknown() -> None:
    judged = verdict(Reading(None, "unparseable output: watch report: expected version 1"))
    assert judged.failure == ("unknown: the watch's report: unparseable output: watch report: "
                              "expected version 1")


def test_the_suite_is_in_the_default_set_and_bootstrap_does_not_run_it() -> None:
    assert "watch" in registry.members_of("conformance")
    assert "watch" not in [s.name for s in registry.bootstrap_suites()]


def test_each_node_is_judged_by_its_own_report(tmp_path: Path) -> None:
    for name, text in (("failing", fresh(MIXED)), ("silenced", fresh(_only("silenced"))),
                       ("stopped", fresh(CLEAN, age=7200))):
        (tmp_path / name).mkdir()
        (tmp_path / name / "watch-report.json").write_text(text)
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "watch-report.json").write_text('{"version": 2}')
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(f"""all:
  vars:
    ansible_connection: local
    slurm_healthcheck: true
  hosts:
    failing:
      slurm_healthcheck_state_dir: {tmp_path}/failing
    silenced:
      slurm_healthcheck_state_dir: {tmp_path}/silenced
    broken:
      slurm_healthcheck_state_dir: {tmp_path}/broken
    stopped:
      slurm_healthcheck_state_dir: {tmp_path}/stopped
    unwatched:
      node_watch: false
""")
    report = tmp_path / "conformance.json"
    assert app.conformance_cmd(str(inventory), suites="watch", json_path=str(report)) == 1
    document = json.loads(report.read_text())
    validate(document)
    results = {r["host"]: r for r in document["results"]}
    assert {h: r["outcome"] for h, r in results.items()} == {
        "failing": "fail", "silenced": "pass", "broken": "fail", "stopped": "fail",
        "unwatched": "skip"}
    assert results["stopped"]["message"].startswith("the watch's last report is 2h old (")
    assert results["stopped"]["message"].endswith(
        "more than watch_max_age_s 1800: the watch stopped running")
    assert results["stopped"]["properties"]["watch"]["stale"] == results["stopped"]["message"]
    assert results["failing"]["properties"]["watch"]["stale"] is None
    assert results["failing"]["message"].startswith(
        "rdma/mlx5_0/1/symbol_error: mlx5_0/1 symbol_error +14 in 1h0m (14.0/h, limit 10/h "
        "over 1h); nvlink/GPU3/link7/replay silenced until ")
    assert results["silenced"]["properties"]["silenced"] == [
        "nvlink/GPU3/link7/replay silenced until 2025-12-07T06:46:40Z (RMA ticket 4471, cable "
        "swap on Friday)"]
    assert results["broken"]["message"] == (
        "unknown: the watch's report: unparseable output: watch report: expected version 1 "
        "(this gpufleet reads version 1), got '2'")
    assert results["unwatched"]["message"].startswith("the watch is not in use on this node")
