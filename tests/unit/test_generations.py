"""GPU generations against the CUDA stack, on a real H200 capture (tests/fixtures/h200x1:
compute capability 9.0, driver CUDA 13.0, nvcc 13.0, torch 2.11.0+cu130 and its arch list)
and on the same capture with the fault: an old toolkit, an old driver, a torch without
Hopper code, a CUDA 13 torch on a CUDA 12 driver, GPUs of two models."""

from __future__ import annotations

import json

import pytest

from gpufleet.conformance.checks.gpu_generations import (
    SUPPORT,
    covers,
    mixed,
    models_of,
    node_problems,
    parse_driver_cuda,
    runs_on_driver,
    unsupported,
)
from gpufleet.errors import ParseError
from gpufleet.facts.parsers import cuda, nvidia_smi
from tests.conftest import ROOT

H200 = ROOT / "tests" / "fixtures" / "h200x1"
GPUS = nvidia_smi.nvidia_smi_query((H200 / "query_gpu_csv.txt").read_text())
TORCH = json.loads((H200 / "torch_probe.json").read_text())
DRIVER = parse_driver_cuda((H200 / "nvidia_smi_q.txt").read_text())
TOOLKIT = cuda.nvcc_version((H200 / "nvcc_version.txt").read_text())


def test_the_real_h200_stack_supports_its_gpu() -> None:
    assert [g["compute_cap"] for g in GPUS] == [9.0]
    assert (DRIVER, TOOLKIT, TORCH["cuda"]) == ("13.0", "13.0.88", "13.0")
    assert node_problems(GPUS, TOOLKIT, DRIVER, TORCH) == []


def test_an_old_toolkit_and_an_old_driver_cannot_run_hopper() -> None:
    assert node_problems(GPUS, "11.7.1", "11.4", None) == [
        "GPU0 (compute capability 9.0): the CUDA toolkit is CUDA 11.7.1; compute capability "
        "9.0 needs CUDA 11.8 or newer",
        "GPU0 (compute capability 9.0): the driver is CUDA 11.4; compute capability 9.0 "
        "needs CUDA 11.8 or newer"]


def test_a_torch_without_hopper_code_and_a_torch_too_new_for_the_driver() -> None:
    ampere_only = {**TORCH, "arch_list": ["sm_75", "sm_80", "sm_86"]}
    assert node_problems(GPUS, TOOLKIT, DRIVER, ampere_only) == [
        "GPU0 (compute capability 9.0): torch 2.11.0+cu130 has no code for it (its arch "
        "list: sm_75 sm_80 sm_86)"]
    assert node_problems(GPUS, "12.4.1", "12.4", TORCH) == [
        "torch 2.11.0+cu130 is built for CUDA 13.0, the driver supports CUDA 12.4: a newer "
        "driver is needed"]


def test_cuda_13_dropped_volta_but_its_driver_still_drives_it() -> None:
    volta = [{**GPUS[0], "name": "Tesla V100-SXM2-32GB", "compute_cap": "7.0"}]
    assert node_problems(volta, TOOLKIT, DRIVER, None) == [
        "GPU0 (compute capability 7.0): the CUDA toolkit is CUDA 13.0.88; CUDA 13.0 and later "
        "dropped compute capability 7.0"]
    assert unsupported("12.9", "7.0", "torch") is None


def test_an_unknown_generation_is_unknown_never_supported() -> None:
    newer = [{**GPUS[0], "compute_cap": "13.0"}]
    assert node_problems(newer, None, None, None) == [
        "unknown: GPU0 (compute capability 13.0) is not in gpufleet's table of CUDA releases"]


@pytest.mark.parametrize(("arch", "cc", "expected"), [
    (["sm_80"], "8.6", True),        # machine code runs on later minors of its major
    (["sm_86"], "8.0", False),
    (["sm_90"], "10.0", False),       # not across majors
    (["compute_90"], "10.0", True),   # PTX is compiled by the driver for later GPUs
    (["compute_90"], "8.9", False),
    (["sm_90a"], "9.0", True),        # architecture-specific: that GPU only
    (["sm_100a"], "10.3", False),
    (["sm_100f"], "10.3", True),      # family-specific: the family's later members
    ([], "9.0", False),
])
def test_torch_code_covers_a_gpu_by_cuda_s_compatibility_rules(
        arch: list[str], cc: str, expected: bool) -> None:
    assert covers(arch, cc) is expected


def test_a_runtime_runs_on_its_major_release_s_drivers() -> None:
    assert runs_on_driver("12.8", "12.4")     # minor version compatibility
    assert runs_on_driver("12.4", "13.0")
    assert not runs_on_driver("13.0", "12.9")


def test_every_capability_in_the_table_has_a_release_that_supports_it() -> None:
    for cc, (first, gone) in SUPPORT.items():
        assert unsupported(first, cc, "x") is None, cc
        assert gone is None or unsupported(gone, cc, "x") is not None, cc


def test_two_models_on_one_node_are_named_most_first() -> None:
    gpus = [{"index": i, "name": "NVIDIA H200"} for i in range(3)] + [
        {"index": 3, "name": "NVIDIA H100 80GB HBM3"}]
    assert mixed(models_of(gpus)) == ("NVIDIA H200 on GPU0, GPU1, GPU2; NVIDIA H100 80GB HBM3 "
                                      "on GPU3")


def test_nvidia_smi_without_a_cuda_line_is_unreadable() -> None:
    with pytest.raises(ParseError):
        parse_driver_cuda("==============NVSMI LOG==============\nDriver Version : 550.54.15\n")


def test_the_check_s_real_run_on_the_h200_recorded_what_its_captures_say() -> None:
    doc = json.loads((H200 / "gpufleet" / "conformance-gpu-stack-2026-12-02.json").read_text())
    [check] = [r for r in doc["results"] if r["check"] == "test_cuda_supports_every_gpu"]
    assert check["outcome"] == "pass"
    assert check["properties"] == {"compute_capabilities": {"9.0": ["GPU0"]},
                                   "toolkit_cuda": TOOLKIT, "driver_cuda": DRIVER,
                                   "torch_arch_list": TORCH["arch_list"]}
