"""The HTML reports rendered by headless Chromium: a 1,000-host conformance report and
reports built from a real 2x H200 machine's documents produce a screenshot that is not
blank, and the DOM the browser built holds every host, every failing check, and none of
the markup hostile names carry."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpufleet.report import html
from tests import chromium
from tests.conftest import FIXTURES
from tests.report_docs import HOSTILE, h200_conformance, synthetic_conformance
from tests.unit.test_html_report import MAX_BYTES, Page, failing

MIN_COLOURS = 64


@pytest.fixture(autouse=True)
def _chromium() -> None:
    chromium.require()


def test_a_1000_host_conformance_report_renders_in_chromium(tmp_path: Path) -> None:
    doc = synthetic_conformance(1000, hostile=True)
    page = tmp_path / "conformance.html"
    html.write_html(str(page), html.render_conformance(doc))
    assert page.stat().st_size < MAX_BYTES
    shot = chromium.render(page)
    assert shot.png.startswith(b"\x89PNG\r\n\x1a\n") and len(shot.png) > 10_000
    assert chromium.colours(shot.png) > MIN_COLOURS
    dom = Page(shot.dom)
    hosts = {r["host"] for r in doc["results"]} - {"fleet"}
    assert sorted(dom.attrs("data-h")) == sorted(hosts)
    assert failing(doc) <= dom.failures()
    assert dom.count("img") == 0 and dom.count("script") == 1
    assert HOSTILE in dom.attrs("data-h")
    assert dom.count("svg") >= 10


def test_reports_of_a_real_machine_render_in_chromium(tmp_path: Path) -> None:
    conformance = h200_conformance()
    drift = json.loads((FIXTURES / "h200x1" / "gpufleet" / "drift.json").read_text())
    pages = {"conformance": html.render_conformance(conformance),
             "acceptance": html.render_acceptance([conformance]),
             "drift": html.render_drift(drift, [drift])}
    for name, text in pages.items():
        page = tmp_path / f"{name}.html"
        html.write_html(str(page), text)
        shot = chromium.render(page, height=1600)
        assert chromium.colours(shot.png) > MIN_COLOURS, name
        dom = Page(shot.dom)
        assert dom.attrs("data-h") == ["gpu-local"], name
        if name != "drift":
            assert failing(conformance) <= dom.failures(), name
            assert "GPU0 mirrors (r -0.98)" in "".join(dom.text), name
