"""Probes inside the fleet's training image (``conformance --image`` or ``container_image``):
the container each probe runs in, started by the node's engine the way the fleet's jobs
start it, and what the engine says of the image.

A container of the image gets the host's network (rendezvous and NCCL's ports are the
node's), the probe's directory at the same path, the node's GPUs through the NVIDIA runtime
(Docker's ``--gpus=all``; Podman's CDI device ``nvidia.com/gpu=all``), its RDMA devices
when it has them (``container_rdma``), the shared filesystems (``container_mounts``, by
default the ``shared_mounts`` paths) and then the fleet's own options
(``container_run_options``: ``--ipc=host``, ``--shm-size=16g`` ...). It is named after the
probe's directory, so a clean-up removes it even when the engine's client was killed.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from gpufleet.conformance.registry import Settings, setting
from gpufleet.conformance.suites.mounts import MountsSettings
from gpufleet.errors import GpufleetError, ParseError
from gpufleet.facts.catalog import NO_SMI, Fact, needs
from gpufleet.facts.gather import Facts
from gpufleet.provision.role import SAFE_PATH, RoleVars

ENGINES = ("docker", "podman")
PULL = ("missing", "never", "always")
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REFERENCE = re.compile(
    rf"^(?:[A-Za-z0-9][A-Za-z0-9.-]*(?::[0-9]+)?/)?{_COMPONENT}(?:/{_COMPONENT})*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[0-9a-f]{64})?\Z")
_OPTION = re.compile(r"^-[-A-Za-z0-9]*(?:=[^\n\x00]*)?\Z|^[^-\n\x00][^\n\x00]*\Z")
_BRAND = re.compile(r"^\s*Product Brand\s*:\s*(\S.*?)\s*$", re.MULTILINE)
S = TypeVar("S", bound=Settings)

@dataclass(frozen=True, kw_only=True)
class ContainerSettings(Settings):
    """How a probe runs in the fleet's training image (the settings of every suite whose
    probes may run in it)."""

    container_image: str | None = setting(None, "string",
                                          "the fleet's training image: probes run in it "
                                          "(conformance --image sets it for the run)")
    container_pull: str = setting("missing", "string", "the engine's --pull: missing, never "
                                                       "or always")
    container_run_options: list[str] = setting([], "list",
                                               "the engine's run options the fleet's jobs "
                                               "use (--ipc=host, --shm-size=16g ...)")
    container_mounts: list[str] | None = setting(None, "list",
                                                 "host paths bound at the same path (default: "
                                                 "the shared_mounts paths)")
    container_rdma: bool = setting(True, "boolean", "give the container the node's RDMA "
                                                    "devices")
    container_python: str = setting("python3", "string", "the image's interpreter")
    container_min_shm_gb: float = setting(1, "number", "smallest /dev/shm in the container, "
                                                       "GiB")
    container_timeout_s: float = setting(300, "number", "limit of the image stack probe")


def parse_brand(text: str) -> str:
    """The first GPU's product brand, from ``nvidia-smi -q``'s first lines."""
    match = _BRAND.search(text)
    if not match:
        raise ParseError("nvidia-smi -q printed no 'Product Brand' line")
    return match.group(1)


GPU_BRAND = Fact("gpu_brand", needs("nvidia-smi", NO_SMI) + "nvidia-smi -q | head -n 12",
                 parse_brand, "nvidia-smi")


class ImageNode(Protocol):
    """What a container's command line reads of a node: the session's ``Node``, named here so
    that this module, which the suites' settings import, does not import the session."""

    @property
    def name(self) -> str: ...

    @property
    def facts(self) -> Facts | None: ...

    def typed(self, settings: type[S]) -> S: ...

    def var(self, key: str) -> Any: ...


def image(node: ImageNode) -> str | None:
    """The image the node's probes run in, None when they run on the host."""
    return node.typed(ContainerSettings).container_image


def engine(node: ImageNode) -> str:
    """The node's engine: the container_toolkit role's ``container_engine``."""
    return str(node.var("container_engine"))


def container_name(rundir: str) -> str:
    """The container of a probe's run: named after its directory."""
    return "gpufleet-" + rundir.rstrip("/").rsplit("/", 1)[-1]


def is_reference(text: str) -> bool:
    """Whether ``text`` is an image reference as engines accept it."""
    return bool(_REFERENCE.match(text)) and len(text) <= 512


def check_reference(reference: str, where: str) -> None:
    """An image reference as engines accept it (GpufleetError naming ``where``)."""
    if not is_reference(reference):
        raise GpufleetError(f"{where} must be an image reference (registry/name:tag or "
                            f"name@sha256:digest), got {reference!r}")


def check(v: RoleVars) -> None:
    """The image variables of one host, before any host is contacted."""
    reference = v.opt_string("container_image")
    if reference is None:
        return
    if not is_reference(reference):
        raise v.fail("container_image", "an image reference (registry/name:tag or "
                     "name@sha256:digest)", reference)
    chosen = v.opt_string("container_engine")
    if chosen not in ENGINES:
        raise v.fail("container_engine", " or ".join(ENGINES) + " to run probes in "
                     "container_image", chosen)
    if v.string("container_pull") not in PULL:
        raise v.fail("container_pull", " or ".join(PULL), v.get("container_pull"))
    for option in v.items("container_run_options"):
        if not isinstance(option, str) or not _OPTION.match(option):
            raise v.fail("container_run_options", "engine run options, one per item "
                         "(--ipc=host, --shm-size=16g)", option)
    mounts = v.items("container_mounts") if "container_mounts" in v else None
    for path in mounts_of(mounts, v.get("shared_mounts")):
        if not SAFE_PATH.match(path):
            raise v.fail("container_mounts", "absolute paths of letters, digits and . _ - /",
                         path)
    python = v.string("container_python")
    if not re.match(r"^[A-Za-z0-9._/][A-Za-z0-9._/-]*\Z", python):
        raise v.fail("container_python", "an interpreter's name or path", python)
    if v.number("container_timeout_s") <= 0:
        raise v.fail("container_timeout_s", "a number above 0", v.get("container_timeout_s"))
    if v.number("container_min_shm_gb") < 0:
        raise v.fail("container_min_shm_gb", "a number of 0 or more",
                     v.get("container_min_shm_gb"))
    v.boolean("container_rdma")


def mounts_of(container_mounts: Sequence[Any] | None, shared_mounts: Any) -> list[str]:
    """The host paths bound into the container: ``container_mounts``, else the paths of
    ``shared_mounts``."""
    if container_mounts is not None:
        return [str(p) for p in container_mounts]
    return [str(e["path"]) for e in shared_mounts or []
            if isinstance(e, Mapping) and "path" in e]


def run_argv(node: ImageNode, rundir: str, command: Sequence[str],
             env: Mapping[str, str]) -> list[str]:
    """The engine's command line that runs ``command`` in a container of the node's image."""
    settings = node.typed(ContainerSettings)
    reference = settings.container_image
    if reference is None:
        raise GpufleetError(f"{node.name}: no container_image to run probes in")
    chosen = engine(node)
    argv = [chosen, "run", "--rm", f"--name={container_name(rundir)}", "--network=host",
            f"--pull={settings.container_pull}", f"--volume={rundir}:{rundir}",
            f"--workdir={rundir}"]
    if node.facts is not None and node.facts.get("gpus"):
        argv.append("--gpus=all" if chosen == "docker" else "--device=nvidia.com/gpu=all")
    if settings.container_rdma and node.facts is not None and node.facts.get("rdma"):
        argv += ["--device=/dev/infiniband", "--cap-add=IPC_LOCK", "--ulimit=memlock=-1:-1"]
    shared = node.typed(MountsSettings).shared_mounts
    argv += [f"--volume={p}:{p}" for p in mounts_of(settings.container_mounts, shared)]
    argv += [str(o) for o in settings.container_run_options]
    argv += [f"--env={k}={v}" for k, v in env.items()]
    return [*argv, reference, *command]


def removal(node: ImageNode, rundir: str) -> str:
    """The shell command that removes the run's container (nothing when there is none)."""
    return (f"{shlex.quote(engine(node))} rm -f {shlex.quote(container_name(rundir))} "
            ">/dev/null 2>&1")


@dataclass(frozen=True)
class ImageInfo:
    """What the node's engine says of the image: its ID (the digest of its configuration,
    the same on every node that holds the same image), the registry digests it was pulled
    by, its environment and labels."""

    reference: str
    id: str
    repo_digests: list[str]
    env: dict[str, str]
    labels: dict[str, str]


def inspect_command(node: ImageNode) -> str:
    reference = image(node) or ""
    return (f"{shlex.quote(engine(node))} image inspect --format '{{{{json .}}}}' "
            f"{shlex.quote(reference)}")


def parse_inspect(reference: str, text: str) -> ImageInfo:
    """``docker|podman image inspect --format '{{json .}}'``: one JSON object."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"image inspect printed no JSON ({exc.msg})") from None
    if isinstance(data, list) and len(data) == 1:
        data = data[0]
    if not isinstance(data, dict) or not isinstance(data.get("Id"), str):
        raise ValueError("image inspect printed no image")
    config: dict[str, Any] = data["Config"] if isinstance(data.get("Config"), dict) else {}
    env = {}
    for item in config.get("Env") or []:
        key, _, value = str(item).partition("=")
        env[key] = value
    labels = config.get("Labels") or data.get("Labels") or {}
    ident = data["Id"] if data["Id"].startswith("sha256:") else f"sha256:{data['Id']}"
    return ImageInfo(reference, ident, [str(d) for d in data.get("RepoDigests") or []], env,
                     {str(k): str(v) for k, v in labels.items()})
