"""Pure readers of the container runtime's configuration: the CDI spec ``nvidia-ctk cdi
generate`` writes, Docker's ``daemon.json`` and containerd's ``config.toml`` after
``nvidia-ctk runtime configure``.

A CDI spec names the driver it was generated for twice: the ``enable-cuda-compat`` hook's
``--host-driver-version=`` (toolkit 1.17.5 and later) and the versioned driver libraries it
mounts (``libcuda.so.570.133.20``). A spec of another driver mounts libraries that are gone
after a driver change, and containers that ask for ``nvidia.com/gpu`` then fail to start.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from typing import Any

import yaml

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 reads TOML with tomli, the same parser
    import tomli as tomllib

RUNTIME_BINARY = "nvidia-container-runtime"
_HOOK_DRIVER = re.compile(r"^--host-driver-version=(\d+(?:\.\d+)+)$")
# a driver's own libcuda (libcuda.so.570.133.20); WSL2 mounts the Windows driver store's
# libcuda.so.1.1, whose suffix is the SONAME, not a driver version
_LIBCUDA = re.compile(r"/libcuda\.so\.(\d{3,}\.\d+(?:\.\d+)?)$")
_GPU_UUID = re.compile(r"^GPU-[0-9A-Za-z-]+$")


class ConfigError(ValueError):
    """A configuration file that cannot be read as its format."""


@dataclass(frozen=True)
class CdiSpec:
    """What gpufleet reads of a CDI spec: its kind, device names, the GPU UUIDs among them,
    and the driver version it was generated for (None when it names none)."""

    kind: str
    devices: list[str]
    uuids: list[str]
    driver: str | None


def cdi_spec(text: str) -> CdiSpec:
    """A CDI spec (YAML or JSON, as ``nvidia-ctk cdi generate`` writes either)."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"not YAML or JSON: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict) or not isinstance(data.get("kind"), str):
        raise ConfigError("not a CDI spec (no kind)")
    devices = [str(d.get("name")) for d in data.get("devices") or []
               if isinstance(d, dict) and d.get("name") is not None]
    return CdiSpec(data["kind"], devices, [d for d in devices if _GPU_UUID.match(d)],
                   _spec_driver(data))


def _edits(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Every containerEdits block of a spec: the spec's own and each device's."""
    blocks = [data.get("containerEdits")]
    blocks += [d.get("containerEdits") for d in data.get("devices") or [] if isinstance(d, dict)]
    return [b for b in blocks if isinstance(b, dict)]


def _spec_driver(data: dict[str, Any]) -> str | None:
    edits = _edits(data)
    for block in edits:
        for hook in block.get("hooks") or []:
            for arg in (hook.get("args") or []) if isinstance(hook, dict) else []:
                if match := _HOOK_DRIVER.match(str(arg)):
                    return match.group(1)
    for block in edits:
        for mount in block.get("mounts") or []:
            path = str(mount.get("hostPath", "")) if isinstance(mount, dict) else ""
            if match := _LIBCUDA.search(path):
                return match.group(1)
    return None


@dataclass(frozen=True)
class EngineRuntime:
    """The NVIDIA runtime as an engine's configuration declares it: whether it is there
    (and its binary), and whether it is the engine's default runtime."""

    present: bool
    binary: str | None
    default: bool


def docker_runtime(text: str) -> EngineRuntime:
    """Docker's daemon.json: ``runtimes.nvidia.path`` and ``default-runtime``."""
    if not text.strip():
        return EngineRuntime(False, None, False)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError("not a JSON object")
    runtime = (data.get("runtimes") or {}).get("nvidia")
    binary = runtime.get("path") if isinstance(runtime, dict) else None
    return EngineRuntime(isinstance(runtime, dict), binary,
                         data.get("default-runtime") == "nvidia")


_CRI_PLUGINS = ("io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime")


def containerd_runtime(text: str) -> EngineRuntime:
    """containerd's config.toml (version 2 or 3): the ``nvidia`` runtime of the CRI plugin,
    its ``options.BinaryName``, and ``default_runtime_name``."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"not TOML: {exc}") from None
    plugins = data.get("plugins") or {}
    for name in _CRI_PLUGINS:
        section = (plugins.get(name) or {}).get("containerd") or {}
        runtime = (section.get("runtimes") or {}).get("nvidia")
        if isinstance(runtime, dict):
            binary = (runtime.get("options") or {}).get("BinaryName")
            return EngineRuntime(True, binary, section.get("default_runtime_name") == "nvidia")
    return EngineRuntime(False, None, False)

