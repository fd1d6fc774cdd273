"""The HTML reports, read back as a browser's parser reads them: every host and every
failing check is on the page, host sets fold, hostile names and messages stay text, the
plots carry the gates, baselines and the mirror window, and a 1,000-host report stays small
and fast to render."""

from __future__ import annotations

import base64
import hashlib
import json
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from gpufleet.report import html
from gpufleet.report.html.conformance import counter_rows, rack_rows, results_of
from gpufleet.report.html.page import Row, fold, natural
from gpufleet.report.html.verdict import ACCEPTANCE
from tests.conftest import ROOT
from tests.report_docs import (
    HOSTILE,
    HOSTILE_MESSAGE,
    h200_conformance,
    host_names,
    synthetic_conformance,
    synthetic_drift,
)

MAX_BYTES = 5 * 2**20


class Page(HTMLParser):
    """The elements, attributes and text of a page."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str]]] = []
        self.text: list[str] = []
        self.scripts: list[str] = []
        self._in_script = False
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, {k: v or "" for k, v in attrs}))
        self._in_script = tag == "script"

    def handle_endtag(self, tag: str) -> None:
        self._in_script = False

    def handle_data(self, data: str) -> None:
        (self.scripts if self._in_script else self.text).append(data)

    def attrs(self, name: str) -> list[str]:
        return [a[name] for _, a in self.tags if name in a]

    def failures(self) -> set[tuple[str, str]]:
        return {(a["data-host"], a["data-check"]) for t, a in self.tags
                if t == "tr" and "data-host" in a and "data-check" in a}

    def count(self, tag: str) -> int:
        return sum(t == tag for t, _ in self.tags)


def failing(doc: dict[str, Any]) -> set[tuple[str, str]]:
    return {(r["host"], f"{r['suite']}/{r['check'].removeprefix('test_')}")
            for r in doc["results"] if r["outcome"] == "fail"}


@pytest.fixture(scope="module")
def fleet() -> dict[str, Any]:
    return synthetic_conformance(1000, hostile=True)


def test_every_host_and_every_failing_check_is_on_the_page(fleet: dict[str, Any]) -> None:
    page = Page(html.render_conformance(fleet))
    hosts = {r["host"] for r in fleet["results"]} - {"fleet"}
    assert len(hosts) == 1000
    assert sorted(page.attrs("data-h")) == sorted(hosts)
    assert failing(fleet) <= page.failures()
    messages = {r["message"] for r in fleet["results"] if r["outcome"] == "fail"}
    text = "".join(page.text)
    assert all(m in text for m in messages)


def test_failing_hosts_come_first_and_passing_hosts_fold(fleet: dict[str, Any]) -> None:
    page = Page(html.render_conformance(fleet))
    cells = [a for t, a in page.tags if "data-h" in a]
    statuses = [a["title"].split(": ", 1)[1].split(" ", 1)[0] for a in cells
                if a["data-h"] != HOSTILE]
    first_pass = statuses.index("PASS")
    assert "FAIL" not in statuses[first_pass:]
    text = "".join(page.text)
    assert "node[0998-1000]" in text  # the three unreachable nodes, one set
    assert "978" in text  # the passing set's count


def test_hosts_fold_in_clustershell_notation_and_odd_names_stay_as_they_are() -> None:
    assert fold(host_names(998)) == "node[0001-0998]"
    assert fold(["gpu7", "node2", "node10", "node3"]) == "gpu7,node[2-3,10]"
    assert fold(["rack1-node01", "rack1-node02", "rack2-node01"]) == \
        "rack1-node[01-02],rack2-node01"
    assert fold(["node1", "a,b", "c[1-2]", "<x>"]) == "node1,<x>,a,b,c[1-2]"
    assert sorted(host_names(12), key=natural) == host_names(12)
    assert sorted(["n10", "n9", "n1"], key=natural) == ["n1", "n9", "n10"]


def test_hostile_host_names_and_messages_stay_text() -> None:
    doc = synthetic_conformance(40, hostile=True)
    runs = synthetic_drift(60, 3, hostile=True)
    pages = [html.render_conformance(doc), html.render_acceptance([doc]),
             html.render_drift(runs[-1], runs)]
    for text in pages:
        page = Page(text)
        assert page.count("img") == 0
        assert page.count("script") == 1
        assert not any(k.startswith("on") for _, a in page.tags for k in a)
        assert HOSTILE not in text and "<script>alert" not in text
        assert HOSTILE in page.attrs("data-h")
        assert any(HOSTILE_MESSAGE in t for t in page.text)


def test_the_page_fetches_nothing_and_runs_only_its_own_script(fleet: dict[str, Any]) -> None:
    text = html.render_conformance(fleet)
    page = Page(text)
    [policy] = [a["content"] for t, a in page.tags
                if t == "meta" and a.get("http-equiv") == "Content-Security-Policy"]
    assert "default-src 'none'" in policy
    [script] = page.scripts
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    assert f"script-src 'sha256-{digest}'" in policy
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", text)
    assert not {t for t, _ in page.tags} & {"link", "img", "iframe", "object", "embed"}
    assert {a["href"] for t, a in page.tags if t == "a" and "href" in a} == \
        {f"#{a['id']}" for t, a in page.tags if t == "tr" and a.get("id")}


def test_a_1000_host_report_is_small(fleet: dict[str, Any]) -> None:
    pages = {"conformance": html.render_conformance(fleet),
             "acceptance": html.render_acceptance([fleet])}
    runs = synthetic_drift(1000, 30)
    pages["drift"] = html.render_drift(runs[-1], runs)
    sizes = {k: len(v.encode()) for k, v in pages.items()}
    assert all(size < MAX_BYTES for size in sizes.values()), sizes


def test_allreduce_plots_show_each_node_against_its_gate_and_baseline(
        fleet: dict[str, Any]) -> None:
    text = html.render_conformance(fleet)
    page = Page(text)
    titles = "\n".join(page.text)
    assert "AllReduce busbw per size, each node alone" in titles
    assert "node0010 (fail)" in titles  # a slow node, among the first per-node plots
    assert "node0010: gate 318.3 GB/s at 8G (baseline)" in titles
    assert re.search(r"node0010: [\d.]+ GB/s at 8G, under its gate", titles)
    assert "gate 180 GB/s for the nodes together" in titles
    assert "median of 997 nodes" in titles
    assert "12 of 997 nodes, failing nodes first" in titles
    assert text.count('stroke-dasharray="5 3"') >= 12  # every per-node plot's baseline


def test_a_real_soak_s_mirror_image_is_marked() -> None:
    """The real 2x H200 run that failed on its clock mirroring its temperature (judged from
    t=0 then): both GPUs' windows hatched, r named, the 85 C limit drawn."""
    doc = h200_conformance()
    page = Page(html.render_conformance(doc))
    titles = "\n".join(page.text)
    assert "GPU0 mirrors (r -0.98)" in titles and "GPU1 mirrors (r -0.93)" in titles
    assert "limit 85 C" in titles
    assert "gpu-local: SM clock" in titles
    assert "GPU0 r = -0.98, clock fell 28% (MIRRORED)" in titles
    assert sum(a.get("fill") == "url(#hatch)" for _, a in page.tags) == 4  # temp, clock x2
    assert ("gpu-local", "thermal/thermal_soak") in page.failures()


def test_drift_shows_each_item_with_its_hosts_and_its_history() -> None:
    runs = synthetic_drift(200, 5)
    text = html.render_drift(runs[-1], runs[:-1])
    page = Page(text)
    hosts = set(runs[-1]["hosts"])
    assert sorted(page.attrs("data-h")) == sorted(hosts)
    assert set(page.attrs("data-item")) == {"nccl/package libnccl2", "nccl_env/file /etc/nccl.conf"}
    words = "\n".join(page.text)
    assert "connect timed out after 10s" in words and "nvidia-smi timed out after 20 s" in words
    assert "Hosts per run, last 5 runs" in words and "Drift items over time" in words
    assert "+NCCL_DEBUG=TRACE" in words  # the diff
    assert "NEW 4" in words
    assert "group training: nccl" in words
    again = html.render_drift(runs[-1], runs)  # the current run is in the history once
    assert "last 5 runs" in "".join(Page(again).text)
    alone = html.render_drift(runs[0])
    assert "Drift over time" not in alone
    same_second = [dict(r, started_at=runs[0]["started_at"], generated_at=runs[0]["generated_at"])
                   for r in runs]
    assert "last 5 runs" in "".join(Page(html.render_drift(same_second[-1], same_second)).text)


def test_drift_of_a_real_single_node_run() -> None:
    doc = __import__("json").loads((Path(__file__).parent.parent / "fixtures" / "h200x1" /
                                    "gpufleet" / "drift.json").read_text())
    page = Page(html.render_drift(doc, [doc]))
    assert page.attrs("data-h") == ["gpu-local"]
    assert "No host differs from the inventory." in "".join(page.text)


def test_the_acceptance_report_has_the_four_figures_the_checks_and_the_versions(
        fleet: dict[str, Any]) -> None:
    doc = synthetic_conformance(30)
    boot = {"schema": "gpufleet.bootstrap/1", "host": "node0031", "ready": False,
            "reason": "certify: allreduce/each_node_alone on node0031: busbw under gate",
            "steps": [{"step": "trust", "status": "ok", "detail": "host key recorded",
                       "duration_s": 0.1, "data": {}},
                      {"step": "certify", "status": "failed", "detail": "busbw under gate",
                       "duration_s": 80.0, "data": {}},
                      {"step": "mark", "status": "ok", "detail": "NOT READY", "duration_s": 1,
                       "data": {"state": {"host": "node0031", "versions": {
                           "driver": "580.95.05", "kernel": "6.8.0-45-generic"}}}}]}
    page = Page(html.render_acceptance([doc], bootstrap=[boot]))
    words = "\n".join(page.text)
    for column in ACCEPTANCE:
        assert column in words
    rows = {a["data-host"] for t, a in page.tags if t == "tr" and "data-host" in a}
    assert {f"node{i:04d}" for i in range(1, 32)} <= rows
    assert "NOT ACCEPTED" in words and "NOT READY" in words
    assert "on 26 nodes" in words  # the multi-node run, without the 4 left out
    assert "left out" in words
    assert "2.23.4-1+cuda12.6" in words  # node0016's NCCL
    assert "node[0001-0015,0017-0027]" in words  # versions folded (three were unreachable)
    assert "node0031" in words and "580.95.05" in words
    assert "allreduce.busbw.8589934592" in words
    assert failing(doc) <= page.failures()
    clean = synthetic_conformance(4, seed=3)
    clean["results"] = [r for r in clean["results"] if r["outcome"] != "fail"]
    assert "ACCEPTED" in "".join(Page(html.render_acceptance([clean])).text).replace(
        "NOT ACCEPTED", "")


def test_write_html_writes_the_page_atomically(tmp_path: Path) -> None:
    target = tmp_path / "reports" / "conformance.html"
    html.write_html(str(target), "<!DOCTYPE html><p>\u00e9</p>")
    assert target.read_bytes() == "<!DOCTYPE html><p>\u00e9</p>".encode()
    assert [p.name for p in target.parent.iterdir()] == ["conformance.html"]


def test_the_counters_that_moved_and_the_line_rate_are_on_the_page() -> None:
    doc = synthetic_conformance(4)
    moved = "18,342 drops on eth1 (statistics/rx_dropped)"
    doc["results"] += [
        {"suite": "allreduce", "check": "test_nic_counters_during_allreduce",
         "host": "gpu0002", "outcome": "fail", "message": f"gpu0002: {moved} (nic_max_drops "
         "100) during the run of all nodes", "duration_s": 0.1,
         "properties": {"counters": {"pairs": {"moved": []}, "all": {"moved": [moved]}}}},
        {"suite": "reachability", "check": "test_nic_counters_during_reachability",
         "host": "gpu0003", "outcome": "pass", "message": "", "duration_s": 0.1,
         "properties": {"counters": {"connects": {"moved": ["3 TCP retransmits"]}}}}]
    page = Page(html.render_conformance(doc))
    text = " ".join(page.text)
    assert "NIC counters that moved during measurements across nodes" in text
    assert moved in text and "AllReduce, all nodes" in text
    assert "reachability connects" in text and "3 TCP retransmits" in text
    assert "AllReduce, pairs" not in text
    assert [r for r in counter_rows(results_of(doc))] == [
        Row("gpu0002", "AllReduce, all nodes", moved, "fail"),
        Row("gpu0003", "reachability connects", "3 TCP retransmits", "pass")]


def test_each_rack_s_budget_use_is_on_the_page() -> None:
    doc = json.loads((ROOT / "tests" / "fixtures" / "h200x1" / "gpufleet" /
                      "conformance-thermal-bmc-2026-12-02.json").read_text())
    page = Page(html.render_conformance(doc))
    text = " ".join(page.text)
    assert "Rack power budgets (measured peaks)" in text
    [row] = rack_rows(doc, results_of(doc))
    assert (row.host, row.name, row.css) == ("rack-h200", "air cooled", "pass")
    assert row.message == "694.1 W of 6400 W (11%): 0.8 x the 8000 W supply, 1 node"
    assert row.message in text
    doc["data"]["racks"]["budgets"]["rack-h200"].update(used_w=7000.0, nodes={
        "gpu-local": 694.1, "gpu-other": None})
    [over] = rack_rows(doc, results_of(doc))
    assert over.css == "fail" and over.message.endswith("; no measured peak for gpu-other")


def test_the_acceptance_report_shows_the_training_image_beside_the_host_stack() -> None:
    """The image stack the image suite reports (here the real one of NVIDIA's CUDA 13.0.2
    image on the H200) is in the versions table, one node's other image named apart."""
    stack = json.loads((ROOT / "tests" / "fixtures" / "h200x1" / "containers" /
                        "image_stack.json").read_text())
    doc = synthetic_conformance(4)
    image = {"python": stack["python"], "torch": stack["torch"], "dpkg_nccl": stack["dpkg_nccl"],
             "env": stack["env"], "id": "sha256:" + "a" * 64}
    doc["data"]["image"] = {f"gpu{i:04d}": {"image": "nvcr.io/nvidia/pytorch:25.01-py3",
                                            "engine": "docker", "host": {},
                                            "image_stack": image} for i in range(1, 5)}
    doc["data"]["image"]["gpu0004"]["image_stack"] = {**image, "id": "sha256:" + "b" * 64}
    words = "\n".join(Page(html.render_acceptance([doc])).text)
    assert "torch (image)" in words and "2.11.0+cu130" in words
    assert "nccl (image)" in words and "2.28.9" in words and "13.0.2" in words
    assert "sha256:aaaaaaaaaaaa" in words and "sha256:bbbbbbbbbbbb" in words
    assert "gpu[0001-0003]" in words
