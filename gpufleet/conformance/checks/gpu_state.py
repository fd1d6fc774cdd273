"""The gpu_state suite's verdicts, pure: the GPUs' standing state as the ``gpus`` fact
(``nvidia-smi --query-gpu``) reports it, against the declared state
(gpufleet/facts/gpu_state.py, which the gpu_settings role plans with too)."""

from __future__ import annotations

from typing import Any

from gpufleet.facts import gpu_state


def declared(*, mig: bool | None, ecc: bool | None, persistence: bool | None,
             power_limit_w: float | None, app_clocks: str | None, locked_clocks: bool | None,
             compute_mode: str | None) -> gpu_state.Declared:
    """The declared state from the suite's settings (validated before any host);
    ``persistence`` false is not judged, as the gpu suite's variable always meant."""
    return gpu_state.Declared(
        mig=mig, ecc=ecc, persistence=persistence or None, power_limit_w=power_limit_w,
        app_clocks=None if app_clocks is None else gpu_state.parse_app_clocks(app_clocks),
        locked_clocks=bool(locked_clocks), compute_mode=compute_mode)


def state(gpus: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """What each GPU reports of its state, by ``GPU<index>`` (for the report)."""
    keys = (gpu_state.MIG, gpu_state.ECC, gpu_state.PERSISTENCE, gpu_state.POWER_LIMIT,
            gpu_state.POWER_DEFAULT, gpu_state.APP_MEMORY, gpu_state.APP_GRAPHICS,
            gpu_state.APP_CLOCKS_REASON, gpu_state.COMPUTE_MODE)
    return {f"GPU{g.get('index')}": {k: g[k] for k in keys if k in g} for g in gpus}


def problems(gpus: list[dict[str, Any]], want: gpu_state.Declared) -> tuple[list[str], list[str]]:
    """``(differ, unknown)``: each GPU's setting that differs from ``want``, named with the
    value seen, the value expected and the variable that declares it; and those the GPU does
    not report (unknown, never a pass)."""
    found = gpu_state.differences(gpus, want)
    return ([str(d) for d in found if not d.unknown], [str(d) for d in found if d.unknown])
