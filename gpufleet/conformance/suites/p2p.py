"""The p2p suite: GPU-to-GPU and host-to-GPU copy bandwidth."""

from __future__ import annotations

from gpufleet.conformance import container
from gpufleet.conformance.registry import Suite
from gpufleet.conformance.suites.common import PERFORMANCE, check_in_image
from gpufleet.provision.role import Var

SUITE = Suite(
    "p2p", ("acceptance",),
    "GPU-to-GPU and host-to-GPU copy bandwidth",
    order=140,
    variables={**PERFORMANCE,
               "p2p_min_gbps": Var(None, "mapping", "{MODEL: GB/s} between GPUs"),
               "h2d_min_gbps": Var(None, "mapping", "{MODEL: GB/s} host to GPU"),
               "p2p_size_mb": Var(1024, "integer", "size of each copy"),
               "p2p_timeout_s": Var(600, "number", "limit of the probe"),
               **container.VARIABLES},
    records_baseline=True, check=check_in_image)
