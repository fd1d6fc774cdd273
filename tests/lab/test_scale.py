"""Conformance across the lab at once: a soak on 16 nodes costs one soak, reachability
strategies over 16 nodes, and the random range sample seeing a closed stretch of the range
that the ruleset file does not show."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

from gpufleet import app
from gpufleet.conformance.measure.reachability import PortSpec, run_matrix, source_band
from gpufleet.conformance.options import ConformanceOptions as SessionOptions
from gpufleet.conformance.session import ConformanceSession
from gpufleet.connect.connection import ConnectOptions
from gpufleet.connect.fleet import FleetOptions
from gpufleet.inventory.load import load_inventory
from gpufleet.lab.cluster import Lab
from tests.conftest import FIXTURES
from tests.lab.conftest import LAB_NODES, node_sh

SOAK = FIXTURES / "checks" / "soak_check.py"


def _pytest_conformance(inventory: Path, tmp_path: Path, *args: str) -> dict[str, Any]:
    import pytest as runner

    report = tmp_path / "soak.json"
    code = runner.main([str(SOAK), "-p", "gpufleet.conformance.plugin", "-p",
                        "no:cacheprovider", "-q", "--gpufleet-inventory", str(inventory),
                        "--gpufleet-json", str(report), *args])
    assert code == 0
    doc: dict[str, Any] = json.loads(report.read_text())
    return doc


def test_a_soak_on_16_nodes_costs_one_soak_not_the_sum(lab: Lab, inventory_path: Path,
                                                       tmp_path: Path) -> None:
    start = time.monotonic()
    doc = _pytest_conformance(inventory_path, tmp_path)
    wall = time.monotonic() - start
    soaks = [r for r in doc["results"] if r["check"] == "test_soak"]
    assert len(soaks) == LAB_NODES >= 16
    assert {r["outcome"] for r in soaks} == {"pass"}
    summed = sum(r["duration_s"] for r in soaks)
    assert all(r["properties"]["held_s"] >= 8 for r in soaks)
    assert summed >= 16 * 8
    # one soak (8 s) plus the facts round trip and pytest's start, never the 128 s sum
    assert wall < 8 + 30, f"{wall:.1f}s of wall time for {summed:.0f}s of soaks"
    print(f"soak on {len(soaks)} nodes: wall {wall:.1f}s, sum of nodes' times {summed:.1f}s")


@pytest.fixture
def session16(lab: Lab, inventory_path: Path) -> ConformanceSession:
    inventory = load_inventory(inventory_path)
    return ConformanceSession.start(
        inventory, inventory.select("all"),
        SessionOptions(fleet=FleetOptions(connect=ConnectOptions(known_hosts_base=inventory_path))))


@pytest.mark.parametrize("mode", ["auto", "ring", "sample:3"])
def test_every_strategy_covers_every_node_with_the_whole_sample(
        session16: ConformanceSession, mode: str) -> None:
    spec = PortSpec([29500, 49152, 65535], 49152, 65535, 128, 11,
                    source_band(49152, 65535, 29500))
    try:
        matrix = run_matrix(session16, spec, mode, seed=11)
    finally:
        session16.close()
    names = set(session16.nodes)
    assert {s for s, _, _ in matrix.results} == {t for _, t, _ in matrix.results} == names
    assert set(matrix.results.values()) == {"open"}
    for target in names:
        probed = {p for (_, t, p) in matrix.results if t == target}
        assert probed == {29500, 49152, 65535, *matrix.sampled[target]}
        assert len(matrix.sampled[target]) >= 120  # 128 strata, less a busy port or two
    expected_mode = {"auto": "all", "ring": "ring", "sample:3": "sample:3"}[mode]
    assert matrix.mode == expected_mode
    if mode == "auto":
        assert len({(s, t) for s, t, _ in matrix.results}) == 16 * 15


def test_the_random_sample_sees_a_stretch_of_the_range_closed_by_a_foreign_table(
        lab: Lab, provisioned: Path, tmp_path: Path) -> None:
    node_sh(lab, "node02", "nft add table inet hole && nft add chain inet hole input "
            "'{ type filter hook input priority -10; policy accept; }' && "
            "nft add rule inet hole input tcp dport 55000-55299 drop")
    try:
        code = app.conformance_cmd(str(provisioned), limit="node01:node02:node03",
                                   suites="reachability", json_path=str(tmp_path / "r.json"))
    finally:
        node_sh(lab, "node02", "nft delete table inet hole")
    doc = json.loads((tmp_path / "r.json").read_text())
    rows = {(r["check"], r["host"]): r for r in doc["results"]}
    assert code == 1
    failed = rows[("test_reachable_from_the_cluster", "node02")]
    assert failed["outcome"] == "fail"
    ports = [int(p) for p in re.findall(r"port (\d+) not reachable", failed["message"])]
    assert ports and all(55000 <= p <= 55299 for p in ports), failed["message"]
    # the ruleset file is gpufleet's own and still opens the whole range: only the live
    # sample sees the hole
    assert rows[("test_firewall_opens_every_ephemeral_port", "node02")]["outcome"] == "pass"
    assert rows[("test_reachable_from_the_cluster", "node01")]["outcome"] == "pass"
