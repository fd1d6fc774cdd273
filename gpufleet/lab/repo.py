"""A local apt repository of stand-in packages under the real NVIDIA names and versions.

The stand-ins install no driver, toolkit or library: they carry the real package
name, version string and dependency shape, so pinning, holding, upgrading and
downgrading run real apt and dpkg on the lab nodes.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from gpufleet import localcmd

REPO_FORMAT = 3  # bump when the set or the content of the stand-ins changes


@dataclass(frozen=True)
class Standin:
    """One stand-in package version and the files it installs."""

    name: str
    version: str
    summary: str
    files: dict[str, str] = field(default_factory=dict)
    depends: str = ""
    provides: str = ""
    conflicts: str = ""


def _driver(name: str, version: str) -> Standin:
    upstream = version.split("-", maxsplit=1)[0]
    return Standin(
        name,
        version,
        f"NVIDIA driver {upstream} metapackage",
        files={f"/usr/share/doc/{name}/gpufleet-lab-driver-version": upstream + "\n"},
        provides="nvidia-driver-binary",
        conflicts="nvidia-driver-binary",
    )


def _cuda(name: str, version: str) -> Standin:
    upstream = version.split("-", maxsplit=1)[0]
    major_minor = ".".join(upstream.split(".")[:2])
    version_json = json.dumps({"cuda": {"name": "CUDA SDK", "version": upstream}}, indent=3)
    return Standin(
        name,
        version,
        f"CUDA Toolkit {major_minor} metapackage",
        files={f"/usr/local/cuda-{major_minor}/version.json": version_json + "\n"},
    )


def _nccl(version: str) -> list[Standin]:
    major, minor, patch = version.split("-", maxsplit=1)[0].split(".")
    header = (
        f"#define NCCL_MAJOR {major}\n#define NCCL_MINOR {minor}\n#define NCCL_PATCH {patch}\n"
        f'#define NCCL_SUFFIX ""\n'
    )
    return [
        Standin(
            "libnccl2",
            version,
            "NVIDIA Collective Communication Library (NCCL) Runtime",
            files={"/usr/share/doc/libnccl2/gpufleet-lab-nccl-version": version + "\n"},
        ),
        Standin(
            "libnccl-dev",
            version,
            "NVIDIA Collective Communication Library (NCCL) Development Files",
            files={"/usr/include/nccl.h": header},
            depends=f"libnccl2 (= {version})",
        ),
    ]


STANDINS: list[Standin] = [
    _driver("nvidia-driver-550", "550.127.05-0ubuntu1"),
    _driver("nvidia-driver-550", "550.144.03-0ubuntu1"),
    _driver("nvidia-driver-565", "565.57.01-0ubuntu1"),
    _driver("cuda-drivers-550", "550.127.05-1"),
    _driver("cuda-drivers-565", "565.57.01-1"),
    _cuda("cuda-toolkit-12-4", "12.4.1-1"),
    _cuda("cuda-toolkit-12-6", "12.6.2-1"),
    _cuda("cuda-toolkit-12-6", "12.6.3-1"),
    *_nccl("2.21.5-1+cuda12.4"),
    *_nccl("2.23.4-1+cuda12.6"),
]


def _control(pkg: Standin, arch: str) -> str:
    lines = [
        f"Package: {pkg.name}",
        f"Version: {pkg.version}",
        f"Architecture: {arch}",
        "Maintainer: gpufleet lab <lab@gpufleet.invalid>",
        "Section: misc",
        "Priority: optional",
    ]
    lines += [f"{k}: {v}" for k, v in
              (("Depends", pkg.depends), ("Provides", pkg.provides), ("Conflicts", pkg.conflicts))
              if v]
    lines.append(f"Description: {pkg.summary} (gpufleet lab stand-in)")
    lines.append(" A stand-in built by the gpufleet lab under the real package name and")
    lines.append(" version. It installs no driver, toolkit or library.")
    return "\n".join(lines) + "\n"


def build_repo(repo: Path) -> Path:
    """Build (or keep, when current) the flat apt repository in ``repo``; return it."""
    stamp = repo / ".gpufleet-repo-format"
    if stamp.is_file() and stamp.read_text().strip() == str(REPO_FORMAT):
        return repo
    repo.mkdir(parents=True, exist_ok=True)
    for old in repo.glob("*.deb"):
        old.unlink()
    arch = localcmd.run(["dpkg", "--print-architecture"]).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="gpufleet-repo-") as tmp:
        for pkg in STANDINS:
            root = Path(tmp) / f"{pkg.name}_{pkg.version}"
            (root / "DEBIAN").mkdir(parents=True)
            (root / "DEBIAN" / "control").write_text(_control(pkg, arch))
            for path, content in pkg.files.items():
                target = root / path.lstrip("/")
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(content)
            deb = repo / f"{pkg.name}_{pkg.version.replace(':', '%3a')}_{arch}.deb"
            localcmd.run(["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(root),
                          str(deb)])
    index = localcmd.run(["dpkg-scanpackages", "--multiversion", "."], cwd=repo)
    (repo / "Packages").write_text(index.stdout)
    stamp.write_text(f"{REPO_FORMAT}\n")
    return repo

