"""Stand-in packages: what a role installs, under the real package names, versions and
dependencies, built by the lab into a local apt repository (gpufleet/lab/repo.py).

A stand-in installs no driver, toolkit or library; it carries the real name, version
string and dependency shape, and small files (a version file, an ``nvcc`` that prints the
real version line) where gpufleet's facts read them, so pinning, holding, upgrading and
downgrading run real apt and dpkg, and a wrong plan fails as it would on a real node.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Standin:
    """One stand-in package version and the files it installs (``mode`` 0o755 for
    ``executables``); ``postinst`` is the maintainer script run when it is configured."""

    name: str
    version: str
    summary: str
    files: dict[str, str] = field(default_factory=dict)
    depends: str = ""
    provides: str = ""
    conflicts: str = ""
    executables: frozenset[str] = frozenset()
    postinst: str = ""
