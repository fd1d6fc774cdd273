"""Baselines on a real lab node: certify-time figures recorded in /etc/gpufleet/baseline.json
on the node, then the same node, its dataset reads throttled by a blkio cgroup, fails the
storage check with --compare-baseline although it still clears the inventory's floor. The
recorded files validate against their schema."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpufleet import app
from gpufleet.lab.cluster import Lab
from gpufleet.report.schemas import validate
from tests.lab.conftest import lab_config_for, node_sh

DATA = "/var/tmp/gf-dataset"
SEQ = "storage.seq_read_mbps"
THROTTLE_BPS = 4 * 1024**2  # 4 MiB/s of reads from the disk under the dataset
# A node without GPUs or torch (python3 only): the storage check alone, on small files. The
# fraction is low because two shared cores make run-to-run timings vary by 2x here.
VARIABLES = {"storage_dataset_path": DATA, "storage_file_gb": 0.03, "storage_readers": 2,
             "storage_small_files": 100, "storage_dataset_gb": 1, "storage_epoch_minutes": 600,
             "perf_trials": 3, "baseline_fraction": 0.25}


@pytest.fixture(scope="module")
def one_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Lab, Path]]:
    """A lab of one node with only the storage variables in its inventory."""
    if os.geteuid() != 0:
        pytest.skip("lab tests need root: they create network namespaces and mounts")
    inventory = tmp_path_factory.mktemp("baseline") / "lab"
    (inventory / "group_vars").mkdir(parents=True)
    (inventory / "group_vars" / "all.yml").write_text(yaml.safe_dump(VARIABLES))
    lab = Lab(lab_config_for("bl", 10, inventory))
    lab.down()
    lab.up(1)
    try:
        node_sh(lab, "node01", f"mkdir -p {DATA}")
        yield lab, inventory
    finally:
        lab.down()


def _device_of(path: Path) -> str:
    """MAJOR:MINOR of the block device a path is stored on."""
    dev = path.stat().st_dev
    return f"{os.major(dev)}:{os.minor(dev)}"


@pytest.fixture
def throttled(one_node: tuple[Lab, Path]) -> Iterator[None]:
    """The node's sshd (and so every command run over SSH) in a blkio cgroup that reads the
    disk under the node's overlay at THROTTLE_BPS."""
    lab, _ = one_node
    node = lab.node("node01")
    group = Path(f"/sys/fs/cgroup/blkio/gpufleet-{lab.config.name}")
    if not (group.parent / "blkio.throttle.read_bps_device").exists():
        pytest.skip("no cgroup v1 blkio controller to throttle reads with")
    group.mkdir(exist_ok=True)
    (group / "blkio.throttle.read_bps_device").write_text(
        f"{_device_of(node.dir)} {THROTTLE_BPS}\n")
    pid = node.sshd_pidfile.read_text().strip()
    (group / "cgroup.procs").write_text(pid)
    try:
        yield
    finally:
        (group.parent / "cgroup.procs").write_text(pid)
        for leftover in (group / "cgroup.procs").read_text().split():
            (group.parent / "cgroup.procs").write_text(leftover)
        group.rmdir()


def _conformance(inventory: Path, tmp_path: Path, name: str, **flags: bool
                 ) -> tuple[int, dict[str, Any], dict[str, Any]]:
    report = tmp_path / f"{name}.json"
    code = app.conformance_cmd(str(inventory), suites="storage", json_path=str(report),
                               extra_args=["-k", "throughput"], **flags)
    doc = json.loads(report.read_text())
    [row] = [r for r in doc["results"] if r["check"] == "test_storage_throughput"]
    return code, doc, row


def test_a_recorded_baseline_fails_the_throttled_node(
        one_node: tuple[Lab, Path], tmp_path: Path, request: pytest.FixtureRequest) -> None:
    lab, inventory = one_node
    code, doc, row = _conformance(inventory, tmp_path, "without", compare_baseline=True)
    assert code == 0, row
    assert doc["baselines"]["node01"]["fallback"] == (
        "no baseline recorded (/etc/gpufleet/baseline.json is absent): gated at the inventory "
        "floors")
    assert "gated at the floor" in row["properties"]["verdicts"][SEQ]["note"]

    code, doc, row = _conformance(inventory, tmp_path, "record", record_baseline=True)
    assert code == 0, row
    assert doc["baselines"]["node01"]["recorded"] == (
        "recorded 2 figures in /etc/gpufleet/baseline.json")
    recorded = json.loads(node_sh(lab, "node01", "cat /etc/gpufleet/baseline.json"))
    validate(recorded)
    assert recorded["host"] == "node01"
    baseline = recorded["figures"][SEQ]["value"]
    assert baseline == row["properties"]["verdicts"][SEQ]["median"] > 0
    assert recorded["figures"][SEQ]["trials"] == 3

    request.getfixturevalue("throttled")
    code, doc, row = _conformance(inventory, tmp_path, "compare", compare_baseline=True)
    verdict = row["properties"]["verdicts"][SEQ]
    assert code == 1, row
    assert row["outcome"] == "fail"
    assert verdict["floor"] < verdict["median"] < verdict["gate"]  # the floor alone passes it
    assert verdict["gate_source"] == "baseline" and verdict["baseline"] == baseline
    assert verdict["gate"] == pytest.approx(0.25 * baseline)
    assert len(verdict["trials"]) == 3
    assert f"{SEQ} median" in row["message"] and "of baseline" in row["message"]
    trend = doc["baselines"]["node01"]["figures"][SEQ]
    assert trend["baseline"] == baseline and trend["ratio"] < 0.25 and not trend["passed"]


def test_allreduce_and_ddp_figures_are_recorded_per_size_on_a_provisioned_node(
        lab: Lab, provisioned: Path, tmp_path: Path) -> None:
    node_sh(lab, "node01", "rm -f /etc/gpufleet/baseline.json")
    report = tmp_path / "figures.json"
    code = app.conformance_cmd(str(provisioned), limit="node01", suites="allreduce,ddp",
                               json_path=str(report), record_baseline=True,
                               extra_args=["-k", "alone or within"])
    doc = json.loads(report.read_text())
    rows = {r["check"]: r for r in doc["results"]}
    assert code == 0, doc["results"]
    alone = rows["test_each_node_alone"]["properties"]["verdicts"]
    # allreduce_sizes 64K,1M,8M on two gloo processes, each size timed perf_trials (3 here)
    assert sorted(alone) == [f"allreduce.busbw.{n}" for n in (1048576, 65536, 8388608)]
    assert all(len(v["trials"]) == 3 and v["median"] > 0 for v in alone.values())
    assert alone["allreduce.busbw.8388608"]["gate"] == 0.01  # the lab's cpu threshold
    within = rows["test_ddp_within_the_node"]["properties"]["verdicts"]
    assert sorted(within) == ["ddp.efficiency", "ddp.throughput_1"]
    assert len(within["ddp.efficiency"]["trials"]) == 3
    document = json.loads(node_sh(lab, "node01", "cat /etc/gpufleet/baseline.json"))
    validate(document)
    recorded = document["figures"]
    assert sorted(recorded) == sorted([*alone, *within])
    assert recorded["ddp.efficiency"]["value"] == within["ddp.efficiency"]["median"]
    node_sh(lab, "node01", "rm -f /etc/gpufleet/baseline.json")
