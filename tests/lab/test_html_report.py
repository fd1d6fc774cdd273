"""The HTML reports of real lab runs, rendered in headless Chromium: drift twice (nccl.conf
edited on one node in between, so the history holds a clean run and a drifted one) and the
conformance suites with real figures (AllReduce on gloo alone, in pairs and together;
storage reads from every node at once; host sizing with one node's threshold out of reach),
each written by the command's --html (and checked equal to the page its --json document
renders). ``GPUFLEET_HTML_SCREENSHOTS=DIR`` keeps the screenshots."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from gpufleet import app
from gpufleet.drift.history import History
from gpufleet.lab.cluster import Lab
from gpufleet.report import html
from tests import chromium
from tests.lab.conftest import PROVISIONED, node_sh
from tests.lab.test_provision import override
from tests.unit.test_html_chromium import MIN_COLOURS
from tests.unit.test_html_report import MAX_BYTES, Page, failing

NODES = PROVISIONED.split(":")


def _check(page: Path, name: str, height: int = 2400) -> Page:
    """Render ``page``; the screenshot is not blank."""
    assert page.stat().st_size < MAX_BYTES
    shot = chromium.render(page, height=height)
    assert chromium.colours(shot.png) > MIN_COLOURS, name
    kept = os.environ.get("GPUFLEET_HTML_SCREENSHOTS")
    if kept:
        Path(kept).mkdir(parents=True, exist_ok=True)
        (Path(kept) / f"html-{name}.png").write_bytes(shot.png)
        shutil.copy(page, Path(kept) / f"html-{name}.html")
    return Page(shot.dom)


# In the scale tier (./scripts/test -m scale): 80 s of lab runs on the session lab, whose
# tests are CI's longest path; tests/unit/test_html_chromium.py renders real reports (a
# GPU machine's and 1000 hosts') in Chromium on every CI run.
@pytest.mark.scale
def test_drift_and_conformance_reports_of_the_lab_render_in_chromium(
        lab: Lab, provisioned: Path, tmp_path: Path) -> None:
    chromium.require()
    reports = tmp_path / "history"
    first = app.drift_cmd(str(provisioned), limit=PROVISIONED, outputs=app.DriftOutputs(
        json_path=str(tmp_path / "drift-1.json"), report_dir=str(reports)))
    assert first == 0
    node_sh(lab, "node03", "echo 'NCCL_DEBUG=TRACE' >> /etc/nccl.conf")
    try:
        second = app.drift_cmd(str(provisioned), limit=PROVISIONED, outputs=app.DriftOutputs(
            json_path=str(tmp_path / "drift.json"), report_dir=str(reports),
            html_path=str(tmp_path / "drift.html")))
    finally:
        assert app.provision_cmd(str(provisioned), limit="node03") == 0
    assert second == 1
    drift = json.loads((tmp_path / "drift.json").read_text())
    [kept] = {p.parent for p in reports.rglob("drift-*.json")}
    history = History(kept, "drift").documents()
    assert len(history) == 2
    with override(provisioned, "host_vars", "node02", {"host_min_cpus": 4096}):
        code = app.conformance_cmd(str(provisioned), limit=PROVISIONED,
                                   suites="stack,allreduce,storage,host_sizing",
                                   json_path=str(tmp_path / "conformance.json"),
                                   html_path=str(tmp_path / "conformance.html"))
    assert code == 1
    conformance = json.loads((tmp_path / "conformance.json").read_text())
    assert failing(conformance) == {("node02", "host_sizing/cpus")}

    page = tmp_path / "drift.html"  # written by drift --html
    assert page.read_text() == html.render_drift(drift, history)
    dom = _check(page, "drift", 1800)
    assert sorted(dom.attrs("data-h")) == NODES
    assert "nccl_env/file /etc/nccl.conf" in dom.attrs("data-item")
    words = "\n".join(dom.text)
    assert "Hosts per run, last 2 runs" in words and "-NCCL_DEBUG=TRACE" in words

    page = tmp_path / "conformance.html"  # written by conformance --html
    assert page.read_text() == html.render_conformance(conformance)
    dom = _check(page, "conformance", 3200)
    assert sorted(dom.attrs("data-h")) == NODES
    assert failing(conformance) <= dom.failures()
    words = "\n".join(dom.text)
    for title in ("AllReduce busbw per size, each node alone", "node01 (pass)",
                  "AllReduce busbw per size across nodes", "gate 0.005 GB/s for the nodes",
                  "Sequential read per node, every node reading at once",
                  "below host_min_cpus 4096"):
        assert title in words, title
    assert dom.count("svg") >= 7  # the fleet, four nodes, across nodes, storage

    page = tmp_path / "acceptance.html"
    html.write_html(str(page), html.render_acceptance([conformance]))
    dom = _check(page, "acceptance", 2400)
    rows = {a["data-host"] for t, a in dom.tags if t == "tr" and "data-host" in a}
    assert set(NODES) <= rows
    words = "\n".join(dom.text)
    assert "NOT ACCEPTED" in words and "GB/s on 4 nodes" in words
    assert "kernel" in words  # the versions every node shares, from the stack suite
