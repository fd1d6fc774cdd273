"""The p2p suite: GPU-to-GPU and host-to-GPU copy bandwidth."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpufleet.conformance.container import ContainerSettings
from gpufleet.conformance.registry import Suite, setting
from gpufleet.conformance.suites.common import Performance, check_in_image


@dataclass(frozen=True, kw_only=True)
class P2pSettings(ContainerSettings, Performance):
    """What the p2p suite reads."""

    p2p_min_gbps: dict[str, Any] | None = setting(None, "mapping", "{MODEL: GB/s} between "
                                                                   "GPUs")
    h2d_min_gbps: dict[str, Any] | None = setting(None, "mapping", "{MODEL: GB/s} host to GPU")
    p2p_size_mb: int = setting(1024, "integer", "size of each copy")
    p2p_timeout_s: float = setting(600, "number", "limit of the probe")

SUITE = Suite(
    "p2p", ("acceptance",),
    "GPU-to-GPU and host-to-GPU copy bandwidth",
    order=140,
    settings=P2pSettings,
    records_baseline=True, check=check_in_image)
