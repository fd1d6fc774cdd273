"""Probes in the fleet's training image: the image variables refused before any host, the
engine's command line (GPUs, RDMA, mounts, the fleet's options), the launch that runs
torchrun in the container and removes it, and the engine's inspect output as Podman
prints it (tests/fixtures/containers/podman-image-inspect.json, captured on the lab)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from gpufleet import app
from gpufleet.conformance import container, registry
from gpufleet.conformance.checks import image as image_checks
from gpufleet.conformance.checks.mounts import parse_mountinfo
from gpufleet.conformance.launch import _command, clean_up
from gpufleet.conformance.session import Node
from gpufleet.connect.connection import CommandResult, ConnectOptions
from gpufleet.errors import GpufleetError
from gpufleet.facts.gather import Facts
from gpufleet.inventory.model import Host
from gpufleet.suites.test_image import gpus_seen, image_nccl
from tests.conftest import ROOT

INSPECT = ROOT / "tests" / "fixtures" / "containers" / "podman-image-inspect.json"
IMAGE = "nvcr.io/nvidia/pytorch:25.01-py3"
RUNDIR = "/tmp/gpufleet-probe-0123456789ab"


def node(facts: dict[str, Any] | None = None, **variables: Any) -> Node:
    values = {"ansible_host": "10.0.0.11", "container_engine": "podman",
              "container_image": IMAGE, **variables}
    return Node(Host("gpu01", values, frozenset({"all", "gpu"})), ConnectOptions(),
                Facts("gpu01", facts or {}))


def problems(**variables: Any) -> str:
    host = Host("gpu01", {"container_engine": "podman", "container_image": IMAGE,
                          **variables}, frozenset({"all"}))
    try:
        registry.validate([host], [registry.suite("image")])
    except GpufleetError as exc:
        return str(exc)
    return ""


@pytest.mark.parametrize(("variables", "message"), [
    ({"container_image": "Not An Image!"}, "container_image must be an image reference"),
    ({"container_engine": "containerd"}, "container_engine must be docker or podman"),
    ({"container_run_options": ["--ipc=host\n--privileged"]},
     "container_run_options must be engine run options"),
    ({"container_mounts": ["data"]}, "container_mounts must be absolute paths"),
    ({"container_pull": "sometimes"}, "container_pull must be missing or never or always"),
    ({"container_python": "python3; rm -rf /"}, "container_python must be an interpreter"),
    ({"container_min_shm_gb": -1}, "container_min_shm_gb must be a number of 0 or more"),
])
def test_bad_image_variables_are_refused_before_any_host(variables: dict[str, Any],
                                                         message: str) -> None:
    assert message in problems(**variables)


def test_good_references_pass_and_the_flag_is_checked_too() -> None:
    for reference in (IMAGE, "localhost/gpufleet-lab/train:24.12", "ubuntu",
                      "registry.example.com:5000/team/train@sha256:" + "0" * 64):
        assert problems(container_image=reference) == ""
    with pytest.raises(GpufleetError, match="--image must be an image reference"):
        container.check_reference("Train:latest", "--image")


def test_the_image_flag_is_refused_before_any_host(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "hosts.yml").write_text("all:\n  hosts:\n    gpu01:\n"
                                        "      ansible_host: 192.0.2.1\n")
    assert app.conformance_cmd(str(tmp_path / "hosts.yml"), image="a b") == 2
    err = capsys.readouterr().err
    assert "--image must be an image reference" in err and "Traceback" not in err


@pytest.mark.parametrize("reference", ["-eX/y:1", "--privileged/y:1", IMAGE + "\n",
                                       "ubuntu\n"])
def test_option_like_and_multi_line_references_are_refused(
        reference: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert "container_image must be an image reference" in problems(container_image=reference)
    (tmp_path / "hosts.yml").write_text("all:\n  hosts:\n    gpu01:\n"
                                        "      ansible_host: 192.0.2.1\n")
    assert app.conformance_cmd(str(tmp_path / "hosts.yml"), image=reference) == 2
    err = capsys.readouterr().err
    assert "--image must be an image reference" in err and "Traceback" not in err


@pytest.mark.parametrize(("variables", "message"), [
    ({"container_run_options": ["--ipc=host\n"]}, "container_run_options must be engine run"),
    ({"container_mounts": ["/data\n"]}, "container_mounts must be absolute paths"),
    ({"container_python": "-c"}, "container_python must be an interpreter"),
    ({"container_python": "python3\n"}, "container_python must be an interpreter"),
])
def test_option_like_and_multi_line_variables_are_refused(variables: dict[str, Any],
                                                          message: str) -> None:
    assert message in problems(**variables)


def test_podman_gets_the_gpus_by_cdi_docker_by_its_gpus_flag_and_rdma_when_present() -> None:
    facts = {"gpus": [{"uuid": "GPU-1"}], "rdma": [{"device": "mlx5_0"}]}
    argv = container.run_argv(node(facts, shared_mounts=[{"path": "/data"}],
                                   container_run_options=["--ipc=host"]),
                              RUNDIR, ["python3", "x.py"], {"OMP_NUM_THREADS": "1"})
    assert argv[:3] == ["podman", "run", "--rm"]
    assert "--name=gpufleet-gpufleet-probe-0123456789ab" in argv
    assert "--network=host" in argv and f"--volume={RUNDIR}:{RUNDIR}" in argv
    assert "--device=nvidia.com/gpu=all" in argv and "--device=/dev/infiniband" in argv
    assert "--volume=/data:/data" in argv and "--ipc=host" in argv
    assert argv[-4:] == ["--env=OMP_NUM_THREADS=1", IMAGE, "python3", "x.py"] or \
        argv[argv.index(IMAGE) - 1] == "--env=OMP_NUM_THREADS=1"
    docker = container.run_argv(node(facts, container_engine="docker", container_rdma=False,
                                     container_mounts=[]), RUNDIR, ["true"], {})
    assert "--gpus=all" in docker and "--device=/dev/infiniband" not in docker
    assert not [a for a in docker if a.startswith("--volume=/data")]
    cpu = container.run_argv(node({}), RUNDIR, ["true"], {})
    assert not [a for a in cpu if "nvidia.com/gpu" in a or a.startswith("--gpus")]


def test_torchrun_runs_in_the_container_under_the_launch_timeout() -> None:
    n = node({"interfaces": []}, allreduce_cpu_procs=2)
    command = _command(n, rank=0, nodes=[n], probe=f"{RUNDIR}/allreduce.py", args=["--x"],
                       timeout_s=90, port=29500, nproc=None)
    argv = shlex.split(command.split(" && ", 1)[1].split(";")[0])
    assert argv[:4] == ["timeout", "-k", "10", "90"]
    assert argv[4:6] == ["podman", "run"]
    after = argv[argv.index(IMAGE) + 1:]
    assert after[:4] == ["python3", "-m", "torch.distributed.run", "--nproc-per-node=2"]
    assert after[-2:] == [f"{RUNDIR}/allreduce.py", "--x"]
    assert "--env=NCCL_NVLS_ENABLE=0" in argv


class Recorder:
    def __init__(self) -> None:
        self.commands: list[str] = []

    def run(self, command: str, timeout: float = 0, stdin: bytes | None = None
            ) -> CommandResult:
        self.commands.append(command)
        return CommandResult(command, 0, "", "", 0.0)

    def close(self) -> None:
        return None


def test_the_clean_up_removes_the_container_before_killing_what_is_left() -> None:
    n = node({})
    recorder = Recorder()
    n._conn = recorder  # type: ignore[assignment]
    assert clean_up(RUNDIR, [n]) == {}
    [command] = recorder.commands
    assert command.startswith("podman rm -f gpufleet-gpufleet-probe-0123456789ab")
    assert "pkill -KILL" in command


def test_the_inspect_output_of_podman_gives_the_id_and_the_declarations() -> None:
    info = container.parse_inspect("localhost/gpufleet-lab/train:24.12", INSPECT.read_text())
    assert info.id.startswith("sha256:") and len(info.id) == 71
    assert info.env["CUDA_VERSION"] == "12.4.1"
    assert info.env["NVIDIA_REQUIRE_CUDA"].startswith("cuda>=12.4 brand=tesla")
    assert info.labels["org.opencontainers.image.title"] == "gpufleet lab training image"
    with pytest.raises(ValueError, match="no JSON"):
        container.parse_inspect("x", "Error: x: image not known")
    with pytest.raises(ValueError, match="no image"):
        container.parse_inspect("x", "[]")


def test_the_gpu_brand_is_read_from_the_real_h200_query() -> None:
    text = (ROOT / "tests" / "fixtures" / "h200x2" / "nvidia_smi_q.txt").read_text()
    assert container.parse_brand(text) == "NVIDIA"


H200_STACK = ROOT / "tests" / "fixtures" / "h200x1" / "containers" / "image_stack.json"
H200_UUID = "GPU-c0d90b27-196a-874b-b4c8-678cdbee7eb1"


def test_the_stack_probe_in_nvidias_cuda_image_on_the_h200() -> None:
    """The probe's real output in a container of NVIDIA's CUDA 13.0.2 image on the H200:
    the NCCL the job uses is torch's own (2.28.9), not the image's libnccl2 or its
    NCCL_VERSION (2.28.3); the one GPU is seen by UUID; the image's real
    NVIDIA_REQUIRE_CUDA holds on the node's driver, and on an older 570 driver only by a
    forward-compatibility branch."""
    stack = json.loads(H200_STACK.read_text())
    env = stack["env"]
    assert image_nccl(stack, env) == ("2.28.9", "torch.cuda.nccl.version()")
    no_torch = {**stack, "torch": {"error": "ModuleNotFoundError: No module named 'torch'"}}
    assert image_nccl(no_torch, env) == ("2.28.3", "libnccl2")
    assert image_nccl({**no_torch, "dpkg_nccl": None}, env) == ("2.28.3", "NCCL_VERSION")
    assert gpus_seen(stack, [H200_UUID]) == (1, [])
    assert gpus_seen(stack, [H200_UUID, "GPU-other"]) == (1, ["GPU-other"])
    verdict = image_checks.judge(image_cuda=env["CUDA_VERSION"], require=env["NVIDIA_REQUIRE_CUDA"],
                                disable_require=False, driver="580.159.04",
                                driver_cuda_version="13.0", brand="NVIDIA")
    assert verdict.ok and verdict.rule == "requirement", verdict
    older = image_checks.judge(image_cuda=env["CUDA_VERSION"], require=env["NVIDIA_REQUIRE_CUDA"],
                              disable_require=False, driver="570.195.03",
                              driver_cuda_version="12.8", brand="NVIDIA")
    assert older.ok and older.rule == "forward compatibility", older
    geforce = image_checks.judge(image_cuda=env["CUDA_VERSION"],
                                require=env["NVIDIA_REQUIRE_CUDA"], disable_require=False,
                                driver="570.195.03", driver_cuda_version="12.8",
                                brand="GeForce")
    assert not geforce.ok and "570.195.03" in geforce.message
    mounts = parse_mountinfo(stack["mountinfo"])
    assert any(m.target == "/dev/shm" for m in mounts)
    assert stack["shm_bytes"] == 128 << 30 and stack["rdma_devices"] == ["rdma_cm"]
