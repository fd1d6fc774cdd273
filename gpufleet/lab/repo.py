"""A local apt repository of stand-in packages under the real NVIDIA names and versions.

The stand-ins (declared by each role, gpufleet/standins.py) install no driver, toolkit or
library: they carry the real package name, version string and dependency shape, so
pinning, holding, upgrading and downgrading run real apt and dpkg on the lab nodes.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from pathlib import Path

from gpufleet.lab import localcmd
from gpufleet.provision.standins import Standin

REPO_FORMAT = 4  # bump when the set or the content of the stand-ins changes
KEYRING = "cuda-archive-keyring.gpg"


def standins() -> list[Standin]:
    """Every role's stand-in packages (the roles declare them, see gpufleet/standins.py)."""
    from gpufleet import roles  # noqa: PLC0415 - the role registry imports the engine, which this module is part of

    unique: dict[tuple[str, str], Standin] = {}
    for role in roles.ALL:
        for pkg in role.standins():
            seen = unique.setdefault((pkg.name, pkg.version), pkg)
            if seen != pkg:
                raise ValueError(f"two different stand-ins {pkg.name}={pkg.version}")
    return list(unique.values())


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


def repo_path(os_release: dict[str, str], machine: str) -> str:
    """NVIDIA's path of the CUDA repository for an OS: compute/cuda/repos/debian12/x86_64."""
    distro = os_release.get("ID", "debian") + os_release.get("VERSION_ID", "").replace(".", "")
    return f"compute/cuda/repos/{distro}/{'sbsa' if machine == 'aarch64' else machine}"


def repo_dir(root: Path) -> Path:
    """Where the repository lies under ``root`` for this machine's OS and architecture."""
    return root / repo_path(_os_release(), os.uname().machine)


def build_repo(root: Path) -> Path:
    """Build (or keep, when current) the stand-in of NVIDIA's CUDA repository under ``root``,
    at NVIDIA's layout (``root/compute/cuda/repos/<distro>/<arch>/``, a flat repository),
    its Release file labelled as NVIDIA's (Origin NVIDIA, Label NVIDIA CUDA) and signed
    with the lab's own key, exported as ``root/cuda-archive-keyring.gpg``. Returns the
    repository's directory."""
    repo = repo_dir(root)
    packages = standins()
    stamp, current = root / ".gpufleet-repo-format", _stamp(packages)
    if stamp.is_file() and stamp.read_text().strip() == current and repo.is_dir():
        return repo
    repo.mkdir(parents=True, exist_ok=True)
    for old in [*root.glob("*.deb"), *repo.glob("*.deb")]:
        old.unlink()
    arch = localcmd.run(["dpkg", "--print-architecture"]).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="gpufleet-repo-") as tmp:
        for pkg in packages:
            _build_deb(pkg, arch, Path(tmp), repo)
    index = localcmd.run(["dpkg-scanpackages", "--multiversion", "."], cwd=repo)
    (repo / "Packages").write_text(index.stdout)
    _sign(root, repo, arch)
    stamp.write_text(current + "\n")
    return repo


def _stamp(packages: list[Standin]) -> str:
    """The repository's format and a digest of every stand-in: any change rebuilds it."""
    described = [dict(vars(p), executables=sorted(p.executables))
                 for p in sorted(packages, key=lambda p: (p.name, p.version))]
    digest = hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()[:16]
    return f"{REPO_FORMAT}-{digest}"


def _build_deb(pkg: Standin, arch: str, tmp: Path, repo: Path) -> None:
    build = tmp / f"{pkg.name}_{pkg.version}"
    (build / "DEBIAN").mkdir(parents=True)
    (build / "DEBIAN" / "control").write_text(_control(pkg, arch))
    if pkg.postinst:
        script = build / "DEBIAN" / "postinst"
        script.write_text("#!/bin/sh\n" + pkg.postinst)
        script.chmod(0o755)
    for path, content in pkg.files.items():
        target = build / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
        target.chmod(0o755 if path in pkg.executables else 0o644)
    deb = repo / f"{pkg.name}_{pkg.version.replace(':', '%3a')}_{arch}.deb"
    localcmd.run(["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(build),
                  str(deb)])


def _sign(root: Path, repo: Path, arch: str) -> None:
    """Release and InRelease as NVIDIA's repository has them, signed by the lab's key."""
    home = root / "gnupg"
    if not (home / "pubring.kbx").exists():
        home.mkdir(mode=0o700, parents=True, exist_ok=True)
        localcmd.run(["gpg", "--homedir", str(home), "--batch", "--passphrase", "",
                      "--quick-gen-key", "gpufleet lab stand-in for NVIDIA's CUDA repository",
                      "ed25519", "sign", "never"], timeout=120)
    packages = (repo / "Packages").read_bytes()
    size = len(packages)
    release = "\n".join([
        "Origin: NVIDIA", "Label: NVIDIA CUDA", f"Architectures: {arch}",
        "Date: " + time.strftime("%a, %d %b %Y %H:%M:%S UTC", time.gmtime()),
        "MD5Sum:", f" {hashlib.md5(packages).hexdigest()} {size} Packages",  # noqa: S324 - apt's own field
        "SHA256:", f" {hashlib.sha256(packages).hexdigest()} {size} Packages", ""])
    (repo / "Release").write_text(release)
    (repo / "InRelease").unlink(missing_ok=True)
    localcmd.run(["gpg", "--homedir", str(home), "--batch", "--yes", "--clearsign",
                  "--output", str(repo / "InRelease"), str(repo / "Release")], timeout=120)
    localcmd.run(["gpg", "--homedir", str(home), "--batch", "--yes", "--output",
                  str(root / KEYRING), "--export"], timeout=60)
    localcmd.run(["gpgconf", "--homedir", str(home), "--kill", "gpg-agent"], check=False)


def _os_release() -> dict[str, str]:
    values: dict[str, str] = {}
    for line in Path("/etc/os-release").read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key] = value.strip().strip('"')
    return values
