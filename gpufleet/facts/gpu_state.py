"""A GPU's standing state against the declared one: MIG mode, ECC mode, persistence mode,
the power limit, application clocks, locked clocks and the compute mode, as the ``gpus``
fact (``nvidia-smi --query-gpu``) reports them.

Pure and shared: the gpu_state suite judges a node with it and the gpu_settings role plans
(provision) and reports (drift) with it, so the two never disagree on what differs.

A field an older driver does not know is missing from the fact's rows (the query drops it
and keeps the others): that setting is unknown on that GPU, never a pass. ``N/A`` (None)
means the GPU has no such setting (no MIG on a PCIe L40S, no ECC on a GeForce): nothing to
judge, unless the declaration asks for a mode the GPU cannot have.

Locked clocks (``nvidia-smi -lgc``/``-lmc``) have no query field of their own: NVML reports
them through the clock event reason ``applications_clocks_setting`` ("clocks are set to
application-specific values"), which application clocks lowered by ``-ac`` raise too. A GPU
whose reason is active while its application clocks are at their defaults is reported as
locked.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

SETTINGS = ("mig", "ecc", "persistence", "power_limit", "app_clocks", "locked_clocks",
            "compute_mode")
COMPUTE_MODES = ("Default", "Exclusive_Process", "Prohibited")
POWER_TOLERANCE_W = 0.5  # nvidia-smi prints the limit to the hundredth of a watt

MIG, MIG_PENDING = "mig.mode.current", "mig.mode.pending"
ECC, ECC_PENDING = "ecc.mode.current", "ecc.mode.pending"
PERSISTENCE = "persistence_mode"
POWER_LIMIT, POWER_DEFAULT = "power.limit", "power.default_limit"
APP_MEMORY, APP_GRAPHICS = "clocks.applications.memory", "clocks.applications.graphics"
DEFAULT_MEMORY = "clocks.default_applications.memory"
DEFAULT_GRAPHICS = "clocks.default_applications.graphics"
APP_CLOCKS_REASON = "clocks_event_reasons.applications_clocks_setting"
COMPUTE_MODE = "compute_mode"
QUERY_FIELDS = (MIG, MIG_PENDING, ECC_PENDING, COMPUTE_MODE, POWER_DEFAULT, APP_GRAPHICS,
                APP_MEMORY, DEFAULT_GRAPHICS, DEFAULT_MEMORY, APP_CLOCKS_REASON)
"""The fields the ``gpus`` fact's query carries for this judgement beyond what it had."""


@dataclass(frozen=True)
class Declared:
    """The declared state (inventory variables, named in ``VARIABLES``); None: not judged,
    or for the power limit and application clocks, the GPU's own defaults."""

    mig: bool | None = False
    ecc: bool | None = True
    persistence: bool | None = True
    power_limit_w: float | None = None
    app_clocks: tuple[int, int] | None = None  # (memory, graphics) MHz, as -ac takes them
    locked_clocks: bool = False
    compute_mode: str | None = "Default"


VARIABLES = {"mig": "gpu_state_mig", "ecc": "gpu_state_ecc",
             "persistence": "gpu_persistence_mode", "power_limit": "gpu_state_power_limit_w",
             "app_clocks": "gpu_state_app_clocks", "locked_clocks": "gpu_state_locked_clocks",
             "compute_mode": "gpu_state_compute_mode"}


@dataclass(frozen=True)
class Difference:
    """One GPU's setting that differs from the declared one (``unknown``: not reported)."""

    gpu: str
    setting: str
    seen: str
    expected: str
    unknown: bool = False

    @property
    def variable(self) -> str:
        return VARIABLES[self.setting]

    def __str__(self) -> str:
        return f"{self.gpu}: {LABELS[self.setting]} {self.seen}, expected {self.expected} " \
               f"({self.variable})"


LABELS = {"mig": "MIG mode", "ecc": "ECC mode", "persistence": "persistence mode",
          "power_limit": "power limit", "app_clocks": "application clocks",
          "locked_clocks": "clocks", "compute_mode": "compute mode"}
NOT_REPORTED = "not reported (this driver's nvidia-smi lacks the field)"


def parse_app_clocks(text: str) -> tuple[int, int]:
    """``"3201,1980"`` (memory, graphics MHz, as ``nvidia-smi -ac`` takes them) -> a pair;
    ValueError otherwise."""
    parts = [p.strip() for p in text.split(",")]
    if len(parts) != 2 or not all(p.isdigit() and 0 < int(p) < 100000 for p in parts):
        raise ValueError(text)
    return int(parts[0]), int(parts[1])


def _on(value: bool) -> str:
    return "Enabled" if value else "Disabled"


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) \
        else None


def _mode(gpu: dict[str, Any], setting: str, key: str, pending: str | None,
          want: bool | None, *, none_is_unknown: bool = False) -> Difference | None:
    """A boolean mode (MIG, ECC, persistence) against ``want``; ``none_is_unknown``: N/A
    is unknown (other GPUs of the node report the mode)."""
    name = f"GPU{gpu.get('index')}"
    if want is None:
        return None
    if key not in gpu:
        return Difference(name, setting, NOT_REPORTED, _on(want), unknown=True)
    value = gpu[key]
    if value is None:
        if none_is_unknown:
            return Difference(name, setting, "not reported", _on(want), unknown=True)
        return None if not want else Difference(name, setting, "N/A", _on(want))
    if value == want:
        return None
    seen = _on(value)
    if pending is not None and gpu.get(pending) == want:
        seen += f" ({_on(want)} pending a GPU reset or reboot)"
    return Difference(name, setting, seen, _on(want))


def _power(gpu: dict[str, Any], want_w: float | None) -> Difference | None:
    name = f"GPU{gpu.get('index')}"
    limit = _number(gpu.get(POWER_LIMIT))
    if limit is None:  # no power management on this GPU
        return None
    default = _number(gpu.get(POWER_DEFAULT))
    want = want_w if want_w is not None else default
    if want is None:
        return Difference(name, "power_limit", f"{limit:g} W", "the default limit (not "
                          "reported by this driver's nvidia-smi)", unknown=True)
    if abs(limit - want) <= POWER_TOLERANCE_W:
        return None
    expected = f"{want:g} W" + (" (the GPU's default)" if want_w is None else "")
    return Difference(name, "power_limit", f"{limit:g} W", expected)


def _app_clocks(gpu: dict[str, Any], want: tuple[int, int] | None) -> Difference | None:
    name = f"GPU{gpu.get('index')}"
    seen = _number(gpu.get(APP_MEMORY)), _number(gpu.get(APP_GRAPHICS))
    if None in seen:  # not supported (or deprecated) on this GPU: nothing to judge
        return None
    defaults = _number(gpu.get(DEFAULT_MEMORY)), _number(gpu.get(DEFAULT_GRAPHICS))
    expected = want if want is not None else defaults
    if expected[0] is None or expected[1] is None:
        return None
    if (float(expected[0]), float(expected[1])) == seen:
        return None
    shown = f"memory {seen[0]:g} MHz, graphics {seen[1]:g} MHz"
    wanted = f"memory {expected[0]:g} MHz, graphics {expected[1]:g} MHz" + \
        (" (the GPU's defaults)" if want is None else "")
    return Difference(name, "app_clocks", shown, wanted)


def _locked(gpu: dict[str, Any], allowed: bool) -> Difference | None:
    name = f"GPU{gpu.get('index')}"
    if allowed:
        return None
    if APP_CLOCKS_REASON not in gpu:
        return Difference(name, "locked_clocks", NOT_REPORTED, "not locked", unknown=True)
    if gpu[APP_CLOCKS_REASON] is not True:
        return None
    at_defaults = (_number(gpu.get(APP_MEMORY)), _number(gpu.get(APP_GRAPHICS))) == \
        (_number(gpu.get(DEFAULT_MEMORY)), _number(gpu.get(DEFAULT_GRAPHICS)))
    if not at_defaults:  # held by application clocks: the app_clocks check names them
        return None
    sm = _number(gpu.get("clocks.current.sm", gpu.get("clocks.sm")))
    at = f" (SM at {sm:g} MHz)" if sm is not None else ""
    return Difference(name, "locked_clocks", f"locked by nvidia-smi -lgc/-lmc{at}",
                      "not locked")


def _compute_mode(gpu: dict[str, Any], want: str | None) -> Difference | None:
    name = f"GPU{gpu.get('index')}"
    if want is None:
        return None
    if COMPUTE_MODE not in gpu:
        return Difference(name, "compute_mode", NOT_REPORTED, want, unknown=True)
    value = gpu[COMPUTE_MODE]
    if value is None or str(value).lower() == want.lower():
        return None
    return Difference(name, "compute_mode", str(value), want)


def _judge(gpu: dict[str, Any], setting: str, declared: Declared,
           ecc_reported: bool) -> Difference | None:
    if setting == "ecc" and not ecc_reported and gpu.get(ECC, False) is None:
        return None  # no GPU of the node has ECC
    judges: dict[str, Callable[[], Difference | None]] = {
        "mig": partial(_mode, gpu, "mig", MIG, MIG_PENDING, declared.mig),
        "ecc": partial(_mode, gpu, "ecc", ECC, ECC_PENDING, declared.ecc,
                       none_is_unknown=True),
        "persistence": partial(_mode, gpu, "persistence", PERSISTENCE, None,
                               declared.persistence),
        "power_limit": partial(_power, gpu, declared.power_limit_w),
        "app_clocks": partial(_app_clocks, gpu, declared.app_clocks),
        "locked_clocks": partial(_locked, gpu, declared.locked_clocks),
        "compute_mode": partial(_compute_mode, gpu, declared.compute_mode),
    }
    return judges[setting]()


def differences(gpus: list[dict[str, Any]], declared: Declared,
                settings: tuple[str, ...] = SETTINGS) -> list[Difference]:
    """Every GPU's ``settings`` that differ from ``declared``, GPU by GPU in the order of
    ``SETTINGS``. A GPU without ECC (N/A) is judged only where another GPU of the node
    reports a mode (then unknown)."""
    ecc_reported = any(g.get(ECC) is not None for g in gpus)
    found = [_judge(gpu, s, declared, ecc_reported) for gpu in gpus for s in SETTINGS
             if s in settings]
    return [d for d in found if d is not None]
