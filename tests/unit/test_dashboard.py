"""The shipped Grafana dashboard: panels with their own ids on the 24-column grid without
overlapping, every query valid PromQL (promtool), and the standing watch's panels answering
the series the watch's textfile gives (promtool's rule tests evaluate them over input series
of that shape, no Prometheus server). The lab test (tests/lab/test_metrics.py) runs every
query through a real Prometheus that scraped gpufleet's textfiles."""

from __future__ import annotations

import json
import shutil
import subprocess
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

DASHBOARD: dict[str, Any] = json.loads(
    resources.files("gpufleet").joinpath("dashboards/grafana.json").read_text())
PANELS = {p["title"]: p for p in DASHBOARD["panels"]}


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    tool = shutil.which("promtool")
    assert tool, "promtool missing: ./scripts/setup installs Debian's prometheus package"
    return subprocess.run([tool, *args], capture_output=True, text=True, timeout=60,
                          check=False)


def _expr(panel: dict[str, Any]) -> str:
    [target] = panel["targets"]
    return str(target["expr"]).replace("$inventory", ".*")


def test_panels_have_their_own_ids_and_places() -> None:
    ids = [p["id"] for p in DASHBOARD["panels"]]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for panel in DASHBOARD["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        mine = {(x, y) for x in range(grid["x"], grid["x"] + grid["w"])
                for y in range(grid["y"], grid["y"] + grid["h"])}
        assert not mine & cells, f"{panel['title']} overlaps another panel"
        cells |= mine
        assert all(t["datasource"]["uid"] == "${DS_PROMETHEUS}" for t in panel["targets"])


def test_every_query_is_valid_promql(tmp_path: Path) -> None:
    rules = [{"record": f"panel_{p['id']}_{i}", "expr": str(t["expr"]).replace(
        "$inventory", ".*")} for p in DASHBOARD["panels"] for i, t in enumerate(p["targets"])]
    path = tmp_path / "rules.yml"
    path.write_text(json.dumps({"groups": [{"name": "dashboard", "rules": rules}]}))
    done = _promtool("check", "rules", str(path))
    assert done.returncode == 0, done.stdout + done.stderr


def _series(name: str, labels: dict[str, str], values: str) -> dict[str, str]:
    body = ",".join(f'{k}="{v}"' for k, v in {"instance": "node01:9100", **labels}.items())
    return {"series": f"{name}{{{body}}}", "values": values}


WATCH_SERIES = [
    _series("gpufleet_watch_finding", {"id": "rdma/mlx5_0/1/symbol_error", "class": "fabric",
                                       "status": "open"}, "1x10"),
    _series("gpufleet_watch_finding", {"id": "pcie/0000:3b:00.0/width", "class": "pcie",
                                       "status": "pending"}, "1x10"),
    _series("gpufleet_watch_finding", {"id": "nvlink/GPU3/link7/replay", "class": "nvlink",
                                       "status": "silenced"}, "1x10"),
    _series("gpufleet_watch_rate_per_hour", {"subject": "mlx5_0/1", "counter": "symbol_error",
                                             "window": "3600"}, "0 2 4 8 14 14 14 14 14 14 14"),
    _series("gpufleet_watch_rate_per_hour", {"subject": "mlx5_1/1", "counter": "symbol_error",
                                             "window": "3600"}, "0x10"),
    _series("gpufleet_watch_flaps", {"subject": "mlx5_0/1", "window": "43200"}, "1x10"),
    _series("gpufleet_watch_last_run_timestamp_seconds", {}, "0x10"),
    _series("gpufleet_watch_last_run_timestamp_seconds", {"instance": "node02:9100"},
            "1200x10"),
]


def _labels(labels: dict[str, str]) -> str:
    """A sample's labels as promtool writes them: the metric's name before the braces."""
    rest = ",".join(f'{k}="{v}"' for k, v in labels.items() if k != "__name__")
    return labels.get("__name__", "") + "{" + rest + "}"


@pytest.mark.parametrize(("title", "expected"), [
    ("Watch findings by status", [({"status": "open"}, 1), ({"status": "pending"}, 1),
                                  ({"status": "silenced"}, 1)]),
    ("Watch findings open or silenced", [
        ({"__name__": "gpufleet_watch_finding", "instance": "node01:9100",
          "id": "rdma/mlx5_0/1/symbol_error", "class": "fabric", "status": "open"}, 1),
        ({"__name__": "gpufleet_watch_finding", "instance": "node01:9100",
          "id": "nvlink/GPU3/link7/replay", "class": "nvlink", "status": "silenced"}, 1)]),
    ("Watches not run for 15 minutes", [({}, 1)]),  # node01's at 0, node02's 1200: at 1200 s
    ("Watch counters rising (per hour, the 20 fastest)", [
        ({"__name__": "gpufleet_watch_rate_per_hour", "instance": "node01:9100",
          "subject": "mlx5_0/1", "counter": "symbol_error", "window": "3600"}, 14)]),
    ("Link flaps per port (within the window)", [
        ({"__name__": "gpufleet_watch_flaps", "instance": "node01:9100", "subject": "mlx5_0/1",
          "window": "43200"}, 1)]),
])
def test_the_watch_panels_answer_the_watchs_series(
        tmp_path: Path, title: str, expected: list[tuple[dict[str, str], float]]) -> None:
    samples = [{"labels": _labels(labels), "value": value} for labels, value in expected]
    test = {"rule_files": [], "evaluation_interval": "2m", "tests": [{
        "interval": "2m", "input_series": WATCH_SERIES,
        "promql_expr_test": [{"expr": _expr(PANELS[title]), "eval_time": "20m",
                              "exp_samples": samples}]}]}
    path = tmp_path / "test.yml"
    path.write_text(json.dumps(test))
    done = _promtool("test", "rules", str(path))
    assert done.returncode == 0, done.stdout + done.stderr
