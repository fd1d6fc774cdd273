"""The ddp suite: DDP training throughput and its scaling."""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.conformance.registry import Suite, setting
from gpufleet.conformance.suites.common import Performance, Probe, check_in_image


@dataclass(frozen=True, kw_only=True)
class DdpSettings(Probe, Performance):
    """What the ddp suite reads."""

    ddp_steps: int = setting(30, "integer", "timed steps per trial")
    ddp_batch_size: int = setting(64, "integer", "samples per step and rank")
    ddp_width: int | None = setting(None, "integer", "model width (probe's default)")
    ddp_depth: int | None = setting(None, "integer", "model depth (probe's default)")
    ddp_timeout_s: float = setting(600, "number", "limit of each job")
    ddp_min_efficiency: float = setting(0.85, "number", "scaling within a node")
    ddp_min_efficiency_across_nodes: float = setting(0.7, "number", "scaling across nodes")

SUITE = Suite(
    "ddp", ("acceptance",),
    "DDP training throughput and its scaling within a node and across nodes",
    order=70,
    settings=DdpSettings,
    cross_node=frozenset({"ddp_across_nodes"}), records_baseline=True,
    check=check_in_image)
