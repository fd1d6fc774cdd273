"""GPU generations against the CUDA stack on lab nodes with the stand-in nvidia-smi (a real
2x H200's output: compute capability 9.0, driver CUDA 13.0): node11 passes; node12's
toolkit says CUDA 11.7.1, too old for Hopper; node13's driver says CUDA 11.4; node14's
second GPU is another model, which fails the node and its group; a provisioned node whose
inventory pins a CUDA torch but has the lab's CPU build fails on torch."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufleet import app
from gpufleet.lab.cluster import Lab
from tests.lab.conftest import node_sh
from tests.lab.fakegpu import install, remove
from tests.lab.test_provision import override

NODES = ("node11", "node12", "node13", "node14")
CHECKS = ("cuda_supports_every_gpu", "one_gpu_model", "one_gpu_model_per_group")
VERSION_JSON = '{"cuda": {"name": "CUDA SDK", "version": "%s"}}'


def _run(inventory: Path, tmp_path: Path, limit: str) -> tuple[int, dict[tuple[str, str],
                                                                        tuple[str, str]]]:
    report = tmp_path / f"{limit.replace(':', '-')}.json"
    code = app.conformance_cmd(str(inventory), limit=limit, suites="gpu",
                               json_path=str(report))
    results = json.loads(report.read_text())["results"]
    return code, {(r["host"], r["check"].removeprefix("test_")): (r["outcome"],
                                                                  r.get("message") or "")
                  for r in results if r["check"].removeprefix("test_") in CHECKS}


@pytest.fixture
def generations(lab: Lab) -> Iterator[None]:
    install(lab, "node11")
    install(lab, "node12")
    install(lab, "node13", driver_cuda="11.4")
    install(lab, "node14", last_gpu_model="NVIDIA H100 80GB HBM3")
    for node, release in (("node11", "12.4.1"), ("node12", "11.7.1")):
        node_sh(lab, node, f"mkdir -p /usr/local/cuda && printf '%s' '{VERSION_JSON % release}'"
                           " > /usr/local/cuda/version.json")
    try:
        yield
    finally:
        for node in NODES:
            remove(lab, node)
            node_sh(lab, node, "rm -rf /usr/local/cuda", check=False)


def test_each_generation_fault_fails_its_node(lab: Lab, inventory_path: Path,
                                              generations: None, tmp_path: Path) -> None:
    code, found = _run(inventory_path, tmp_path, ":".join(NODES))
    assert code == 1
    assert found[("node11", "cuda_supports_every_gpu")] == ("pass", "")
    assert found[("node12", "cuda_supports_every_gpu")] == ("fail", (
        "GPU0, GPU1 (compute capability 9.0): the CUDA toolkit is CUDA 11.7.1; compute "
        "capability 9.0 needs CUDA 11.8 or newer"))
    assert found[("node13", "cuda_supports_every_gpu")] == ("fail", (
        "GPU0, GPU1 (compute capability 9.0): the driver is CUDA 11.4; compute capability "
        "9.0 needs CUDA 11.8 or newer"))
    assert found[("node14", "cuda_supports_every_gpu")][0] == "pass"
    assert {n for n in NODES if found[(n, "one_gpu_model")][0] == "fail"} == {"node14"}
    assert found[("node14", "one_gpu_model")][1] == (
        "GPUs of 2 models on one node: NVIDIA H100 80GB HBM3 on GPU1; NVIDIA H200 on GPU0 "
        "(declare gpu_mixed_models: true where this is meant)")
    outcome, message = found[("fleet", "one_gpu_model_per_group")]
    assert outcome == "fail"
    assert message.startswith("group lab: NVIDIA H200 on node11, node12, node13, node14; "
                              "NVIDIA H100 80GB HBM3 on node14"), message
    with override(inventory_path, "group_vars", "lab", {"gpu_mixed_models": True}):
        _, mixed = _run(inventory_path, tmp_path, ":".join(NODES))
    assert mixed[("node14", "one_gpu_model")][0] == "pass"
    assert mixed[("fleet", "one_gpu_model_per_group")][0] == "skip"


def test_a_cpu_torch_where_a_cuda_build_is_pinned_fails(lab: Lab, provisioned: Path,
                                                        tmp_path: Path) -> None:
    install(lab, "node02")
    try:
        _, clean = _run(provisioned, tmp_path, "node02")
        with override(provisioned, "host_vars", "node02", {"pytorch_cuda": "12.4"}):
            code, pinned = _run(provisioned, tmp_path, "node02")
    finally:
        remove(lab, "node02")
    assert clean[("node02", "cuda_supports_every_gpu")] == ("pass", "")
    assert code == 1
    assert pinned[("node02", "cuda_supports_every_gpu")] == ("fail", (
        "torch 2.13.0+cpu is a CPU build: it cannot use the node's GPUs"))
