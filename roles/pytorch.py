"""PyTorch at an exact version in a virtual environment, verified by what torch reports."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from gpufleet.errors import GpufleetError
from gpufleet.facts.catalog import TORCH_PROBE
from gpufleet.facts.gather import FactRequest, Facts
from gpufleet.facts.parsers import cuda
from gpufleet.inventory.secrets import redact
from gpufleet.provision.plan import ApplyContext, Change, Run
from gpufleet.provision.role import PlanContext, RoleBase, RoleVars, Var

CPU_BUILD = ("none", "cpu")
_VERSION = re.compile(r"[0-9][0-9A-Za-z.!]*(?:\+[0-9A-Za-z.]+)?\Z")  # PEP 440, local label
_RELEASE = re.compile(r"[0-9]+(?:\.[0-9]+)+\Z")
_PYTHON = re.compile(r"[A-Za-z0-9._/][A-Za-z0-9._/-]*\Z")
_SOURCE = re.compile(r"[^\x00-\x20\x7f-][^\x00-\x1f\x7f]*\Z")  # one line, not an option
_SOURCES = ("pytorch_index_url", "pytorch_extra_index_url", "pytorch_find_links",
            "pytorch_constraints")
# Package sources may carry credentials (https://user:token@host/...): they reach pip as
# environment variables read from stdin, never on its command line (visible in ps).
SOURCE_ENV = {"--index-url": "PIP_INDEX_URL", "--extra-index-url": "PIP_EXTRA_INDEX_URL",
              "--find-links": "PIP_FIND_LINKS"}


def version_matches(reported: str | None, wanted: str) -> bool:
    """torch's ``2.13.0+cpu`` matches ``2.13.0``; a wanted local label must match exactly."""
    if reported is None:
        return False
    return reported == wanted if "+" in wanted else reported.split("+")[0] == wanted


def cuda_matches(reported: str | None, wanted: str | None) -> bool:
    """Compare ``torch.version.cuda`` with the inventory; ``none`` means a CPU build."""
    if wanted is None:
        return True
    if wanted.lower() in CPU_BUILD:
        return reported is None
    return reported == wanted


@dataclass(eq=False)
class PipInstall:
    """pip-install torch into the venv, then verify what torch reports."""

    python: str
    args: list[str] = field(repr=False)  # may hold package source credentials
    version: str
    cuda: str | None
    nccl: str | None
    timeout: float

    def describe(self) -> str:
        return f"pip install torch=={self.version}"

    def command(self) -> tuple[str, bytes]:
        """The shell command and the stdin it reads its package sources from."""
        args, sources = pip_sources(self.args)
        pip = shlex.join([self.python, "-m", "pip", "install", "--no-input",
                          "--disable-pip-version-check", "--no-compile", *args])
        reads = [f"IFS= read -r {name} && export {name}" for name in sources]
        stdin = "".join(f"{value}\n" for value in sources.values()).encode()
        return " && ".join([*reads, f"exec {pip}"]), stdin

    def apply(self, ctx: ApplyContext) -> None:
        command, stdin = self.command()
        result = ctx.conn.run(command, timeout=self.timeout, stdin=stdin or None)
        if not result.ok:
            tail = redact(result.stderr or result.stdout).strip().splitlines()[-3:]
            raise GpufleetError(f"pip install torch=={self.version} failed: {' | '.join(tail)}")
        probe = ctx.conn.run(shlex.join([self.python, "-c", TORCH_PROBE]), timeout=300)
        info = cuda.torch_info(probe.stdout if probe.ok else probe.stderr)
        problems = verify(info, self.version, self.cuda, self.nccl)
        if problems:
            raise GpufleetError("after install, " + "; ".join(problems))


def pip_sources(args: list[str]) -> tuple[list[str], dict[str, str]]:
    """pip arguments without the package sources, and the sources as pip's environment
    variables (a local --find-links directory stays an argument)."""
    kept: list[str] = []
    sources: dict[str, str] = {}
    items = iter(args)
    for arg in items:
        name = SOURCE_ENV.get(arg)
        if name is None:
            kept.append(arg)
            continue
        value = next(items)
        if arg == "--find-links" and "://" not in value:
            kept += [arg, value]
        else:
            sources[name] = value
    return kept, sources


def verify(info: dict[str, Any], version: str, cuda: str | None, nccl: str | None) -> list[str]:
    """What differs between torch's report and the inventory (empty when all agree)."""
    problems = []
    if not version_matches(info.get("torch"), version):
        problems.append(f"torch reports version {info.get('torch')}, inventory wants {version}")
    if not cuda_matches(info.get("cuda"), cuda):
        problems.append(f"torch reports CUDA {info.get('cuda')}, inventory wants {cuda}")
    if nccl and info.get("nccl") != nccl:
        problems.append(f"torch bundles NCCL {info.get('nccl')}, inventory wants {nccl}")
    return problems


class PytorchRole(RoleBase):
    name = "pytorch"
    order = 60
    variables: ClassVar[Mapping[str, Var]] = {
        "pytorch_version": Var(None, "string", "torch version, e.g. 2.11.0"),
        "pytorch_venv": Var("/opt/gpufleet/venv", "string", "the virtual environment"),
        "pytorch_python": Var("python3", "string", "the interpreter that creates the venv"),
        "pytorch_index_url": Var(None, "string", "pip --index-url"),
        "pytorch_extra_index_url": Var(None, "string", "pip --extra-index-url"),
        "pytorch_find_links": Var(None, "string", "pip --find-links"),
        "pytorch_no_index": Var(False, "boolean", "pip --no-index"),
        "pytorch_constraints": Var(None, "string", "pip --constraint"),
        "pytorch_cuda": Var(None, "string", "torch.version.cuda wanted (none: a CPU build)"),
        "pytorch_nccl": Var(None, "string", "the NCCL torch bundles"),
        "pytorch_pip_timeout": Var(3600, "integer", "seconds pip may take"),
    }
    shared_keys = ("python", "torch", "torch_cuda", "torch_nccl")

    def active(self, v: RoleVars) -> bool:
        return "pytorch_version" in v

    def check(self, v: RoleVars) -> None:
        super().check(v)
        if "pytorch_venv" in v.host.vars or self.active(v):
            v.path("pytorch_venv", "the venv's interpreter runs in commands")
        if not self.active(v):
            return
        if not _VERSION.match(v.string("pytorch_version")):
            raise v.fail("pytorch_version", "a torch version (2.13.0, 2.13.0+cu126)",
                         v.get("pytorch_version"))
        if not _PYTHON.match(v.string("pytorch_python")):
            raise v.fail("pytorch_python", "an interpreter's name or path",
                         v.get("pytorch_python"))
        cuda = v.opt_string("pytorch_cuda")
        if cuda is not None and cuda.lower() not in CPU_BUILD and not _RELEASE.match(cuda):
            raise v.fail("pytorch_cuda", "a CUDA version (12.6), none or cpu", cuda)
        nccl = v.opt_string("pytorch_nccl")
        if nccl is not None and not _RELEASE.match(nccl):
            raise v.fail("pytorch_nccl", "an NCCL version (2.27.5)", nccl)
        for key in _SOURCES:
            value = v.opt_string(key)
            if value is not None and not _SOURCE.match(value):
                raise v.fail(key, "one URL or path: on one line, not starting with - or a "
                             "space", value)
        if v.integer("pytorch_pip_timeout") <= 0:
            raise v.fail("pytorch_pip_timeout", "seconds above 0", v.get("pytorch_pip_timeout"))
        v.boolean("pytorch_no_index")

    def venv_python(self, v: RoleVars) -> str:
        return v.string("pytorch_venv").rstrip("/") + "/bin/python"

    def training_python(self, v: RoleVars) -> str:
        """The interpreter that trains on the host: the venv this role manages (its default
        path when only ``pytorch_version`` is set), else python3."""
        if self.active(v) or "pytorch_venv" in v.host.vars:
            return self.venv_python(v)
        return "python3"

    def provides(self, v: RoleVars) -> dict[str, str]:
        return {"training_python": self.training_python(v)}

    def shared_request(self, v: RoleVars) -> FactRequest:
        return FactRequest(pythons=frozenset({self.training_python(v)}))

    def shared(self, facts: Facts, v: RoleVars) -> dict[str, str | None]:
        torch = facts.torch(self.training_python(v)) or {}
        return {"python": torch.get("python"), "torch": torch.get("torch"),
                "torch_cuda": torch.get("cuda"), "torch_nccl": torch.get("nccl")}

    def request(self, v: RoleVars) -> FactRequest:
        return FactRequest(pythons=frozenset({self.venv_python(v)}))

    def _pip_args(self, v: RoleVars, version: str, force: bool) -> list[str]:
        args = []
        for key, flag in zip(_SOURCES, ("--index-url", "--extra-index-url", "--find-links",
                                        "--constraint"), strict=True):
            value = v.opt_string(key)
            if value:
                args += [flag, value]
        if v.boolean("pytorch_no_index"):
            args.append("--no-index")
        if force:
            args.append("--force-reinstall")
        return [*args, f"torch=={version}"]

    def plan(self, facts: Facts, v: RoleVars, ctx: PlanContext) -> list[Change]:
        version = v.string("pytorch_version")
        cuda, nccl = v.opt_string("pytorch_cuda"), v.opt_string("pytorch_nccl")
        python = self.venv_python(v)
        info = facts.torch(python)
        changes: list[Change] = []
        reason = facts.why_absent(f"torch:{python}")
        if info is None and reason.startswith("no python at"):
            venv = v.string("pytorch_venv")
            command = shlex.join([v.string("pytorch_python"), "-m", "venv", venv])
            changes.append(Change(self.name, f"venv {venv}", "create", "absent",
                                  v.string("pytorch_python"),
                                  [Run(command, f"create venv {venv}")]))
        force = info is not None and version_matches(info.get("torch"), version)
        problems = verify(info, version, cuda, nccl) if info else [f"torch absent: {reason}"]
        if problems:
            install = PipInstall(python, self._pip_args(v, version, force), version, cuda, nccl,
                                 float(v.integer("pytorch_pip_timeout")))
            before = _describe(info) if info else "not installed"
            changes.append(Change(self.name, "torch", "reinstall" if force else "install",
                                  before, _describe({"torch": version, "cuda": cuda,
                                                     "nccl": nccl}), [install]))
        return changes


def _describe(info: dict[str, Any]) -> str:
    shown = {k: info.get(k) for k in ("torch", "cuda", "nccl") if info.get(k) is not None}
    return json.dumps(shown, sort_keys=False).replace('"', "")


ROLE = PytorchRole()
