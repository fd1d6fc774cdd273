"""The gpu_state suite's verdicts, pure: the GPUs' standing state as the ``gpus`` fact
(``nvidia-smi --query-gpu``) reports it."""

from __future__ import annotations

from typing import Any


def ecc_modes(gpus: list[dict[str, Any]]) -> dict[str, bool | None]:
    """Each GPU's current ECC mode by ``GPU<index>``: True (on), False (off) or None (the GPU
    reports none: it has no ECC, or nvidia-smi could not read it)."""
    modes: dict[str, bool | None] = {}
    for gpu in gpus:
        mode = gpu.get("ecc.mode.current")
        modes[f"GPU{gpu.get('index')}"] = mode if isinstance(mode, bool) else None
    return modes


def ecc_problems(modes: dict[str, bool | None]) -> tuple[list[str], list[str]]:
    """``(off, unknown)``: the GPUs whose ECC is off, and those that report no mode while
    others report one (unknown, never a pass)."""
    off = [f"{name}: ECC off" for name, mode in modes.items() if mode is False]
    unknown = ([f"{name}: no ECC mode reported" for name, mode in modes.items() if mode is None]
               if any(mode is not None for mode in modes.values()) else [])
    return off, unknown
