"""The GPUs' standing state on lab nodes: each fault injected on one node is seen on that node
alone, by the gpu_state suite (naming GPU, value, expected value and variable) and by drift;
provisioning the gpu_settings role puts right the settings it manages.

Six unprovisioned nodes with the stand-in nvidia-smi of tests/lab/fakegpu.py (a real 2x H200
node's output; its settings commands change what its query reports): node01 as it comes, and
one fault on each of the others, made with the commands an operator would run where the
stand-in has them (``nvidia-smi -pl 300``, ``-lgc 405,405``, ``-c EXCLUSIVE_PROCESS``) and
with ``set_fields`` for MIG and ECC (their change waits for a GPU reset on a real GPU).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpufleet import app
from gpufleet.drift.run import DriftOptions, check_fleet
from gpufleet.inventory.load import load_inventory
from gpufleet.inventory.target import Target
from gpufleet.lab.cluster import Lab
from gpufleet.provision.engine import RunOptions, provision
from gpufleet.roles import gpu_settings
from tests.lab import fakegpu
from tests.lab.conftest import lab_up, node_sh

NODES = [f"node{i:02d}" for i in range(1, 7)]
MANAGED = ["power_limit", "locked_clocks", "compute_mode"]
FAULTS: dict[str, tuple[Callable[[Lab, str], object], str, str]] = {
    # node: (inject, drift item, the suite's message for GPU0)
    "node02": (lambda lab, n: fakegpu.set_fields(lab, n, mig__mode__current="Enabled",
                                                  mig__mode__pending="Enabled"),
               "gpu_settings/gpu mig",
               "GPU0: MIG mode Enabled, expected Disabled (gpu_state_mig)"),
    "node03": (lambda lab, n: fakegpu.set_fields(lab, n, ecc__mode__current="Disabled",
                                                  ecc__mode__pending="Disabled"),
               "gpu_settings/gpu ecc",
               "GPU0: ECC mode Disabled, expected Enabled (gpu_state_ecc)"),
    "node04": (lambda lab, n: node_sh(lab, n, "nvidia-smi -pl 300"),
               "gpu_settings/gpu power_limit",
               "GPU0: power limit 300 W, expected 700 W (the GPU's default) "
               "(gpu_state_power_limit_w)"),
    "node05": (lambda lab, n: node_sh(lab, n, "nvidia-smi -lgc 405,405"),
               "gpu_settings/gpu locked_clocks",
               "GPU0: clocks locked by nvidia-smi -lgc/-lmc (SM at 405 MHz), expected not "
               "locked (gpu_state_locked_clocks)"),
    "node06": (lambda lab, n: node_sh(lab, n, "nvidia-smi -c EXCLUSIVE_PROCESS"),
               "gpu_settings/gpu compute_mode",
               "GPU0: compute mode Exclusive_Process, expected Default "
               "(gpu_state_compute_mode)"),
}


@pytest.fixture(scope="module")
def gs_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """Six nodes with the stand-in; the role manages the settings a driver forgets."""
    with lab_up(tmp_path_factory, "gs", 17, len(NODES)) as lab:
        (lab.config.inventory_dir / "group_vars" / "lab.yml").write_text(
            yaml.safe_dump({"gpu_state_manage": MANAGED}))
        for node in NODES:
            fakegpu.install(lab, node)
        yield lab


def suite(lab: Lab, path: Path) -> dict[tuple[str, str], dict[str, Any]]:
    """The gpu_state suite on every node: results by (host, check)."""
    app.conformance_cmd(str(lab.config.inventory_dir), limit=":".join(NODES),
                        suites="gpu_state", json_path=str(path))
    return {(r["host"], r["check"]): r for r in json.loads(path.read_text())["results"]}


def drifted(lab: Lab) -> dict[str, list[str]]:
    target = Target.select(load_inventory(lab.config.inventory_dir), "lab")
    hosts = check_fleet(target, DriftOptions(roles=[gpu_settings.ROLE])).hosts
    return {name: [i.item for i in h.items] or [str(h.error)] for name, h in hosts.items()
            if h.status != "clean"}


def test_each_fault_fails_its_node_alone_drifts_it_and_the_managed_ones_are_restored(
        gs_lab: Lab, tmp_path: Path) -> None:
    for node, (inject, _, _) in FAULTS.items():
        inject(gs_lab, node)
    results = suite(gs_lab, tmp_path / "faults.json")
    assert results[("node01", "test_gpu_state")]["outcome"] == "pass"
    for node, (_, _, message) in FAULTS.items():
        result = results[(node, "test_gpu_state")]
        assert result["outcome"] == "fail", result
        assert result["message"] == f"{message}; {message.replace('GPU0', 'GPU1')}", result
        assert result["properties"]["finding_class"] == "configuration"
    assert drifted(gs_lab) == {node: [item] for node, (_, item, _) in FAULTS.items()}

    inventory = load_inventory(gs_lab.config.inventory_dir)
    outcomes = provision(inventory, inventory.select(":".join(NODES)), [gpu_settings.ROLE],
                         RunOptions())
    assert {n: o.status for n, o in outcomes.items()} == {
        "node01": "ok", "node02": "ok", "node03": "ok", "node04": "changed",
        "node05": "changed", "node06": "changed"}, outcomes
    assert drifted(gs_lab) == {"node02": ["gpu_settings/gpu mig"],
                               "node03": ["gpu_settings/gpu ecc"]}
    results = suite(gs_lab, tmp_path / "restored.json")
    assert {n for (n, _), r in results.items() if r["outcome"] == "fail"} == \
        {"node02", "node03"}
