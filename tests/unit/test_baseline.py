"""Per-node baselines: the document, the store over a real (local) connection, and the gate at
max(floor, fraction x baseline) with its trend."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gpufleet.conformance.baseline import BaselineStore, judge_node, merge, parse, render
from gpufleet.conformance.plugin import trend_lines
from gpufleet.conformance.session import Node
from gpufleet.conformance.verdict import Figure, Settings, judge
from gpufleet.connect.connection import ConnectOptions
from gpufleet.errors import ParseError
from gpufleet.inventory.model import Host

SEQ = Figure("storage.seq_read_mbps", "MB/s", 100.0)
SMALL = Figure("storage.small_files_per_s", "files/s")


def local_node(name: str = "gpu01", **variables: object) -> Node:
    return Node(Host(name, {"ansible_connection": "local", **variables}, frozenset({"all"})),
                ConnectOptions())


def series(seq: list[float], small: list[float] | None = None):  # type: ignore[no-untyped-def]
    def measure(trials: int) -> dict[str, list[float]]:
        return {SEQ.name: seq[:trials], SMALL.name: (small or [900.0] * trials)[:trials]}
    return measure


def test_a_document_round_trips_and_bad_ones_are_named() -> None:
    verdicts = judge([SEQ, SMALL], series([1000.0, 990.0, 1010.0]), Settings(trials=3))
    figures = merge({"p2p.GPU0->GPU1": {"value": 380.0, "unit": "GB/s"}}, verdicts,
                    "2026-12-01T00:00:00Z")
    text = render("gpu01", figures).decode()
    parsed = parse(text, "gpu01:/etc/gpufleet/baseline.json")
    assert parsed["storage.seq_read_mbps"]["value"] == 1000.0
    assert parsed["storage.seq_read_mbps"]["trials"] == 3
    assert parsed["p2p.GPU0->GPU1"]["value"] == 380.0  # a figure not measured now is kept
    assert json.loads(text)["host"] == "gpu01"
    for bad, why in (("{", "not JSON"), ('{"schema": "other"}', "not a gpufleet.baseline/1"),
                     ('{"schema": "gpufleet.baseline/1", "figures": []}', "'figures' must be"),
                     ('{"schema": "gpufleet.baseline/1", "figures": {"x": {"value": 0}}}',
                      "figure 'x' needs a positive 'value'")):
        with pytest.raises(ParseError, match=rf"^gpu01:/b.json: {why}"):
            parse(bad, "gpu01:/b.json")


def test_record_then_compare_over_a_real_connection(tmp_path: Path) -> None:
    path = str(tmp_path / "etc" / "baseline.json")
    node = local_node()
    healthy = series([1000.0, 980.0, 1020.0, 1005.0, 995.0])

    recording = BaselineStore(record=True, path=path)
    judge_node(node, recording, [SEQ, SMALL], healthy)
    assert recording.write(node, node.conn.put) == f"recorded 2 figures in {path}"
    assert oct(os.stat(path).st_mode & 0o777) == "0o644"
    assert parse(Path(path).read_text(), path)["storage.seq_read_mbps"]["value"] == 1000.0

    comparing = BaselineStore(compare=True, path=path)
    degraded = series([510.0, 490.0, 500.0, 505.0, 495.0])
    verdicts = judge_node(node, comparing, [SEQ, SMALL], degraded)
    seq = verdicts[SEQ.name]
    assert not seq.passed  # five times the floor, half the node's own baseline
    assert seq.gate.value == pytest.approx(900.0)
    assert seq.message() == ("storage.seq_read_mbps median 500 MB/s of 5 trials (spread 4%), "
                             "gate 900 (90% of baseline 1000)")
    trend = comparing.trend(node)
    assert trend["baseline"] == path
    assert trend["figures"][SEQ.name] == {"now": 500.0, "unit": "MB/s", "baseline": 1000.0,
                                          "ratio": 0.5, "passed": False}
    assert trend_lines(trend)[0] == ("TREND storage.seq_read_mbps: 500 MB/s now vs baseline "
                                     "1000 (0.50x)")
    node.close()


def test_a_node_without_a_baseline_falls_back_to_the_floor_and_says_so(tmp_path: Path) -> None:
    path = str(tmp_path / "absent.json")
    node = local_node()
    store = BaselineStore(compare=True, path=path)
    verdict = judge_node(node, store, [SEQ], series([500.0] * 5))[SEQ.name]
    assert verdict.passed and verdict.gate.source == "floor"
    assert verdict.message().endswith(f"gate 100 (floor); no baseline recorded ({path} is "
                                      "absent), gated at the floor")
    trend = store.trend(node)
    assert trend["baseline"] is None
    assert trend["fallback"] == (f"no baseline recorded ({path} is absent): gated at the "
                                 "inventory floors")
    assert trend_lines(trend) == [f"BASELINE {trend['fallback']}"]
    node.close()


def test_an_unreadable_baseline_is_reported_not_trusted(tmp_path: Path) -> None:
    path = tmp_path / "baseline.json"
    path.write_text("{not json")
    node = local_node()
    store = BaselineStore(compare=True, path=str(path))
    verdict = judge_node(node, store, [SEQ], series([500.0] * 5))[SEQ.name]
    assert verdict.gate.source == "floor"
    assert f"baseline unusable: gpu01:{path}: not JSON" in verdict.note
    node.close()


def test_a_deeply_nested_baseline_costs_that_node_its_baseline_not_the_run(
        tmp_path: Path) -> None:
    """A hostile or broken /etc/gpufleet/baseline.json (nested 100,000 deep) is no
    RecursionError: the node is gated at its floors, says why, and can record afresh."""
    path = tmp_path / "baseline.json"
    path.write_text("[" * 100_000)
    node = local_node()
    store = BaselineStore(record=True, compare=True, path=str(path))
    verdict = judge_node(node, store, [SEQ], series([500.0] * 5))[SEQ.name]
    assert verdict.passed and verdict.gate.source == "floor"
    assert (f"baseline unusable: gpu01:{path}: nested too deep to be a document gpufleet "
            "wrote") in verdict.note
    assert store.trend(node)["fallback"].startswith("baseline unusable: ")
    assert store.write(node, node.conn.put) == f"recorded 1 figures in {path}"
    assert parse(path.read_text(), str(path))[SEQ.name]["value"] == 500.0
    node.close()


def test_the_node_settings_set_trials_and_fraction(tmp_path: Path) -> None:
    path = tmp_path / "baseline.json"
    path.write_text(render("gpu01", {SEQ.name: {"value": 1000.0, "unit": "MB/s"}}).decode())
    node = local_node(perf_trials=3, baseline_fraction=0.5)
    asked: list[int] = []

    def measure(trials: int) -> dict[str, list[float]]:
        asked.append(trials)
        return {SEQ.name: [600.0] * trials}

    verdict = judge_node(node, BaselineStore(compare=True, path=str(path)), [SEQ],
                         measure)[SEQ.name]
    assert asked == [3]
    assert verdict.passed and verdict.gate.value == 500.0
    node.close()


def test_a_re_measurement_past_the_budget_is_refused() -> None:
    node = local_node()
    node.budget.start(30.0)
    asked: list[int] = []

    def measure(trials: int) -> dict[str, list[float]]:
        asked.append(trials)
        return {SEQ.name: [95.0] * trials}

    verdict = judge_node(node, None, [SEQ], measure, cost_s=60.0)[SEQ.name]
    assert asked == [5]
    assert not verdict.passed
    assert "not re-measured: it would take about 120s" in verdict.note
