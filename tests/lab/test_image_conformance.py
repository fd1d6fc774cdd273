"""Image conformance on a lab of its own, every node running Podman with the lab's training
image (tests/lab/images.py: Debian, python3 and the CPU torch; CUDA and NCCL declared as
NVIDIA's images declare them). The nodes have no torch of their own: every torch the
checks see is the image's.

Faults, one per node, each under the tag the fleet names: node04 holds an image whose NCCL
is another than the fleet's pin, node05 one whose CUDA needs a newer driver than the node's
550.127.05, node08 one whose entrypoint fails; node06 starts its containers with a 64 MiB
/dev/shm and node07 without the shared filesystem. Each fails the right check, naming the
image, the component and both versions; node04, node05 and node08 hold an image other than
the group's. node01-node03 pass, and the allreduce and ddp suites pass across them with
every probe in a container of the image."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gpufleet import app
from gpufleet.lab.cluster import Lab
from tests.conftest import ROOT
from tests.lab import images
from tests.lab.conftest import lab_config_for, node_sh
from tests.lab.test_provision import override

NODES = 8
TAG = "localhost/gpufleet-lab/train:24.12"
MOUNT = "/mnt/gpufleet-image-shared"
DRIVER = "550.127.05"
REQUIRE_124 = ("cuda>=12.4 brand=tesla,driver>=470,driver<471 brand=nvidia,driver>=470,"
               "driver<471 brand=tesla,driver>=535,driver<536")
GOOD = {"CUDA_VERSION": "12.4.1", "NVIDIA_REQUIRE_CUDA": REQUIRE_124, "NCCL_VERSION": "2.21.5"}
VARIANTS = {
    "node04": {**GOOD, "NCCL_VERSION": "2.19.3"},
    "node05": {**GOOD, "CUDA_VERSION": "12.8.1", "NVIDIA_REQUIRE_CUDA": "cuda>=12.8"},
}
FLEET = {"container_engine": "podman", "nvidia_container_toolkit_version": "1.17.8-1",
         "container_run_options": ["--shm-size=2g"], "container_pull": "never",
         "shared_mounts": [{"path": MOUNT, "writable": True}],
         # the probes' work kept small: the test proves where they run, not their figures;
         # three containers starting torch at once on a loaded machine took over 90 s to
         # the first collective (AllReduce) and over 180 s (DDP)
         "allreduce_sizes": "64K,1M", "ddp_steps": 6, "allreduce_cpu_procs": 1,
         "allreduce_timeout_s": 300, "ddp_timeout_s": 300}
PER_NODE = {"node06": {"container_run_options": ["--shm-size=64m"]},
            "node07": {"container_mounts": []}}


@pytest.fixture(scope="module")
def image_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    if os.geteuid() != 0:
        pytest.skip("lab tests need root: they create network namespaces and mounts")
    missing = [t for t in ("podman", "debootstrap") if shutil.which(t) is None]
    if missing:
        pytest.fail(f"{', '.join(missing)} missing: scripts/setup installs them")
    inventory_dir = tmp_path_factory.mktemp("image-inventory") / "lab"
    shutil.copytree(ROOT / "inventory" / "lab" / "group_vars", inventory_dir / "group_vars")
    lab = Lab(lab_config_for("im", 9, inventory_dir))
    lab.down()
    lab.up(NODES)
    export = lab.config.root / "export"
    export.mkdir(parents=True, exist_ok=True)
    Path(MOUNT).mkdir(exist_ok=True)
    store = images.store(lab)

    def prepare(name: str) -> None:
        images.enable(lab, name, store)
        node_sh(lab, name, f"mount --bind {export} {MOUNT} && mkdir -p /proc/driver/nvidia"
                " && printf '%s\\n' 'NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  "
                f"{DRIVER}  Release Build  (gpufleet lab)' > /proc/driver/nvidia/version")
        if name == "node08":
            images.build(lab, name, TAG, GOOD, entrypoint=[
                "/bin/sh", "-c", "echo 'entrypoint: /opt/setup.sh not found' >&2; exit 1"])
        else:
            images.build(lab, name, TAG, VARIANTS.get(name, GOOD), labels={
                "org.opencontainers.image.title": "gpufleet lab training image"})

    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(prepare, [n.name for n in lab.nodes()]))
    yield lab
    for node in lab.nodes():
        node_sh(lab, node.name, f"podman rm -af >/dev/null 2>&1; umount {MOUNT} 2>/dev/null; "
                "umount -R /sys/fs/cgroup 2>/dev/null; true", check=False)
    lab.down()
    with contextlib.suppress(OSError):
        Path(MOUNT).rmdir()


@contextlib.contextmanager
def _fleet(lab: Lab) -> Iterator[None]:
    inventory = lab.config.inventory_dir
    with contextlib.ExitStack() as stack:
        stack.enter_context(override(inventory, "group_vars", "lab", FLEET))
        for node, values in PER_NODE.items():
            stack.enter_context(override(inventory, "host_vars", node, values))
        yield


def _run(lab: Lab, tmp_path: Path, suites: str, limit: str | None = None,
         only: str | None = None) -> tuple[int, dict[str, object]]:
    report = tmp_path / f"{suites.replace(',', '-')}.json"
    code = app.conformance_cmd(str(lab.config.inventory_dir), suites=suites, limit=limit,
                               json_path=str(report), image=TAG,
                               extra_args=["-k", only] if only else None)
    return code, json.loads(report.read_text())


def _outcomes(document: dict[str, object]) -> dict[tuple[str, str], str]:
    return {(r["host"], r["check"].removeprefix("test_")): f"{r['outcome']}: {r['message']}"
            for r in document["results"]}  # type: ignore[attr-defined]


def test_each_image_fault_fails_its_node_naming_the_image_and_both_versions(
        image_lab: Lab, tmp_path: Path) -> None:
    with _fleet(image_lab):
        code, document = _run(image_lab, tmp_path, "image")
    results = _outcomes(document)
    failed = {k: v for k, v in results.items() if not v.startswith(("pass", "skip"))}
    assert code == 1
    assert set(failed) == {
        ("node04", "image_nccl_matches_pin"), ("node04", "image_agrees_within_each_group"),
        ("node05", "image_cuda_supported_by_driver"),
        ("node05", "image_agrees_within_each_group"),
        ("node06", "image_shm"), ("node07", "image_shared_mounts"),
        *(("node08", c) for c in ("image_starts", "image_cuda_supported_by_driver",
                                   "image_nccl_matches_pin", "image_torch_matches_pin",
                                   "image_shm", "image_shared_mounts",
                                   "image_agrees_within_each_group")),
    }, failed
    assert failed[("node04", "image_nccl_matches_pin")] == (
        f"fail: image {TAG}: NCCL 2.19.3 (NCCL_VERSION) but the fleet pins 2.21.5 "
        "(nccl_version)")
    cuda = failed[("node05", "image_cuda_supported_by_driver")]
    assert TAG in cuda and "12.8" in cuda and DRIVER in cuda and "12.4" in cuda, cuda
    assert failed[("node06", "image_shm")].startswith(
        f"fail: image {TAG}: /dev/shm is 0.0625 GiB in the container, under "
        "container_min_shm_gb 1"), failed[("node06", "image_shm")]
    assert failed[("node07", "image_shared_mounts")] == (
        f"fail: image {TAG}: in the container, {MOUNT} is not mounted")
    start = failed[("node08", "image_starts")]
    assert start.startswith(f"fail: image {TAG} does not start with podman: exit 1"), start
    assert "entrypoint: /opt/setup.sh not found" in start
    assert failed[("node08", "image_shm")].startswith("fail: unknown: "), failed
    agree = failed[("node04", "image_agrees_within_each_group")]
    assert "group lab: node04 runs" in agree and "node01 node02 node03 node06 node07 as" \
        in agree, agree
    for node in ("node01", "node02", "node03"):
        assert results[(node, "image_cuda_supported_by_driver")].startswith("pass")
        assert results[(node, "image_torch_matches_pin")].startswith("pass")
    # both stacks are reported: the host's driver and the image's own Python and torch
    stacks = document["data"]["image"]  # type: ignore[index]
    assert stacks["node01"]["host"]["driver"] == DRIVER
    assert stacks["node01"]["image_stack"]["torch"]["version"].startswith("2.13.0")
    assert stacks["node01"]["image_stack"]["python"] == "3.11.2"
    assert not node_sh(image_lab, "node01", "podman ps -aq"), "no container is left behind"


def test_a_good_image_passes_allreduce_and_ddp_in_containers_across_three_nodes(
        image_lab: Lab, tmp_path: Path) -> None:
    limit = "node01:node02:node03"
    assert not node_sh(image_lab, "node01", "ls /opt/gpufleet/venv/bin/torchrun 2>/dev/null; "
                       "true", check=False), "the nodes have no torch of their own"
    with _fleet(image_lab):
        # the runs across the nodes (the runs on each node alone are the same probes)
        code, document = _run(image_lab, tmp_path, "image,allreduce,ddp", limit,
                              "image or all_nodes_together or ddp_across_nodes")
    results = _outcomes(document)
    bad = {k: v for k, v in results.items() if not v.startswith(("pass", "skip"))}
    assert code == 0 and not bad, bad
    passed = {c for (_, c), v in results.items() if v.startswith("pass")}
    assert {"image_starts", "image_nccl_matches_pin", "image_agrees_within_each_group",
            "all_nodes_together", "ddp_across_nodes"} <= passed, sorted(passed)
    assert not node_sh(image_lab, "node02", "podman ps -aq"), "no container is left behind"
