"""The gpu_state suite: the GPUs' standing state against the declared one (in the
``conformance`` set: a GPU left capped, locked, partitioned or exclusive passes every load
suite while it trains slowly or refuses a second process)."""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet import roles
from gpufleet.conformance.registry import Settings, Suite, declared, setting
from gpufleet.provision.role import RoleVars

_SHARED = roles.gpu_state_settings()


@dataclass(frozen=True, kw_only=True)
class GpuStateSettings(Settings):
    """What the gpu_state suite reads: the declared state the gpu_settings role reports and
    sets, and persistence mode (set by the persistenced role)."""

    gpu_state_mig: bool = declared(_SHARED["gpu_state_mig"])
    gpu_state_ecc: bool = declared(_SHARED["gpu_state_ecc"])
    gpu_persistence_mode: bool = setting(True, "boolean", "persistence mode on every GPU "
                                                          "(null: not judged)")
    gpu_state_power_limit_w: float | None = declared(_SHARED["gpu_state_power_limit_w"])
    gpu_state_app_clocks: str | None = declared(_SHARED["gpu_state_app_clocks"])
    gpu_state_locked_clocks: bool = declared(_SHARED["gpu_state_locked_clocks"])
    gpu_state_compute_mode: str = declared(_SHARED["gpu_state_compute_mode"])


def _check(v: RoleVars) -> None:
    roles.gpu_state_declared(v.host)


SUITE = Suite(
    "gpu_state", ("conformance",),
    "the GPUs' standing state as declared: MIG off, ECC on, persistence on, the default "
    "power limit and application clocks, no locked clocks, compute mode Default",
    order=62,
    settings=GpuStateSettings,
    check=_check)
