"""One JUnit convention for drift and conformance, valid under the Jenkins xunit schema
and read by junitparser with the counts gpufleet's own summary gives."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

from gpufleet.conformance.junit import to_junit
from gpufleet.conformance.results import ConformanceReport, Result
from gpufleet.drift import report as drift_report
from gpufleet.drift.compare import DriftItem, HostDrift
from gpufleet.drift.run import DriftRun
from gpufleet.report import junit
from tests.junit_schema import check_junit


def _cases(path: Path) -> list[ET.Element]:
    return list(ET.parse(path).getroot().iter("testcase"))


def test_drift_names_hosts_and_items_and_one_error_per_unreachable_host(tmp_path: Path) -> None:
    item = DriftItem("gpu02", "nccl_env", "file /etc/nccl.conf", "file", "127 bytes", "absent",
                     "-a\n+b\n", new=True)
    run = DriftRun("inventory/prod", "d" * 64, {
        "gpu01": HostDrift("gpu01", "clean", duration=1.5),
        "gpu02": HostDrift("gpu02", "drifted", [item], duration=2.0),
        "gpu03": HostDrift("gpu03", "unreachable", error="connect timed out")},
        [], [], [], 1764590000.0, 12.0, ["nccl_env"])
    path = tmp_path / "drift.xml"
    junit.write(path, drift_report.to_junit(run))
    assert check_junit(path) == {"tests": 4, "failures": 1, "errors": 1, "skipped": 0}
    suite = ET.parse(path).getroot().find("testsuite")
    assert suite is not None
    assert (suite.get("name"), suite.get("timestamp")) == ("gpufleet.drift", "2025-12-01T11:53:20")
    assert suite.get("hostname")
    props = {p.get("name"): json.loads(p.get("value", "")) for p in suite.iter("property")}
    assert props["inventory"] == "inventory/prod"
    assert props["summary"]["drifted"] == 1 and props["roles_checked"] == ["nccl_env"]
    cases = {(c.get("classname"), c.get("name")): c for c in _cases(path)}
    assert set(cases) == {("drift.gpu01", "reachable"), ("drift.gpu02", "reachable"),
                          ("drift.gpu02", "nccl_env/file /etc/nccl.conf"),
                          ("drift.gpu03", "reachable")}
    failed = cases[("drift.gpu02", "nccl_env/file /etc/nccl.conf")]
    assert failed.find("failure").get("message") == "desired 127 bytes, actual absent"  # type: ignore[union-attr]
    assert json.loads(failed.findtext("system-out") or "")["new"] is True
    assert cases[("drift.gpu03", "reachable")].find("error").get("message") == (  # type: ignore[union-attr]
        "unreachable: connect timed out")


def test_conformance_follows_the_same_convention(tmp_path: Path) -> None:
    """An unreachable node is one error, not a failure per check; a check's properties
    are in its system-out."""
    def result(host: str, check: str, outcome: str, message: str = "") -> Result:
        suite, name = check.split("/")
        return Result(suite, f"test_{name}", host, outcome, message, 0.5,
                      {"busbw_gbps": 310.0} if outcome == "pass" else {})

    down = "unreachable or facts failed: connect timed out"
    report = ConformanceReport("inventory/prod", "d" * 64, 1764590000.0, 30.0, [
        result("gpu01", "allreduce/each_node_alone", "pass"),
        result("gpu01", "gpu/health", "skip", "no NVIDIA GPU"),
        result("gpu02", "allreduce/each_node_alone", "fail", "busbw 12 GB/s < 300"),
        result("gpu03", "allreduce/each_node_alone", "fail", down),
        result("gpu03", "gpu/health", "fail", down),
        result("fleet", "allreduce/all_nodes_together", "pass"),
    ], unreachable={"gpu03": "connect timed out"})
    path = tmp_path / "conformance.xml"
    junit.write(path, to_junit(report))
    assert check_junit(path) == {"tests": 7, "failures": 1, "errors": 1, "skipped": 1}
    cases = {(c.get("classname"), c.get("name")): c for c in _cases(path)}
    assert set(cases) == {
        ("conformance.gpu01", "reachable"), ("conformance.gpu01", "allreduce/each_node_alone"),
        ("conformance.gpu01", "gpu/health"), ("conformance.gpu02", "reachable"),
        ("conformance.gpu02", "allreduce/each_node_alone"), ("conformance.gpu03", "reachable"),
        ("conformance.fleet", "allreduce/all_nodes_together")}
    passed = cases[("conformance.gpu01", "allreduce/each_node_alone")]
    assert json.loads(passed.findtext("system-out") or "") == {"busbw_gbps": 310.0}
    assert cases[("conformance.gpu03", "reachable")].find("error").get("message") == (  # type: ignore[union-attr]
        "connect timed out")
