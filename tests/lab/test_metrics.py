"""The textfiles as their consumers read them: Debian's prometheus-node-exporter serves two
inventories' drift files and a conformance file from one textfile directory, on 127.0.0.1,
with no series collected twice and no scrape error; promtool accepts each file; a real
Prometheus scrapes it and answers every query of the shipped Grafana dashboard."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from importlib import resources
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from gpufleet import app
from tests.unit.test_metrics import promtool


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scrape(port: int) -> str:
    deadline = time.monotonic() + 20
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                return str(r.read().decode())
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_node_exporter_serves_two_inventories_and_conformance_side_by_side(
        provisioned: Path, tmp_path: Path) -> None:
    textfiles = tmp_path / "textfile"
    textfiles.mkdir()
    staging = tmp_path / "staging"
    shutil.copytree(provisioned, staging)
    for inventory, hosts in ((provisioned, "node01:node02"), (staging, "node03:node04")):
        code = app.drift_cmd(str(inventory), limit=hosts, outputs=app.DriftOutputs(
            prometheus_path=str(textfiles / f"drift-{inventory.name}.prom"),
            report_dir=str(tmp_path / "history")))
        assert code == 0
    assert app.conformance_cmd(str(provisioned), limit="node01:node02",
                               suites="host_sizing,allreduce",
                               prometheus_path=str(textfiles / "conformance.prom")) == 0
    for path in sorted(textfiles.iterdir()):
        promtool(path)

    port = _free_port()
    exporter = subprocess.Popen(
        ["prometheus-node-exporter", f"--web.listen-address=127.0.0.1:{port}",
         "--collector.disable-defaults", "--collector.textfile",
         f"--collector.textfile.directory={textfiles}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        text = _scrape(port)
        text = _scrape(port)  # a second scrape: node_exporter logs duplicates on each
        panels = _dashboard_queries(port, tmp_path)
    finally:
        exporter.terminate()
        log, _ = exporter.communicate(timeout=20)
    assert "collected before" not in log, log
    found = {(s.name, tuple(sorted(s.labels.items()))): s.value
             for f in text_string_to_metric_families(text) for s in f.samples}
    assert found[("node_textfile_scrape_error", ())] == 0
    reachable = {(dict(labels)["inventory"], dict(labels)["host"]) for name, labels in found
                 if name == "gpufleet_host_reachable"}
    assert reachable == {("lab", "node01"), ("lab", "node02"), ("staging", "node03"),
                         ("staging", "node04")}
    passed = {dict(labels)["host"] for name, labels in found
              if name == "gpufleet_conformance_host_status" and dict(labels)["status"] == "PASS"
              and found[(name, labels)] == 1}
    assert passed == {"node01", "node02", "fleet"}  # fleet: all nodes together
    assert all(status == "success" for status, _ in panels.values()), panels
    hosts = {p: {s["metric"].get("host") for s in series} for p, (_, series) in panels.items()}
    assert {s["metric"]["status"] for s in panels["Hosts by drift status"][1]} == {
        "clean", "drifted", "unreachable", "error"}
    assert hosts["AllReduce bus bandwidth per node (largest size) and its gate"] == {
        "node01", "node02"}
    assert panels["Since the last drift run"][1], "no drift run seen"


def _dashboard_queries(exporter_port: int, tmp_path: Path) -> dict[str, tuple[str, list[Any]]]:
    """Every query of the shipped Grafana dashboard, run by a real Prometheus that scraped
    the node_exporter: panel title -> (status, series)."""
    dashboard = json.loads(resources.files("gpufleet").joinpath(
        "dashboards/grafana.json").read_text())
    port = _free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(json.dumps({"global": {"scrape_interval": "1s"}, "scrape_configs": [
        {"job_name": "node", "static_configs": [{"targets": [f"127.0.0.1:{exporter_port}"]}]}]}))
    server = subprocess.Popen(
        ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        def query(expr: str) -> dict[str, Any]:
            url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode(
                {"query": expr})
            with urllib.request.urlopen(url, timeout=10) as reply:
                return dict(json.loads(reply.read()))

        deadline = time.monotonic() + 60
        while True:
            try:
                if query("gpufleet_build_info")["data"]["result"]:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "Prometheus scraped nothing in 60 s"
            time.sleep(0.5)
        found: dict[str, tuple[str, list[Any]]] = {}
        for panel in dashboard["panels"]:
            series: list[Any] = []
            status = "success"
            for target in panel["targets"]:
                reply = query(target["expr"].replace("$inventory", ".*"))
                status = reply["status"] if status == "success" else status
                series += reply.get("data", {}).get("result", [])
            found[panel["title"]] = (status, series)
        return found
    finally:
        server.terminate()
        server.wait(timeout=30)
