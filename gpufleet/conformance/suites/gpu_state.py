"""The gpu_state suite: the GPUs' standing state (in no set: ``--suite gpu_state`` or
``all`` runs it)."""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.conformance.registry import Settings, Suite, setting


@dataclass(frozen=True, kw_only=True)
class GpuStateSettings(Settings):
    """What the gpu_state suite reads."""

    gpu_state_ecc: bool = setting(True, "boolean", "ECC must be on on every GPU that has it")


SUITE = Suite(
    "gpu_state", (),
    "the GPUs' standing state: ECC on every GPU",
    order=145,
    settings=GpuStateSettings)
