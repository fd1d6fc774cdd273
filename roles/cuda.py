"""CUDA toolkit by release, as NVIDIA ships it: metapackages at the release version,
components at their own, and /usr/local/cuda pointing at the toolkit.

``cuda_version`` is the release (``13.0.2``; ``13.0`` where the repositories hold one 13.0
release). NVIDIA's metapackages (``cuda-toolkit-13-0``, ``cuda-compiler-13-0`` ...) carry
the release version (``13.0.2-1``); each component carries its own (``cuda-nvcc-13-0``
``13.0.88-1``, ``cuda-cudart-13-0`` ``13.0.96-1``), and nvcc reports its own (``release
13.0, V13.0.88``). The role pins the metapackages and checks that nvcc belongs to the
release (:data:`NVCC_OF_RELEASE`; ``cuda_nvcc_version`` for a release not listed).
``cuda_install: preinstalled`` manages no package and no link, and only verifies nvcc.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from typing import ClassVar

from gpufleet.errors import VarError
from gpufleet.facts.gather import FactRequest, Facts
from gpufleet.facts.parsers import packages
from gpufleet.provision import apt
from gpufleet.provision.managed import link_change
from gpufleet.provision.plan import Change, Fail, Run
from gpufleet.provision.role import SAFE_PATH, PlanContext, RoleBase, RoleVars, Var
from gpufleet.provision.standins import Standin

ALTERNATIVES_LINK = "/etc/alternatives/cuda"
_RELEASE = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+))?\Z")

# The nvcc each CUDA release ships (NVIDIA's "CUDA Toolkit Major Component Versions" table
# of each release's notes). Updates may keep a component: 13.0.1 and 13.0.2 share nvcc.
_NVCC = re.compile(r"[0-9]+(?:\.[0-9]+)+\Z")
NVCC_OF_RELEASE = {
    "11.8.0": "11.8.89", "12.1.1": "12.1.105", "12.2.2": "12.2.140", "12.3.2": "12.3.107",
    "12.4.0": "12.4.99", "12.4.1": "12.4.131", "12.5.0": "12.5.40", "12.5.1": "12.5.82",
    "12.6.0": "12.6.20", "12.6.1": "12.6.68", "12.6.2": "12.6.77", "12.6.3": "12.6.85",
    "12.8.0": "12.8.61", "12.8.1": "12.8.93", "12.9.0": "12.9.41", "12.9.1": "12.9.86",
    "13.0.0": "13.0.48", "13.0.1": "13.0.88", "13.0.2": "13.0.88", "13.1.0": "13.1.80",
    "13.2.0": "13.2.51", "13.2.1": "13.2.78",
}


def major_minor(version: str, host: str, key: str) -> tuple[str, str]:
    """("12", "4") from "12.4.1" or "12.4"; VarError otherwise."""
    match = _RELEASE.match(version)
    if not match:
        raise VarError(f"host {host}: {key} must be a CUDA release like 13.0.2 (or 13.0), "
                       f"got {version!r}")
    return match.group(1), match.group(2)


class CudaRole(RoleBase):
    name = "cuda"
    order = 30
    variables: ClassVar[Mapping[str, Var]] = {
        "cuda_version": Var(None, "string", "CUDA release: 13.0.2, or 13.0 where unambiguous"),
        "cuda_install": Var("apt", "string", "apt (pin the metapackages) or preinstalled"),
        "cuda_packages": Var(["cuda-toolkit-{major}-{minor}"], "list",
                             "metapackages pinned at the release version"),
        "cuda_package_version": Var("{release}-1", "string", "their version template"),
        "cuda_nvcc_version": Var(None, "string", "nvcc version of the release (default from "
                                                 "the table of releases)"),
        "cuda_home": Var("/usr/local/cuda-{major}.{minor}", "string", "the toolkit's home"),
        "cuda_link": Var("/usr/local/cuda", "string", "the link pointing at it"),
    }
    shared_keys = ("cuda", "cuda_nvcc")

    def active(self, v: RoleVars) -> bool:
        return "cuda_version" in v

    def check(self, v: RoleVars) -> None:
        super().check(v)
        if self.active(v):
            self._fields(v)
            self._mode(v)
            self.home(v)
            v.path("cuda_link", "the link's path in a command")
            nvcc = v.opt_string("cuda_nvcc_version")
            if nvcc is not None and not _NVCC.match(nvcc):
                raise v.fail("cuda_nvcc_version", "an nvcc version like 12.4.131", nvcc)

    def home(self, v: RoleVars) -> str:
        """The toolkit's home, its {major} and {minor} filled in: an absolute path."""
        try:
            home = v.string("cuda_home").format(**self._fields(v))
        except (KeyError, IndexError, ValueError, AttributeError) as exc:
            raise v.fail("cuda_home", "a path with no placeholder but {major} and {minor} "
                         f"({type(exc).__name__}: {exc})", v.get("cuda_home")) from None
        if not SAFE_PATH.match(home):
            raise v.fail("cuda_home", "an absolute path of letters, digits and . _ - /",
                         v.get("cuda_home"))
        return home

    def _mode(self, v: RoleVars) -> str:
        mode = v.string("cuda_install")
        if mode not in ("apt", "preinstalled"):
            raise v.fail("cuda_install", "apt or preinstalled", mode)
        return mode

    def _fields(self, v: RoleVars) -> dict[str, str]:
        version = v.string("cuda_version")
        major, minor = major_minor(version, v.host.name, "cuda_version")
        release = version if version.count(".") == 2 else f"{major}.{minor}.*"
        return {"version": version, "release": release, "major": major, "minor": minor}

    def wanted(self, v: RoleVars) -> dict[str, str]:
        """Metapackage -> version (a pattern for a release given as major.minor)."""
        return apt.templated(v, v.items("cuda_packages"), "cuda_package_version",
                             self._fields(v), "cuda_packages")

    def managed_files(self, v: RoleVars) -> dict[str, str]:
        return {"apt pin": apt.pin_path(self.name)}

    def request(self, v: RoleVars) -> FactRequest:
        return FactRequest(packages=frozenset(self.wanted(v)),
                           files=frozenset({apt.pin_path(self.name)}),
                           links=frozenset({v.string("cuda_link"), ALTERNATIVES_LINK}))

    def plan(self, facts: Facts, v: RoleVars, ctx: PlanContext) -> list[Change]:
        changes: list[Change] = []
        if self._mode(v) == "apt":
            changes = apt.pinned_packages(self.name, facts, self.wanted(v))
            link = self._link_change(facts, v)
            changes += [link] if link else []
        if not changes:
            changes += self._component_changes(facts, v)
        return changes

    def release_installed(self, facts: Facts, v: RoleVars) -> str | None:
        """The release the installed metapackages carry (``13.0.2``), when they agree."""
        versions = set()
        for name in self.wanted(v):
            record = facts.package(name)
            if record is not None:
                versions.add(packages.nvidia_version_from_package(record["version"]))
        return versions.pop() if len(versions) == 1 else None

    def _component_changes(self, facts: Facts, v: RoleVars) -> list[Change]:
        """nvcc (and version.json, where the toolkit has one) must belong to the release."""
        f = self._fields(v)
        release = self.release_installed(facts, v) if "*" in f["release"] else f["release"]
        found = facts.get("nvcc")
        expected = v.opt_string("cuda_nvcc_version") or NVCC_OF_RELEASE.get(release or "")
        changes: list[Change] = []
        problem = None
        line = f"{f['major']}.{f['minor']}."
        if found is None:
            problem = f"no nvcc: {facts.why_absent('nvcc')}"
        elif found != expected if expected else not found.startswith(line):
            problem = f"nvcc {found}"
        if problem is not None:
            want = f"nvcc {expected or f['major'] + '.' + f['minor'] + '.x'} of CUDA " \
                   f"{release or f['version']}"
            changes.append(Change(self.name, "component nvcc", "verify", problem, want,
                                  [Fail(f"CUDA {release or f['version']} wants {want}, the "
                                        f"host has {problem} (check cuda_link and "
                                        "cuda_packages, or set cuda_nvcc_version)")],
                                  kind="cuda"))
        json_release = facts.get("cuda_version_json")
        if json_release is not None and release is not None and json_release != release:
            changes.append(Change(self.name, "component version.json", "verify",
                                  f"version.json {json_release}", f"CUDA {release}",
                                  [Fail(f"/usr/local/cuda/version.json says CUDA "
                                        f"{json_release}, the inventory wants {release}")],
                                  kind="cuda"))
        return changes

    def _link_change(self, facts: Facts, v: RoleVars) -> Change | None:
        home = self.home(v)
        link = v.string("cuda_link")
        if facts.link(link) == ALTERNATIVES_LINK:
            current = facts.link(ALTERNATIVES_LINK)
            if current == home:
                return None
            return Change(self.name, f"alternative cuda ({link})", "set", current or "absent",
                          home, [Run(f"update-alternatives --set cuda {shlex.quote(home)}",
                                     f"update-alternatives --set cuda {home}")], kind="link")
        return link_change(self.name, facts, link, home)

    def shared(self, facts: Facts, v: RoleVars) -> dict[str, str | None]:
        release = facts.get("cuda_version_json")
        if release is None and self.active(v):
            release = self.release_installed(facts, v)
        return {"cuda": release or facts.get("nvcc"), "cuda_nvcc": facts.get("nvcc")}

    def standins(self) -> list[Standin]:
        return [pkg for release, components in STANDIN_RELEASES.items()
                for pkg in cuda_standins(release, components)]


# Releases the lab's repository serves, with the component versions of each (from each
# release's component table; the real 13.0.2 node in ../shared/samples/real-node).
STANDIN_RELEASES = {
    "12.4.1": {"nvcc": "12.4.131", "cudart": "12.4.127"},
    "12.6.2": {"nvcc": "12.6.77", "cudart": "12.6.77"},
    "12.6.3": {"nvcc": "12.6.85", "cudart": "12.6.77"},
    "13.0.2": {"nvcc": "13.0.88", "cudart": "13.0.96"},
}


def nvcc_output(nvcc: str) -> str:
    """What nvcc --version prints (the line gpufleet reads, as NVIDIA's nvcc prints it)."""
    major, minor, _ = nvcc.split(".")
    return ("nvcc: NVIDIA (R) Cuda compiler driver\n"
            "Copyright (c) 2005-2025 NVIDIA Corporation\n"
            f"Cuda compilation tools, release {major}.{minor}, V{nvcc}\n"
            f"Build cuda_{major}.{minor}.r{major}.{minor}/compiler.0_0\n")


def cuda_standins(release: str, components: dict[str, str]) -> list[Standin]:
    """A release's metapackages (at the release version) and components (at theirs), with
    NVIDIA's dependency shape: toolkit -> compiler/libraries -> nvcc/cudart."""
    major, minor, _ = release.split(".")
    tag, home = f"{major}-{minor}", f"/usr/local/cuda-{major}.{minor}"
    meta, nvcc, cudart = f"{release}-1", f"{components['nvcc']}-1", f"{components['cudart']}-1"
    script = "#!/bin/sh\ncat <<'EOF'\n" + nvcc_output(components["nvcc"]) + "EOF\n"
    return [
        Standin(f"cuda-nvcc-{tag}", nvcc, f"CUDA nvcc {components['nvcc']}",
                files={f"{home}/bin/nvcc": script}, executables=frozenset({f"{home}/bin/nvcc"})),
        Standin(f"cuda-cudart-{tag}", cudart, f"CUDA Runtime {components['cudart']}",
                files={f"/usr/share/doc/cuda-cudart-{tag}/version": components["cudart"] + "\n"}),
        Standin(f"cuda-compiler-{tag}", meta, f"CUDA compiler {major}.{minor} metapackage",
                depends=f"cuda-nvcc-{tag} (>= {components['nvcc']})"),
        Standin(f"cuda-libraries-{tag}", meta, f"CUDA Libraries {major}.{minor} metapackage",
                depends=f"cuda-cudart-{tag} (>= {components['cudart']})"),
        Standin(f"cuda-toolkit-{tag}", meta, f"CUDA Toolkit {major}.{minor} metapackage",
                depends=f"cuda-compiler-{tag} (>= {release}), "
                        f"cuda-libraries-{tag} (>= {release})"),
    ]


ROLE = CudaRole()
