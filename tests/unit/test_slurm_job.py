"""The slurm_job suite: the job view probe's document read from real runs through Slurm
22.05.8's srun (and from hostile output), every verdict passing and failing, the step's
command line and its bounds, Slurm's configuration judged on real captures, and the
suite's declaration (in no set)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpufleet.conformance import registry
from gpufleet.conformance.checks import slurm_job as checks
from gpufleet.conformance.checks.slurm_job import Device, Limit, StepView, parse_view
from gpufleet.conformance.measure import slurm_job as measure
from gpufleet.conformance.session import Node
from gpufleet.conformance.suites.slurm_job import SlurmJobSettings
from gpufleet.connect.connection import ConnectOptions
from gpufleet.errors import GpufleetError, ParseError
from gpufleet.inventory.model import Host
from gpufleet.slurm.client import Slurm, SlurmNode, parse_show_node
from gpufleet.slurm.config import parse_show_config
from gpufleet.slurm.launcher import STEP_PATH, Allocation
from tests.conftest import FIXTURES, stand_in

SLURM = FIXTURES / "slurm"
KIB = 1024


def _text(name: str) -> str:
    return (SLURM / name).read_text()


def _doc(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(_text(name))
    return doc


def _view(doc: dict[str, Any]) -> StepView:
    return parse_view(json.dumps(doc))


def _slurm_node(name: str, node: str) -> SlurmNode:
    return next(n for n in parse_show_node(_text(name)) if n.name == node)


# ---- the probe's document ------------------------------------------------------------------

def test_a_step_that_gets_the_submitters_limits() -> None:
    view = parse_view(_text("job_view_memlock_propagated.json"))
    assert view.memlock == Limit(64 * KIB, 8 * 2**20)
    assert view.nofile == Limit(1024, 20000)
    assert view.shm_bytes == 25276194816
    assert view.gpu_env is not None and view.gpu_env["CUDA_VISIBLE_DEVICES"] == "0"
    assert view.gpu_env["SLURM_STEP_GPUS"] == "0" and "SLURM_JOB_GPUS" not in view.gpu_env
    assert view.devices == [] and view.nccl_env == {}
    assert view.nccl_conf == [("/root/.nccl.conf", None), ("/etc/nccl.conf", None)]
    assert view.unreadable == {}


def test_a_step_with_slurmds_memlock_and_a_task_prologs_environment() -> None:
    view = parse_view(_text("job_view_memlock_except.json"))
    assert view.memlock == Limit(8 * 2**20, 8 * 2**20)
    assert view.nccl_env == {"NCCL_CONF_FILE": "/tmp/slurmcap/nccl.conf",
                             "NCCL_SOCKET_IFNAME": "eth0"}
    assert view.nccl_conf is not None and view.nccl_conf[0][0] == "/tmp/slurmcap/nccl.conf"
    assert "NCCL_IB_HCA=mlx5_0,mlx5_1" in (view.nccl_conf[0][1] or "")


def test_the_probe_runs_on_this_machine_and_its_document_is_read() -> None:
    done = subprocess.run([sys.executable, "-c", measure.probe_text()], capture_output=True,
                          text=True, timeout=30, check=False,
                          env={"PATH": "/usr/bin:/bin", "NCCL_DEBUG": "WARN",
                               "GLOO_SOCKET_IFNAME": "lo", "CUDA_VISIBLE_DEVICES": "1,2",
                               "SLURM_STEP_GPUS": "1,2"})
    assert done.returncode == 0, done.stderr
    view = parse_view(done.stdout)
    assert view.unreadable == {}
    assert view.nccl_env == {"NCCL_DEBUG": "WARN", "GLOO_SOCKET_IFNAME": "lo"}
    assert view.gpu_env == {"CUDA_VISIBLE_DEVICES": "1,2", "SLURM_STEP_GPUS": "1,2"}
    assert view.memlock is not None and view.nofile is not None and view.shm_bytes


def test_lines_a_task_prolog_prints_before_the_document_are_passed_over() -> None:
    text = "hello from the task prolog\n" + _text("job_view_memlock_except.json")
    assert parse_view(text).memlock == Limit(8 * 2**20, 8 * 2**20)


@pytest.mark.parametrize(("text", "message"), [
    ("", "printed nothing"),
    ("\n  \n", "printed nothing"),
    ("Traceback (most recent call last):\n  SyntaxError\n", "printed no JSON document"),
    ('{"probe": "job_view", "limits": ', "is not JSON"),
    ('{"probe": "other", "version": 1}\n', "not the job view probe's document"),
    ('["probe", "job_view"]\n', "printed no JSON document"),
    ("{" + "x" * (checks.PROBE_MAX_BYTES + 10), "more than"),
    ("{\udcff}\n", "is not JSON")])
def test_output_that_holds_no_document_is_a_parse_error(text: str, message: str) -> None:
    with pytest.raises(ParseError, match=message):
        parse_view(text)


def test_missing_or_malformed_fields_are_unknown_each_with_its_reason() -> None:
    view = _view({"probe": "job_view", "version": 1})
    for name in ("memlock", "nofile", "shm", "gpu_env", "devices", "nccl_env", "nccl_conf"):
        assert name in view.unreadable, name
    assert view.memlock is None and view.why("memlock") == \
        "the probe's memlock limit is missing: expected [soft, hard]"
    assert view.why("shm") == "the probe's /dev/shm is missing"
    doc = _doc("job_view_memlock_propagated.json")
    doc["limits"]["memlock"] = [-1, "lots"]
    doc["limits"]["nofile"] = [True, 2]
    doc["shm"] = {"error": "No such file or directory"}
    doc["gpu_env"] = {"CUDA_VISIBLE_DEVICES": 0}
    doc["devices"] = [{"path": "/dev/nvidia0"}]
    doc["nccl_conf"] = "oops"
    view = _view(doc)
    assert view.memlock is None and view.nofile is None and view.gpu_env is None
    assert view.why("memlock") == "the probe's memlock limit is [-1, \"lots\"]: expected " \
                                  "[soft, hard]"
    assert view.why("shm") == "/dev/shm could not be read in the step: No such file or " \
                              "directory"
    assert view.why("devices").startswith("the probe's devices are [{")
    assert view.nccl_env == {} and view.unreadable.keys() == {
        "memlock", "nofile", "shm", "gpu_env", "devices", "nccl_conf"}


# ---- an SSH session's limits ----------------------------------------------------------------

def test_session_limits_are_read_in_bytes_and_files() -> None:
    assert checks.parse_session_limits("memlock 64 unlimited\nnofile 1024 524288\n") == {
        "memlock": Limit(64 * KIB, None), "nofile": Limit(1024, 524288)}


@pytest.mark.parametrize("text", ["", "memlock 64 64\n", "memlock x 64\nnofile 1 1\n"])
def test_unreadable_session_limits_are_a_parse_error(text: str) -> None:
    with pytest.raises(ParseError, match="ulimit"):
        checks.parse_session_limits(text)


def test_the_session_limits_snippet_runs_in_sh() -> None:
    done = subprocess.run(["sh", "-c", checks.SESSION_LIMITS.shell], capture_output=True,
                          text=True, timeout=10, check=True)
    assert set(checks.parse_session_limits(done.stdout)) == {"memlock", "nofile"}


# ---- limits and /dev/shm ------------------------------------------------------------------

def test_memlock_propagated_from_the_submitter_fails_naming_both_views() -> None:
    view = parse_view(_text("job_view_memlock_propagated.json"))
    assert view.memlock is not None
    assert checks.memlock_problem(view.memlock, None, Limit(None, None)) == (
        "a job step gets memlock 64 KiB (an SSH session gets unlimited): NCCL over "
        "InfiniBand/RoCE fails at init; set LimitMEMLOCK=infinity for slurmd and "
        "PropagateResourceLimitsExcept=MEMLOCK")


def test_memlock_unlimited_passes_and_a_declared_floor_is_honoured() -> None:
    assert checks.memlock_problem(Limit(None, None), None, None) is None
    assert checks.memlock_problem(Limit(None, None), 1, Limit(64 * KIB, 64 * KIB)) is None
    slurmds = parse_view(_text("job_view_memlock_except.json")).memlock
    assert slurmds is not None
    assert checks.memlock_problem(slurmds, 8192, None) is None
    assert checks.memlock_problem(slurmds, 8193, None) == (
        "a job step gets memlock 8 MiB, below slurm_job_memlock 8193 KiB: NCCL over "
        "InfiniBand/RoCE fails at init; set LimitMEMLOCK=infinity for slurmd and "
        "PropagateResourceLimitsExcept=MEMLOCK")


def test_nofile_below_the_floor_fails_and_at_it_passes() -> None:
    nofile = parse_view(_text("job_view_memlock_except.json")).nofile
    assert nofile == Limit(1024, 20000)
    message = checks.nofile_problem(nofile, 131072, Limit(1048576, 1048576))
    assert message is not None and message.startswith(
        "a job step gets nofile 1024 (hard 20000) (an SSH session gets 1048576), below "
        "slurm_job_nofile 131072: DataLoader workers and NCCL's connections fail with "
        "'Too many open files'")
    assert checks.nofile_problem(Limit(131072, 131072), 131072, None) is None
    assert checks.nofile_problem(Limit(None, None), 131072, None) is None


def test_shm_below_its_floor_fails_with_the_nodes_size() -> None:
    assert checks.shm_problem(25276194816, 1, "host_min_shm_gb", None) is None
    assert checks.shm_problem(64 * 2**20, 1, "host_min_shm_gb", 25276194816) == (
        "a job step's /dev/shm is 0.07 GB (the node's is 25.28 GB), below host_min_shm_gb 1: "
        "NCCL's shared-memory transport and DataLoader workers run out of it")
    assert checks.shm_problem(2 * 10**9, 4, "slurm_job_min_shm_gb", None) is not None


def test_sizes_for_people() -> None:
    assert [checks.size(v) for v in (None, 512, 64 * KIB, 8 * 2**20, 3 * 2**29)] == [
        "unlimited", "512 bytes", "64 KiB", "8 MiB", "1.5 GiB"]


# ---- the step's GPUs ---------------------------------------------------------------------

def _gpu_view(cvd: str | None, step: str | None, opened: list[int], listed: int,
              job: str | None = None) -> StepView:
    env = {k: v for k, v in (("CUDA_VISIBLE_DEVICES", cvd), ("SLURM_STEP_GPUS", step),
                             ("SLURM_JOB_GPUS", job)) if v is not None}
    return StepView(gpu_env=env, devices=[
        Device(f"/dev/nvidia{i}", "ok" if i in opened else "EPERM") for i in range(listed)])


def test_a_confined_step_with_its_own_gpus_passes() -> None:
    view = _gpu_view("0,1", "4,5", opened=[4, 5], listed=8)
    assert checks.gpu_problems(view, 2, confine=True, own_job=True) == []


def test_an_unconfined_step_passes_only_where_confinement_is_not_required() -> None:
    view = _gpu_view("3", "3", opened=list(range(8)), listed=8)
    assert checks.gpu_problems(view, 1, confine=False, own_job=True) == []
    assert checks.gpu_problems(view, 1, confine=True, own_job=True) == [
        "a step that asked for 1 GPU (--gres=gpu:1) can open 8 of the node's 8 GPU device "
        "files (/dev/nvidia0, /dev/nvidia1, /dev/nvidia2, /dev/nvidia3, /dev/nvidia4, "
        "/dev/nvidia5, /dev/nvidia6, /dev/nvidia7): device confinement is off "
        "(ConstrainDevices=yes in cgroup.conf, with TaskPlugin task/cgroup), so its "
        "processes can use GPUs Slurm gave other jobs"]


def test_a_real_step_without_gpu_device_files_fails() -> None:
    view = parse_view(_text("job_view_allocation_step.json"))
    assert checks.gpu_problems(view, 1, confine=True, own_job=False) == [
        "a step that asked for 1 GPU (--gres=gpu:1) has no GPU device file "
        "(/dev/nvidia[0-9]*)"]


def test_gpus_slurm_did_not_give_or_cuda_does_not_see() -> None:
    none = _gpu_view(None, None, opened=[0], listed=1)
    assert checks.gpu_problems(none, 1, confine=True, own_job=True) == [
        "a step that asked for 1 GPU (--gres=gpu:1) was given none by Slurm (no "
        "SLURM_STEP_GPUS)",
        "a step that asked for 1 GPU (--gres=gpu:1) has no CUDA_VISIBLE_DEVICES: CUDA in it "
        "uses every GPU it can open"]
    two = _gpu_view("0,1", "0,1", opened=[0, 1], listed=2)
    assert checks.gpu_problems(two, 1, confine=False, own_job=True) == [
        "a step that asked for 1 GPU (--gres=gpu:1) was given 2 (SLURM_STEP_GPUS=0,1)",
        "a step that asked for 1 GPU (--gres=gpu:1) sees CUDA_VISIBLE_DEVICES=0,1 (2 GPUs)"]
    no_files = _gpu_view("NoDevFiles", "0", opened=[0], listed=1)
    assert checks.gpu_problems(no_files, 1, confine=True, own_job=True) == [
        "a step that asked for 1 GPU (--gres=gpu:1) has CUDA_VISIBLE_DEVICES=NoDevFiles: "
        "gres.conf names no device File for the node's GPUs"]


def test_gpus_out_of_reach_name_the_refusals() -> None:
    view = _gpu_view("0,1", "2,3", opened=[2], listed=4)
    assert checks.gpu_problems(view, 2, confine=True, own_job=True) == [
        "a step that asked for 2 GPUs (--gres=gpu:2) can open 1 of the node's 4 GPU device "
        "files (/dev/nvidia2): the GPUs Slurm gave it are out of its reach (/dev/nvidia0: "
        "EPERM, /dev/nvidia1: EPERM, /dev/nvidia3: EPERM)"]


def test_cuda_visible_devices_must_name_what_the_step_can_use() -> None:
    confined = _gpu_view("3", "3", opened=[3], listed=8)
    assert checks.gpu_problems(confined, 1, confine=True, own_job=True) == [
        "CUDA_VISIBLE_DEVICES=3 in a step confined to its own GPUs, which CUDA numbers from "
        "0: CUDA finds no device there (0 expected)"]
    unconfined = _gpu_view("0", "3", opened=list(range(8)), listed=8)
    assert checks.gpu_problems(unconfined, 1, confine=False, own_job=True) == [
        "CUDA_VISIBLE_DEVICES=0 but Slurm gave the step GPU 3 (SLURM_STEP_GPUS): its "
        "processes use GPUs of other jobs"]
    uuids = _gpu_view("GPU-67fbe9c8", "3", opened=list(range(8)), listed=8)
    assert checks.gpu_problems(uuids, 1, confine=False, own_job=True) == []


def test_a_job_of_its_own_may_say_its_gpus_as_the_jobs() -> None:
    view = _gpu_view("0", None, opened=[0], listed=2, job="1")
    assert checks.given_gpus(view, own_job=True) == ["1"]
    assert checks.gpu_problems(view, 1, confine=True, own_job=True) == []
    assert checks.given_gpus(view, own_job=False) is None


# ---- NCCL's environment -------------------------------------------------------------------

def test_the_roles_environment_with_gloo() -> None:
    assert checks.expected_env({"NCCL_SOCKET_IFNAME": "eth0", "NCCL_IB_DISABLE": True,
                                "NCCL_IB_GID_INDEX": 3}, None) == {
        "GLOO_SOCKET_IFNAME": "eth0", "NCCL_IB_DISABLE": "true", "NCCL_IB_GID_INDEX": "3",
        "NCCL_SOCKET_IFNAME": "eth0"}
    assert checks.expected_env({"NCCL_SOCKET_IFNAME": "eth0"}, "ib0")["GLOO_SOCKET_IFNAME"] \
        == "ib0"
    assert checks.expected_env({"NCCL_DEBUG": "WARN"}, None) == {"NCCL_DEBUG": "WARN"}


def test_nccls_own_files_first_one_wins() -> None:
    conf = checks.conf_settings([("/home/u/.nccl.conf", "NCCL_IB_HCA=mlx5_2\n"),
                                 ("/etc/nccl.conf", "NCCL_IB_HCA=mlx5_0\nNCCL_DEBUG=INFO\n"),
                                 ("/missing", None)])
    assert conf == {"NCCL_IB_HCA": ("mlx5_2", "/home/u/.nccl.conf"),
                    "NCCL_DEBUG": ("INFO", "/etc/nccl.conf")}


def test_a_real_task_prologs_environment_misses_only_gloo() -> None:
    view = parse_view(_text("job_view_memlock_except.json"))
    assert view.nccl_env is not None and view.nccl_conf is not None
    expected = checks.expected_env({"NCCL_SOCKET_IFNAME": "eth0",
                                    "NCCL_IB_HCA": "mlx5_0,mlx5_1"}, None)
    assert checks.nccl_env_problems(expected, view.nccl_env,
                                    checks.conf_settings(view.nccl_conf),
                                    "/etc/default/gpufleet-nccl") == [
        "a job step does not get GLOO_SOCKET_IFNAME=eth0 (Gloo reads no nccl.conf; login "
        "shells get it from /etc/default/gpufleet-nccl): export it for every step, e.g. a "
        "TaskProlog printing 'export GLOO_SOCKET_IFNAME=eth0'"]
    expected.pop("GLOO_SOCKET_IFNAME")
    assert checks.nccl_env_problems(expected, view.nccl_env,
                                    checks.conf_settings(view.nccl_conf), "f") == []


def test_settings_a_step_gets_otherwise_or_not_at_all() -> None:
    expected = {"NCCL_IB_HCA": "mlx5_0,mlx5_1", "NCCL_SOCKET_IFNAME": "ib0",
                "NCCL_IB_GID_INDEX": "3"}
    problems = checks.nccl_env_problems(
        expected, {"NCCL_SOCKET_IFNAME": "eth0"},
        {"NCCL_IB_HCA": ("mlx5_0", "/etc/nccl.conf")}, "/etc/default/gpufleet-nccl")
    assert problems == [
        "a job step's NCCL reads NCCL_IB_HCA=mlx5_0 from /etc/nccl.conf, nccl_env sets "
        "mlx5_0,mlx5_1",
        "a job step gets NCCL_SOCKET_IFNAME=eth0 from its environment, nccl_env sets ib0 (the "
        "environment wins over nccl.conf)",
        "a job step does not get NCCL_IB_GID_INDEX=3 (no nccl.conf the step's NCCL reads "
        "sets it; login shells get it from /etc/default/gpufleet-nccl): export it for every "
        "step, e.g. a TaskProlog printing 'export NCCL_IB_GID_INDEX=3'"]


# ---- the node's GRES ----------------------------------------------------------------------

@pytest.mark.parametrize(("gres_type", "model", "named"), [
    ("h100", "NVIDIA H100 80GB HBM3", True),
    ("nvidia_h100_80gb_hbm3", "NVIDIA H100 80GB HBM3", True),
    ("a100", "NVIDIA A100-SXM4-80GB", True),
    ("tesla_v100-sxm2-16gb", "Tesla V100-SXM2-16GB", True),
    ("h100nvl", "NVIDIA H100 NVL", True),
    ("h200", "NVIDIA H200", True),
    ("a100", "NVIDIA H200", False),
    ("hopper", "NVIDIA H200", False),
    ("", "NVIDIA H200", False)])
def test_a_gres_type_names_a_model(gres_type: str, model: str, named: bool) -> None:
    assert checks.names_model(gres_type, model) is named


def test_gres_that_matches_the_node_passes() -> None:
    node = _slurm_node("scontrol_show_node_gpu_typed.txt", "gpu001")
    assert checks.gres_problems("gpu001", node.gres, node.gpu_types, gpus=8, where="nvidia-smi",
                                models=["NVIDIA H100 80GB HBM3"] * 8, declared=None) == []
    untyped = _slurm_node("scontrol_show_node_gpu_untyped.txt", "gpu001")
    assert checks.gres_problems("gpu001", untyped.gres, untyped.gpu_types, gpus=4,
                                where="nvidia-smi", models=["NVIDIA H200"], declared=None) == []


def test_gres_of_another_count_or_type_fails() -> None:
    node = _slurm_node("scontrol_show_node_gpu_untyped.txt", "gpu002")
    assert checks.gres_problems("gpu002", node.gres, node.gpu_types, gpus=8,
                                where="nvidia-smi", models=["NVIDIA H200"] * 8,
                                declared=None) == [
        "Slurm's GRES for gpu002 is gpu:a100:4 (4 GPUs) but the node has 8 (nvidia-smi): "
        "jobs can be given only 4 of them",
        "Slurm's GRES for gpu002 (gpu:a100:4) names type a100 but the node's GPUs are "
        "NVIDIA H200 (declare slurm_job_gres_type where the type is a name of the site's "
        "own)"]
    lab = _slurm_node("scontrol_show_node.txt", "node04")
    assert checks.gres_problems("node04", lab.gres, lab.gpu_types, gpus=0, where="the PCI bus",
                                models=[], declared=None) == [
        "Slurm's GRES for node04 is gpu:2 (2 GPUs) but the node has 0 (the PCI bus): Slurm "
        "would give jobs GPUs the node does not have"]


def test_a_declared_gres_type_is_the_one_required() -> None:
    node = _slurm_node("scontrol_show_node_gpu_typed.txt", "gpu001")
    assert checks.gres_problems("gpu001", node.gres, node.gpu_types, gpus=8, where="x",
                                models=["NVIDIA H100"], declared="h100") == []
    assert checks.gres_problems("gpu001", node.gres, node.gpu_types, gpus=8, where="x",
                                models=["NVIDIA H100"], declared="hopper") == [
        "Slurm's GRES for gpu001 (gpu:h100:8) names type h100, slurm_job_gres_type is hopper"]


# ---- Slurm's configuration ----------------------------------------------------------------

def _problems(name: str, task_plugin: str = "task/cgroup", confine: bool = True) -> list[str]:
    flat = parse_show_config(_text(f"scontrol_show_config_{name}.txt")).flat()
    return checks.config_problems(flat, task_plugin, confine)


def _heads(problems: list[str]) -> list[str]:
    return [p.split(":")[0].split(" is ")[0] for p in problems]


def test_a_cgroup_configuration_that_keeps_memlock_passes() -> None:
    assert _problems("cgroup") == []
    assert _problems("propagate_list") == []
    assert _problems("propagate_none") == []


@pytest.mark.parametrize(("name", "heads"), [
    ("lab", ["TaskPlugin", "ProctrackType", "scontrol show config prints no cgroup.conf "
             "settings (no cgroup plugin configured)", "PropagateResourceLimits"]),
    ("defaults", ["TaskPlugin", "ConstrainDevices", "PropagateResourceLimits"]),
    ("no_cgroup_plugin", ["TaskPlugin", "ProctrackType", "scontrol show config prints no "
                          "cgroup.conf settings (no cgroup plugin configured)",
                          "PropagateResourceLimits"]),
    ("except_nofile", ["ConstrainDevices", "PropagateResourceLimits"]),
    ("task_prolog", ["TaskPlugin", "ProctrackType", "scontrol show config prints no "
                     "cgroup.conf settings (no cgroup plugin configured)"]),
    ("19.05.5", ["ConstrainDevices", "PropagateResourceLimits"]),
    ("2.3.2", ["TaskPlugin", "ProctrackType", "scontrol show config prints no cgroup.conf "
               "settings (no cgroup plugin configured)", "PropagateResourceLimits"])])
def test_each_capture_fails_on_what_it_lacks(name: str, heads: list[str]) -> None:
    assert _heads(_problems(name)) == heads


def test_the_messages_say_what_follows_and_what_to_set() -> None:
    problems = _problems("defaults")
    assert problems[0] == ("TaskPlugin is task/none, without task/cgroup: a job's tasks are "
                           "not confined to the CPUs, memory and devices Slurm gave them")
    assert problems[1] == ("ConstrainDevices is no in cgroup.conf: a job can open every GPU "
                           "of its node, those Slurm gave other jobs included")
    assert problems[2] == (
        "PropagateResourceLimits is ALL and PropagateResourceLimitsExcept (null): a job step "
        "gets the memlock limit of the shell that submitted it, not slurmd's (a login "
        "shell's 64 KiB or 8 MiB breaks NCCL over InfiniBand/RoCE at init); set "
        "PropagateResourceLimitsExcept=MEMLOCK")
    assert _problems("lab")[1].startswith("ProctrackType is proctrack/linuxproc: Slurm tracks "
                                          "a job's processes without cgroups")


def test_declared_alternatives() -> None:
    assert _heads(_problems("defaults", task_plugin="", confine=False)) == [
        "PropagateResourceLimits"]
    assert _heads(_problems("no_cgroup_plugin", task_plugin="task/affinity", confine=False)) \
        == ["ProctrackType", "PropagateResourceLimits"]
    assert _problems("lab", task_plugin="task/affinity")[0] == \
        "TaskPlugin is task/none, without task/affinity"


@pytest.mark.parametrize(("limits", "propagated"), [
    ({}, True),
    ({"PropagateResourceLimits": "ALL", "PropagateResourceLimitsExcept": "(null)"}, True),
    ({"PropagateResourceLimits": "(null)", "PropagateResourceLimitsExcept": "MEMLOCK"}, False),
    ({"PropagateResourceLimits": "(null)", "PropagateResourceLimitsExcept": "NOFILE,STACK"},
     True),
    ({"PropagateResourceLimits": "NONE"}, False),
    ({"PropagateResourceLimits": "NOFILE,CORE"}, False),
    ({"PropagateResourceLimits": "memlock,nofile"}, True),
    ({"PropagateResourceLimitsExcept": "ALL"}, False)])
def test_memlock_propagation(limits: dict[str, str], propagated: bool) -> None:
    assert checks.memlock_propagated(limits) is propagated


# ---- the step: its command line, its bounds, its failures ------------------------------------

def _where(allocation: Allocation | None = None) -> measure.JobSlurm:
    return measure.JobSlurm(Slurm(timeout=10), "gpu001", allocation)


def test_a_job_of_its_own_asks_for_the_node_its_gpus_and_a_bounded_time() -> None:
    argv = measure.probe_argv(_where(), 1, 120, ("gpu", "debug"))
    assert argv[:-1] == [
        "srun", "--nodelist=gpu001", "--nodes=1", "--ntasks=1", "--time=2", "--immediate=60",
        "--partition=gpu,debug", "--job-name=gpufleet-job-view", "--quiet", "--export=NONE",
        "--gres=gpu:1", "/usr/bin/env", f"PATH={STEP_PATH}", "python3", "-c"]
    assert argv[-1] == measure.probe_text()
    assert "--gres" not in " ".join(measure.probe_argv(_where(), 0, 30)[:-1])


def test_under_the_slurm_launcher_the_step_joins_the_runs_allocation() -> None:
    allocation = Allocation(Slurm(), "41")
    argv = measure.probe_argv(_where(allocation), 2, 120, ("gpu",))
    assert argv[:12] == [
        "srun", "--jobid=41", "--nodelist=gpu001", "--nodes=1", "--ntasks=1", "--overlap",
        "--kill-on-bad-exit=0", "--job-name=gpufleet-job-view", "--quiet", "--export=NONE",
        "--gres=gpu:2", "/usr/bin/env"]
    assert not any(a.startswith(("--time", "--immediate", "--partition")) for a in argv[:-1])


@pytest.mark.parametrize(("name", "rc", "message"), [
    ("srun_nodes_busy.txt", 1,
     "srun: error: Unable to allocate resources: Requested nodes are busy"),
    ("srun_gres_unavailable.txt", 1,
     "srun: error: Unable to allocate resources: Requested node configuration is not "
     "available"),
    ("srun_execve_failed.txt", 2,
     "slurmstepd-gpu001: error: execve(): /nonexistent/python3: No such file or directory")])
def test_why_a_step_failed_from_sruns_own_words(name: str, rc: int, message: str) -> None:
    assert measure.step_failure(_text(name), rc) == message


def test_a_step_that_says_nothing_fails_with_its_exit_status() -> None:
    assert measure.step_failure("srun: error: gpu001: task 0: Exited with exit code 3\n", 3) \
        == "exit status 3"


def test_a_command_is_bounded_in_output_and_time() -> None:
    env = {"PATH": "/usr/bin:/bin"}
    rc, out, err, why = measure.run_bounded(
        ["sh", "-c", "echo out; echo err >&2; exit 3"], env, 10, 100)
    assert (rc, out, err, why) == (3, b"out\n", b"err\n", None)
    rc, out, _, why = measure.run_bounded(
        [sys.executable, "-c", "import sys; sys.stdout.write('x' * 300000); sys.stdout.flush()"
         "; import time; time.sleep(30)"], env, 20, 1000)
    assert rc is None and why == "printed more than 1000 bytes" and len(out) > 1000
    rc, _, _, why = measure.run_bounded(["sleep", "30"], env, 1, 100)
    assert rc is None and why == "did not finish within 1s"


def _node(tmp_path: Path, **variables: Any) -> Node:
    return Node(Host("gpu001", dict(variables), frozenset({"all"})), ConnectOptions())


def _srun(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    stand_in(bin_dir, "srun", f'printf "%s\\n" "$@" > {tmp_path}/argv\n{body}')
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    return tmp_path / "argv"


IDLE = "scontrol_show_node_gpu001_idle.txt"


def test_a_job_of_its_own_through_srun(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    argv = _srun(tmp_path, monkeypatch, f"cat {SLURM / 'job_view_memlock_propagated.json'}\n")
    found = measure.job_view(_node(tmp_path), _where(), _slurm_node(IDLE, "gpu001"), gpus=1,
                             timeout_s=30)
    assert found.error is None and found.skip is None and found.view is not None
    assert found.view.memlock == Limit(64 * KIB, 8 * 2**20)
    words = argv.read_text().splitlines()
    assert "--partition=gpu" in words and "--gres=gpu:1" in words
    assert found.command[-1] == "<job_view.py>" and found.command[0] == "srun"


def test_a_drained_node_skips_the_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    argv = _srun(tmp_path, monkeypatch, "exit 0\n")
    drained = _slurm_node("scontrol_show_node.txt", "node01")
    found = measure.job_view(_node(tmp_path), _where(), drained, gpus=1, timeout_s=30)
    assert found.skip == ("Slurm starts no job on gpu001 now: IDLE+DRAIN in Slurm: "
                          "maintenance: replace PSU | ticket=OPS-12 Comment=x")
    assert not argv.exists()


@pytest.mark.parametrize(("body", "error"), [
    (f"cat {SLURM / 'srun_nodes_busy.txt'} >&2\nexit 1\n",
     "the job view step on gpu001 failed: srun: error: Unable to allocate resources: "
     "Requested nodes are busy"),
    ("echo 'not json'\n", "the job view probe printed no JSON document: 'not json'"),
    ("exec sleep 30\n", "the job view step on gpu001 did not finish within 2s"),
    ("yes '{' | head -c 400000\nexec sleep 30\n",
     f"the job view step on gpu001 printed more than {checks.PROBE_MAX_BYTES} bytes")])
def test_a_step_that_gives_no_document_is_unknown_with_why(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str, error: str) -> None:
    _srun(tmp_path, monkeypatch, body)
    found = measure.job_view(_node(tmp_path), _where(), _slurm_node(IDLE, "gpu001"), gpus=1,
                             timeout_s=2)
    assert found.view is None and found.error == error


def test_no_slurm_for_a_node_says_how_to_name_one(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    assert measure.job_slurm(_node(tmp_path), "ssh") == measure.NO_SLURM
    assert measure.job_slurm(_node(tmp_path, gpufleet_scheduler="none"), "ssh") == \
        measure.NO_SLURM
    monkeypatch.setenv("PATH", str(tmp_path))
    assert measure.job_slurm(_node(tmp_path, gpufleet_scheduler="slurm"), "ssh") == (
        "scontrol and srun not found on this machine: install Slurm's client commands "
        "(Debian/Ubuntu: apt-get install slurm-client)")
    stand_in(tmp_path, "scontrol", "")
    stand_in(tmp_path, "srun", "")
    where = measure.job_slurm(_node(tmp_path, gpufleet_scheduler="slurm",
                                    gpufleet_slurm_conf="/etc/slurm/other.conf",
                                    gpufleet_slurm_node="gpu-a17"), "ssh")
    assert isinstance(where, measure.JobSlurm)
    assert (str(where.slurm.conf), where.node, where.own_job) == (
        "/etc/slurm/other.conf", "gpu-a17", True)
    with pytest.raises(GpufleetError, match="must be slurm or none"):
        measure.job_slurm(_node(tmp_path, gpufleet_scheduler="pbs"), "ssh")


# ---- the declaration ----------------------------------------------------------------------

def test_slurm_job_is_in_no_set_and_in_all() -> None:
    assert "slurm_job" not in [s.name for s in registry.select("conformance,acceptance")]
    assert "slurm_job" in [s.name for s in registry.select("all")]
    assert "slurm_job" not in registry.sets_help()
    suite = registry.suite("slurm_job")
    assert suite not in registry.bootstrap_suites() and not suite.cross_node
    defaults = registry.defaults()
    assert defaults["slurm_job_nofile"] == 131072
    assert defaults["slurm_job_memlock"] == "unlimited"
    assert defaults["slurm_job_step_gpus"] is None and defaults["slurm_job_min_shm_gb"] is None
    assert defaults["slurm_job_require_device_confinement"] is True


@pytest.mark.parametrize(("variables", "message"), [
    ({"slurm_job_step_gpus": -1}, "slurm_job_step_gpus must be an integer from 0 to 64"),
    ({"slurm_job_step_gpus": "two"}, "slurm_job_step_gpus must be an integer"),
    ({"slurm_job_timeout_s": 5}, "slurm_job_timeout_s must be an integer from 10 to 3600"),
    ({"slurm_job_nofile": 0}, "slurm_job_nofile must be an integer above 0"),
    ({"slurm_job_memlock": 0}, "slurm_job_memlock must be unlimited or a positive number"),
    ({"slurm_job_min_shm_gb": 0}, "slurm_job_min_shm_gb must be a number above 0"),
    ({"slurm_job_require_device_confinement": "perhaps"}, "must be a boolean"),
    ({"gpufleet_scheduler": "pbs"}, "gpufleet_scheduler must be slurm or none")])
def test_variables_are_checked_before_any_host(variables: dict[str, Any], message: str
                                               ) -> None:
    host = Host("gpu001", variables, frozenset({"all"}))
    with pytest.raises(GpufleetError, match=message):
        registry.validate([host], [registry.suite("slurm_job")])


def test_declared_variables_are_read_typed() -> None:
    host = Host("gpu001", {"slurm_job_step_gpus": 2, "slurm_job_min_shm_gb": 8,
                           "host_min_shm_gb": 2}, frozenset({"all"}))
    settings = SlurmJobSettings.read(host)
    assert (settings.slurm_job_step_gpus, settings.slurm_job_min_shm_gb,
            settings.host_min_shm_gb, settings.slurm_job_task_plugin) == (
        2, 8, 2, "task/cgroup")
