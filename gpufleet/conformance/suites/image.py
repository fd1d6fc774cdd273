"""The image suite: the fleet's training image on every node (in no set: ``--image`` and
``container_image`` run it)."""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.conformance import container
from gpufleet.conformance.checks import gpu_generations
from gpufleet.conformance.checks import mounts as mounts_checks
from gpufleet.conformance.container import ContainerSettings
from gpufleet.conformance.registry import Suite
from gpufleet.conformance.suites import mounts
from gpufleet.facts.gather import FactRequest
from gpufleet.inventory.model import Host
from gpufleet.provision.role import RoleVars


@dataclass(frozen=True, kw_only=True)
class ImageSettings(ContainerSettings, mounts.MountsSettings):
    """What the image suite reads."""


def _check(v: RoleVars) -> None:
    container.check(v)
    mounts.check_shared_mounts(v)


def _facts(host: Host) -> FactRequest:
    return FactRequest(custom=frozenset({
        gpu_generations.DRIVER_CUDA, container.GPU_BRAND, mounts_checks.MOUNTINFO}))


SUITE = Suite(
    "image", (),
    "the fleet's training image on every node: it starts under the NVIDIA runtime, "
    "sees every GPU, its CUDA runs on the node's driver, its NCCL and torch are the "
    "fleet's, /dev/shm, RDMA devices and shared mounts inside, one image per group",
    order=150,
    settings=ImageSettings,
    cross_node=frozenset({"image_agrees_within_each_group"}),
    facts=_facts, check=_check)
