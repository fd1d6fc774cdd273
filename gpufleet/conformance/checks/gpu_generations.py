"""GPU generations against the CUDA stack: every GPU's compute capability is supported by
the node's CUDA toolkit, its driver and its torch build, the torch build's CUDA runs on the
driver, and a node (and a group) has GPUs of one model unless ``gpu_mixed_models`` says
otherwise.

The CUDA release that first supports each compute capability and the first that no longer
does are NVIDIA's, from the CUDA Toolkit release notes (the Kepler architectures left in
12.0; Maxwell, Pascal and Volta in 13.0, which also renamed 10.1 to 11.0). A torch build
runs on a GPU when its arch list has the GPU's machine code (``sm_XY`` of the same major
and a minor not above the GPU's; ``sm_XYa`` only on X.Y itself; ``sm_XYf`` on the family
X.m, m >= Y) or PTX the driver can compile for it (``compute_XY`` at or below the GPU's
capability). A CUDA runtime runs on a driver of its major release or a later one (minor
version compatibility within a major release).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from gpufleet.errors import ParseError
from gpufleet.facts.catalog import NO_SMI, Fact, needs
from gpufleet.facts.gather import Facts

SUPPORT: dict[str, tuple[str, str | None]] = {
    "3.5": ("5.0", "12.0"), "3.7": ("6.5", "12.0"),
    "5.0": ("6.0", "13.0"), "5.2": ("6.5", "13.0"), "5.3": ("6.5", "13.0"),
    "6.0": ("8.0", "13.0"), "6.1": ("8.0", "13.0"), "6.2": ("8.0", "13.0"),
    "7.0": ("9.0", "13.0"), "7.2": ("10.0", "13.0"), "7.5": ("10.0", None),
    "8.0": ("11.0", None), "8.6": ("11.1", None), "8.7": ("11.4", None), "8.9": ("11.8", None),
    "9.0": ("11.8", None),
    "10.0": ("12.8", None), "10.1": ("12.8", "13.0"), "10.3": ("12.9", None),
    "11.0": ("13.0", None), "12.0": ("12.8", None), "12.1": ("12.9", None),
}
"""Compute capability -> (the first CUDA release that supports it, the first that does not)."""

_CUDA_LINE = re.compile(r"^CUDA Version\s*:\s*(\d+\.\d+)\s*$", re.MULTILINE)
_ARCH = re.compile(r"^(sm|compute)_(\d+)([af]?)\Z")


def parse_driver_cuda(text: str) -> str:
    """The CUDA version the driver supports, from ``nvidia-smi -q``'s header."""
    match = _CUDA_LINE.search(text)
    if not match:
        raise ParseError("nvidia-smi -q printed no 'CUDA Version' line")
    return match.group(1)


DRIVER_CUDA = Fact("driver_cuda", needs("nvidia-smi", NO_SMI) + "nvidia-smi -q | head -n 12",
                   parse_driver_cuda, "nvidia-smi")


def version(text: str) -> tuple[int, int]:
    """``12.4.1`` -> (12, 4)."""
    parts = [*(int(p) for p in re.findall(r"\d+", text)[:2]), 0, 0]
    return parts[0], parts[1]


def capability(text: str) -> tuple[int, int]:
    """``9.0`` -> (9, 0)."""
    major, _, minor = text.strip().partition(".")
    return int(major), int(minor or 0)


def unsupported(cuda: str, cc: str, what: str, dropped: bool = True) -> str | None:
    """Why the CUDA release ``cuda`` of ``what`` cannot run on compute capability ``cc``,
    or None; ``dropped`` False for a driver (R580 drives Volta, whose code CUDA 13.0's
    toolkit no longer builds)."""
    entry = SUPPORT.get(cc)
    if entry is None:
        return (f"unknown: compute capability {cc} is not in gpufleet's table of CUDA "
                f"releases; {what} is CUDA {cuda}")
    first, gone = entry
    if version(cuda) < version(first):
        return f"{what} is CUDA {cuda}; compute capability {cc} needs CUDA {first} or newer"
    if dropped and gone is not None and version(cuda) >= version(gone):
        return f"{what} is CUDA {cuda}; CUDA {gone} and later dropped compute capability {cc}"
    return None


def covers(arch_list: Iterable[str], cc: str) -> bool:
    """Whether a torch build with ``arch_list`` has code that runs on ``cc``."""
    major, minor = capability(cc)
    for arch in arch_list:
        match = _ARCH.match(arch.strip())
        if not match:
            continue
        kind, digits, suffix = match.groups()
        a_major, a_minor = int(digits[:-1] or 0), int(digits[-1])
        if kind == "compute":
            if (a_major, a_minor) <= (major, minor) and not suffix:
                return True
        elif suffix == "a":
            if (a_major, a_minor) == (major, minor):
                return True
        elif a_major == major and a_minor <= minor:
            return True
    return False


def runs_on_driver(runtime: str, driver: str) -> bool:
    """Whether a CUDA ``runtime`` runs on a driver that supports CUDA ``driver``: any
    runtime of the driver's major release or an earlier one."""
    return version(runtime)[0] <= version(driver)[0]


def capabilities(gpus: Iterable[Mapping[str, Any]]) -> dict[str, list[str]]:
    """Compute capability -> the GPUs (``GPU0``...) that have it."""
    found: dict[str, list[str]] = {}
    for gpu in gpus:
        cc = str(gpu.get("compute_cap") or "").strip()
        found.setdefault(cc or "unknown", []).append(f"GPU{gpu.get('index')}")
    return found


def toolkit_version(facts: Facts) -> str | None:
    """The CUDA toolkit's version: ``version.json``, else nvcc's."""
    found = facts.get("cuda_version_json") or facts.get("nvcc")
    return None if found is None else str(found)


def node_problems(gpus: Iterable[Mapping[str, Any]], toolkit: str | None, driver: str | None,
                  torch: Mapping[str, Any] | None) -> list[str]:
    """What in the node's stack cannot run on one of its GPUs (pure). ``torch`` is the torch
    probe's answer (None: not checked)."""
    problems = []
    for cc, names in sorted(capabilities(gpus).items()):
        where = f"{', '.join(names)} (compute capability {cc})"
        if cc == "unknown":
            problems.append(f"unknown: nvidia-smi reports no compute capability for {where}")
            continue
        if cc not in SUPPORT:
            problems.append(f"unknown: {where} is not in gpufleet's table of CUDA releases")
            continue
        found = [unsupported(toolkit, cc, "the CUDA toolkit") if toolkit else None,
                 unsupported(driver, cc, "the driver", dropped=False) if driver else None]
        if torch is not None and torch.get("cuda"):
            found.append(unsupported(str(torch["cuda"]), cc, f"torch {torch.get('torch')}"))
            arch = [str(a) for a in torch.get("arch_list") or []]
            if arch and not covers(arch, cc):
                found.append(f"torch {torch.get('torch')} has no code for it (its arch list: "
                             f"{' '.join(arch)})")
        problems += [f"{where}: {p}" for p in found if p]
    if torch is not None and torch.get("cuda") and driver and \
            not runs_on_driver(str(torch["cuda"]), driver):
        problems.append(f"torch {torch.get('torch')} is built for CUDA {torch['cuda']}, the "
                        f"driver supports CUDA {driver}: a newer driver is needed")
    return problems


def models_of(gpus: Iterable[Mapping[str, Any]]) -> dict[str, list[str]]:
    """GPU model -> the GPUs of that model."""
    found: dict[str, list[str]] = {}
    for gpu in gpus:
        found.setdefault(str(gpu.get("name")), []).append(f"GPU{gpu.get('index')}")
    return found


def mixed(by_model: Mapping[str, list[str]]) -> str:
    """``NVIDIA H200 on GPU0, GPU1; NVIDIA H100 80GB HBM3 on GPU2`` (most first)."""
    return "; ".join(f"{model} on {', '.join(names)}" for model, names in
                     sorted(by_model.items(), key=lambda item: (-len(item[1]), item[0])))
