"""Per-node checks run on every node at once: real pytest runs of the conformance plugin over
hosts with ansible_connection: local (their commands run with sh on this machine)."""

from __future__ import annotations

import json
import textwrap
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from gpufleet.connect.fleet import DEFAULT_FORKS

pytest_plugins = ["pytester"]

CHECKS = '''
import time

import pytest


def test_soak(node, record_property):
    start = time.monotonic()
    result = node.run("sleep 1.5; hostname >/dev/null; echo done")
    record_property("said", result.stdout.strip())
    record_property("seconds", round(time.monotonic() - start, 2))
    if node.name == "n03":
        pytest.skip("n03 has nothing to soak")
    assert node.name != "n02", f"{node.name}: soak failed"


@pytest.mark.parametrize("size", [1, 2])
def test_sized(node, size, record_property):
    record_property("size", size)
    node.run("sleep 0.5")


def test_with_tmp_path(node, tmp_path):
    (tmp_path / "x").write_text(node.name)
    node.run("sleep 0.5")


def test_fleet(conformance):
    assert len(conformance.nodes) == 6
'''


def _inventory(path: Path, count: int) -> Path:
    lines = ["all:", "  vars:", "    ansible_connection: local", "  hosts:"]
    lines += [f"    n{i:02d}:" for i in range(1, count + 1)]
    path.write_text("\n".join(lines) + "\n")
    return path


def _run(pytester: pytest.Pytester, tmp_path: Path, *args: str
         ) -> tuple[pytest.RunResult, dict[str, Any], ET.Element]:
    pytester.makepyfile(test_checks=textwrap.dedent(CHECKS))
    inventory = _inventory(tmp_path / "hosts.yml", 6)
    report, junit = tmp_path / "report.json", tmp_path / "junit.xml"
    result = pytester.runpytest_inprocess(
        "-p", "gpufleet.conformance.plugin", "-p", "no:cacheprovider", "-q",
        "--gpufleet-inventory", str(inventory), "--gpufleet-json", str(report),
        f"--junitxml={junit}", "-o", "junit_family=xunit1", *args)
    return result, json.loads(report.read_text()), ET.parse(junit).getroot()


def _by(doc: dict[str, Any], check: str) -> dict[str, dict[str, Any]]:
    return {r["host"]: r for r in doc["results"] if r["check"] == check}


def test_a_soak_on_six_nodes_costs_one_soak_and_reports_every_node(
        pytester: pytest.Pytester, tmp_path: Path) -> None:
    result, doc, junit = _run(pytester, tmp_path, "-k", "test_soak or test_fleet")
    soak = _by(doc, "test_soak")
    assert sorted(soak) == [f"n{i:02d}" for i in range(1, 7)]
    assert {h: r["outcome"] for h, r in soak.items()} == {
        "n01": "pass", "n02": "fail", "n03": "skip", "n04": "pass", "n05": "pass",
        "n06": "pass"}
    assert soak["n02"]["message"].startswith("n02: soak failed")
    assert soak["n03"]["message"] == "n03 has nothing to soak"
    assert all(r["properties"]["said"] == "done" for r in soak.values())
    durations = [r["duration_s"] for r in soak.values()]
    assert min(durations) >= 1.5
    # Six 1.5 s soaks one after another would take 9 s; together they take one soak.
    total = sum(r["properties"]["seconds"] for r in soak.values())
    assert total >= 9.0
    wall = sum(float(c.get("time", 0)) for c in junit.iter("testcase"))
    assert wall >= 9.0  # each case carries its own node's time
    assert doc["hosts"]["n02"]["status"] == "FAIL"
    assert doc["hosts"]["fleet"]["status"] == "PASS"
    cases = {c.get("name"): c for c in junit.iter("testcase")}
    assert cases["test_soak[n02]"].find("failure") is not None
    assert cases["test_soak[n03]"].find("skipped") is not None
    props = {p.get("name"): p.get("value") for p in cases["test_soak[n05]"].iter("property")}
    assert props["said"] == "done"
    result.stdout.re_match_lines([r"n02\s+FAIL\s+0 passed, 1 failed, 0 skipped",
                                  r"\s+FAIL checks/test_soak: n02: soak failed"])


def test_the_soak_wall_time_is_one_soak_not_the_sum(pytester: pytest.Pytester,
                                                     tmp_path: Path) -> None:
    start = time.monotonic()
    _, doc, _ = _run(pytester, tmp_path, "-k", "test_soak")
    wall = time.monotonic() - start
    soak = _by(doc, "test_soak")
    summed = sum(r["duration_s"] for r in soak.values())
    assert summed >= 9.0
    # In parallel the run takes about one soak; in series it would take their sum. The
    # margin leaves room for a loaded machine (a ratio in the same run, not a time).
    assert wall < summed * 0.75, f"wall {wall:.1f}s for {summed:.1f}s of soaks"


def test_each_parameter_is_its_own_group_and_function_fixtures_run_item_by_item(
        pytester: pytest.Pytester, tmp_path: Path) -> None:
    _, doc, _ = _run(pytester, tmp_path, "-k", "test_sized or test_with_tmp_path")
    sized = [r for r in doc["results"] if r["check"].startswith("test_sized")]
    assert len(sized) == 12 and {r["outcome"] for r in sized} == {"pass"}
    assert {(r["check"], r["properties"]["size"]) for r in sized} == {
        ("test_sized[1]", 1), ("test_sized[2]", 2)}
    tmp = _by(doc, "test_with_tmp_path")
    assert len(tmp) == 6 and {r["outcome"] for r in tmp.values()} == {"pass"}


def test_forks_bound_how_many_nodes_run_at_once(pytester: pytest.Pytester,
                                                tmp_path: Path) -> None:
    assert DEFAULT_FORKS > 6
    start = time.monotonic()
    _, doc, _ = _run(pytester, tmp_path, "-k", "test_soak", "--gpufleet-forks", "2")
    wall = time.monotonic() - start
    assert sorted(_by(doc, "test_soak")) == [f"n{i:02d}" for i in range(1, 7)]
    assert wall >= 3 * 1.5  # two at a time: three waves of the 1.5 s soak
