"""Installed and offered packages: ``dpkg-query -W``, ``apt-mark showhold``, ``apt-cache
madison``, Debian package versions and ``ofed_info -s``."""

from __future__ import annotations

import re
from typing import Any

from gpufleet.facts.parsers._capture import _error, _output_lines

_PACKAGE_VERSION = re.compile(r"^(?:\d+:)?(\d+(?:\.\d+)+)(?:[-~+].*)?$")


def nvidia_version_from_package(version: str) -> str:
    """Return the upstream version of a package version: "1:550.54.15-1" -> "550.54.15"."""
    if match := _PACKAGE_VERSION.match(version.strip()):
        return match.group(1)
    raise _error("package version", "[EPOCH:]X.Y[.Z][-REVISION]", version)


_NO_PACKAGE = "dpkg-query: no packages found matching"
_PACKAGE_NAME = re.compile(r"^[a-z0-9][a-z0-9+.\-]*(?::[a-z0-9\-]+)?$")


def dpkg_query(text: str) -> dict[str, dict[str, Any]]:
    """Parse ``dpkg-query -W -f='${Package}\\t${Version}\\t${Status}\\n'``.

    Returns package -> ``version`` (None when empty), ``status``, ``installed`` (state
    word is "installed") and ``hold`` (selection is "hold"). The "no packages found
    matching" notices dpkg-query prints for unknown names are skipped.
    """
    packages: dict[str, dict[str, Any]] = {}
    for line in _output_lines(text):
        if line.startswith(_NO_PACKAGE):
            continue
        fields = line.split("\t")
        status = fields[2].split() if len(fields) == 3 else []
        if len(status) != 3 or not fields[0]:
            raise _error("dpkg-query", "'PACKAGE<TAB>VERSION<TAB>WANT FLAG STATE' lines", line)
        packages[fields[0]] = {
            "version": fields[1] or None,
            "status": " ".join(status),
            "installed": status[2] == "installed",
            "hold": status[0] == "hold",
        }
    return packages


def apt_showhold(text: str) -> set[str]:
    """Parse ``apt-mark showhold``: the set of held package names."""
    held: set[str] = set()
    for line in _output_lines(text):
        name = line.strip()
        if not _PACKAGE_NAME.match(name):
            raise _error("apt-mark showhold", "one package name per line", line)
        held.add(name)
    return held


def apt_madison(text: str) -> dict[str, list[str]]:
    """Parse ``apt-cache madison PKG...``: package -> versions in printed order, deduplicated.

    ``N:``/``W:`` notices (e.g. "Unable to locate package") are skipped, so an unknown
    package is simply absent. With ``deb-src`` lines in the sources, madison also lists the
    source package (``... Sources``): that is no version ``apt-get install`` can take, and
    its name may be no binary's (``openssh`` beside ``openssh-server``), so it is left out.
    """
    versions: dict[str, list[str]] = {}
    for line in _output_lines(text):
        if line.startswith(("N: ", "W: ")):
            continue
        fields = [field.strip() for field in line.split("|")]
        if len(fields) != 3 or not fields[0] or not fields[1]:
            raise _error("apt-cache madison", "'PACKAGE | VERSION | SOURCE' lines", line)
        if fields[2].endswith(" Sources"):
            continue
        known = versions.setdefault(fields[0], [])
        if fields[1] not in known:
            known.append(fields[1])
    return versions


_OFED = re.compile(r"^(?:MLNX_OFED_LINUX|OFED-internal|OFED)-([0-9][0-9A-Za-z.\-]*?):?$")


def ofed_version(text: str) -> str:
    """The OFED / DOCA-OFED version from ``ofed_info -s`` ("24.10-1.1.4.0")."""
    for line in _output_lines(text):
        if match := _OFED.match(line.strip()):
            return match.group(1)
    raise _error("ofed_info -s", "'MLNX_OFED_LINUX-X.Y-Z:' or 'OFED-internal-X.Y-Z:'", text)
