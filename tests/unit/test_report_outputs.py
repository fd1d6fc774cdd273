"""The outputs of a conformance run in the order that keeps a failed node out of service:
the machine-read outputs (JSON, JUnit, Prometheus) and the drain first (the drain before
the textfile, which waits for its lock), the HTML page last; a node's figure that is NaN,
infinite or of the wrong type costs that figure only (null in the JSON), and a page that
cannot be rendered is one warning, never the run's failure. An acceptance that measured
nothing on a node is NOT MEASURED, never ACCEPTED, on the page, in the JSON and in the exit
code."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

import pytest

from gpufleet import app
from gpufleet.conformance.results import ConformanceReport, Result
from gpufleet.report import html
from gpufleet.report.schemas import validate
from gpufleet.slurm.client import RunFindings
from tests.report_docs import synthetic_conformance
from tests.unit.test_html_report import Page
from tests.unit.test_metrics import samples

INVENTORY = """all:
  vars:
    ansible_connection: local
    gpufleet_scheduler: slurm
  hosts:
    gpu01:
    gpu02:
"""


def hostile_report() -> ConformanceReport:
    """gpu02's AllReduce probe answered NaN busbw, an infinite trial and a number where
    its trials belong; its storage read is infinite; its thermal peak NaN."""
    nan, inf = float("nan"), float("inf")
    busbw = {"unit": "GB/s", "median": nan, "gate": 315.0, "passed": False, "trials": 5,
             "remeasured": [inf, 1.0]}
    results = [
        Result("allreduce", "test_each_node_alone", "gpu01", "pass", "", 1.0, {
            "largest_size": 2**33, "busbw_gbps": 346.8, "verdicts": {
                "allreduce.busbw.8589934592": {"unit": "GB/s", "median": 346.8,
                                               "gate": 315.0, "passed": True,
                                               "trials": [346.0, 347.5]}}}),
        Result("allreduce", "test_each_node_alone", "gpu02", "fail", "busbw nan GB/s", 1.0, {
            "largest_size": 2**33, "busbw_gbps": nan,
            "verdicts": {"allreduce.busbw.8589934592": busbw}}),
        Result("storage", "test_storage_throughput", "gpu02", "pass", "", 1.0,
               {"seq_read_mbps": inf, "need_mbps": 1200.0}),
        Result("thermal", "test_thermal_soak", "gpu02", "pass", "", 1.0,
               {"max_temp_c": nan, "temp_limit_c": 85.0}),
    ]
    return ConformanceReport("hosts.yml", "d" * 64, 1.7e9, 10.0, results,
                             data={"thermal": {"gpu02": {"curves": {"GPU0": {
                                 "t": 7, "temp_c": [nan, inf]}}, "max_temp_c": 85.0}}})


def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, report: ConformanceReport,
        suites: str = "acceptance") -> tuple[int, list[str], Path]:
    """conformance_cmd over ``report`` with every output and --drain-failed; the exit code,
    the hosts whose findings reached the scheduler, and the output directory."""
    (tmp_path / "hosts.yml").write_text(INVENTORY)
    drained: list[str] = []

    def update(results: list[tuple[Any, list[RunFindings]]]) -> dict[str, str]:
        drained.extend(host.name for host, found in results if found[0].failed)
        return {}

    monkeypatch.setattr(app, "run_suites", lambda target, options: report)
    monkeypatch.setattr(app.drain, "update", update)
    out = tmp_path / "out"
    code = app.conformance_cmd(
        str(tmp_path / "hosts.yml"), suites=suites, drain_failed=True,
        json_path=str(out / "c.json"), junit_path=str(out / "c.xml"),
        prometheus_path=str(out / "c.prom"), html_path=str(out / "c.html"))
    return code, drained, out


def test_non_finite_figures_and_a_number_for_a_list_cost_those_figures_only(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code, drained, out = run(tmp_path, monkeypatch, hostile_report())
    assert code == 1 and drained == ["gpu02"]
    def strict(token: str) -> None:
        raise AssertionError(f"{token} is not JSON")

    document = json.loads((out / "c.json").read_text(), parse_constant=strict)
    assert document["summary"]["fail"] == 1
    [gpu02] = [r for r in document["results"] if r["host"] == "gpu02"
               and r["suite"] == "allreduce"]
    assert gpu02["properties"]["busbw_gbps"] is None  # NaN is null in JSON
    assert gpu02["properties"]["verdicts"]["allreduce.busbw.8589934592"]["remeasured"] \
        == [None, 1.0]
    assert "gpu02" in (out / "c.xml").read_text()
    found = samples((out / "c.prom").read_text())
    median = ("gpufleet_conformance_allreduce_busbw_bytes_per_second",
              (("check", "each_node_alone"), ("host", "gpu02"), ("inventory", "hosts"),
               ("size_bytes", "8589934592")))
    assert math.isnan(found[median])
    page = (out / "c.html").read_text()
    assert "nan GB/s" in page and "inf MB/s" in page and "nan C" in page  # shown as such
    assert "346.8" in page  # gpu01's figures are drawn


@pytest.mark.parametrize("suites", ["acceptance", "stack"])
def test_a_page_that_cannot_render_is_a_warning_after_every_other_output(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        suites: str) -> None:
    def broken(*args: object, **kwargs: object) -> str:
        raise ValueError("cannot convert float NaN to integer")

    monkeypatch.setattr(html, "render_acceptance", broken)
    monkeypatch.setattr(html, "render_conformance", broken)
    with caplog.at_level(logging.WARNING, "gpufleet"):
        code, drained, out = run(tmp_path, monkeypatch, hostile_report(), suites)
    assert code == 1 and drained == ["gpu02"]
    assert sorted(p.name for p in out.iterdir()) == ["c.json", "c.prom", "c.prom.lock", "c.xml"]
    [warning] = caplog.messages
    assert warning.startswith(f"--html {out / 'c.html'}: the report could not be written "
                              "(ValueError: cannot convert float NaN to integer)")
    assert "\n" not in warning


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf"),
                                 pytest.param(10**400, id="10**400"), "x", [1.0], {"a": 1},
                                 None, True])
def test_any_value_of_a_node_s_figures_renders(bad: object) -> None:
    """Every number a node sent (in results' properties and the data) replaced by ``bad``,
    then every list by a number: both pages render."""
    def every(node: Any, leaf: Any) -> Any:
        if isinstance(node, dict):
            return {k: every(v, leaf) for k, v in node.items()}
        if isinstance(node, list):
            swapped = leaf(node)
            return swapped if swapped is not node else [every(v, leaf) for v in node]
        return leaf(node)

    doc = synthetic_conformance(6, seconds=30)
    for leaf in (lambda v: bad if isinstance(v, int | float) and not isinstance(v, bool)
                 else v, lambda v: 7 if isinstance(v, list) else v):
        changed = {**doc, "data": every(doc["data"], leaf),
                   "results": [{**r, "properties": every(r["properties"], leaf)}
                               for r in doc["results"]]}
        assert "node0001" in html.render_conformance(changed)
        assert "node0001" in html.render_acceptance([changed])


def skipped_acceptance(measured: bool) -> ConformanceReport:
    """An acceptance run of two nodes: host sizing passed, and every figure the acceptance
    asks for skipped (``measured``: gpu01's storage read and both soaks measured)."""
    results = []
    for host in ("gpu01", "gpu02"):
        results += [
            Result("host_sizing", "test_memory", host, "pass", "", 0.1, {}),
            Result("storage", "test_storage_throughput", host,
                   "pass" if measured and host == "gpu01" else "skip",
                   "" if measured and host == "gpu01" else "storage_path is not set", 0.1,
                   {"seq_read_mbps": 1500.0} if measured and host == "gpu01" else {}),
            Result("thermal", "test_thermal_soak", host, "pass" if measured else "skip",
                   "" if measured else "torch is not installed on the node", 0.1,
                   {"max_temp_c": 71.0} if measured else {})]
    return ConformanceReport("hosts.yml", "d" * 64, 1.7e9, 10.0, results)


def test_an_acceptance_that_measured_nothing_is_not_accepted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code, drained, out = run(tmp_path, monkeypatch, skipped_acceptance(False))
    assert code == 3 and drained == []
    document = json.loads((out / "c.json").read_text())
    validate(document)
    assert document["acceptance"] == {"verdict": "NOT MEASURED",
                                      "unmeasured": ["gpu01", "gpu02"]}
    words = page_text((out / "c.html").read_text())
    assert "NOT MEASURED" in words and "ACCEPTED" not in words
    assert "nothing measured on 2 node(s)" in words


def test_an_acceptance_that_measured_each_node_is_accepted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code, _, out = run(tmp_path, monkeypatch, skipped_acceptance(True))
    assert code == 0
    document = json.loads((out / "c.json").read_text())
    validate(document)
    assert document["acceptance"] == {"verdict": "ACCEPTED", "unmeasured": []}
    words = page_text((out / "c.html").read_text())
    assert "ACCEPTED" in words
    assert "NOT ACCEPTED" not in words and "NOT MEASURED" not in words



def page_text(page: str) -> str:
    """The page's text as a browser shows it."""
    return " ".join(Page(page).text)
