"""The ddp suite: DDP training throughput and its scaling."""

from __future__ import annotations

from gpufleet.conformance.registry import Suite
from gpufleet.conformance.suites.common import PERFORMANCE, check_in_image, probe_variables
from gpufleet.provision.role import Var

SUITE = Suite(
    "ddp", ("acceptance",),
    "DDP training throughput and its scaling within a node and across nodes",
    order=70,
    variables={**probe_variables(), **PERFORMANCE,
               "ddp_steps": Var(30, "integer", "timed steps per trial"),
               "ddp_batch_size": Var(64, "integer", "samples per step and rank"),
               "ddp_width": Var(None, "integer", "model width (probe's default)"),
               "ddp_depth": Var(None, "integer", "model depth (probe's default)"),
               "ddp_timeout_s": Var(600, "number", "limit of each job"),
               "ddp_min_efficiency": Var(0.85, "number", "scaling within a node"),
               "ddp_min_efficiency_across_nodes": Var(0.7, "number",
                                                      "scaling across nodes")},
    cross_node=frozenset({"ddp_across_nodes"}), records_baseline=True,
    check=check_in_image)
