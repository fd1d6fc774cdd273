"""The files of a directory inventory, and the ``group_vars/`` and ``host_vars/`` files of
a group or a host, listed as Ansible lists them (symbolic link loops refused)."""

from __future__ import annotations

import os
import unicodedata
from pathlib import Path

from gpufleet.inventory.files import Where, list_dir

_VARS_SUFFIXES = ("", ".yml", ".yaml", ".json")

_VARS_DIRS = frozenset({"group_vars", "host_vars"})

_IGNORED_SUFFIXES = (
    ".md", ".retry", ".pyc", ".pyo", ".swp", ".bak", ".orig", ".rst", ".txt", ".cfg", "~",
)  # fmt: skip


def _identity(directory: Path) -> tuple[int, int]:
    """The directory itself (device and inode), whatever links lead to it."""
    try:
        info = directory.stat()
    except OSError as exc:
        raise Where(directory).error(f"cannot read: {exc.strerror or exc}") from None
    return info.st_dev, info.st_ino


def _descend(directory: Path, above: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
    """``above`` with ``directory`` added; a directory that is one of those it is inside
    (a link to ``.`` or to a parent) is a loop that would be listed forever."""
    identity = _identity(directory)
    if identity in above:
        raise Where(directory).error("a symbolic link loop: this directory is one it is "
                                     "inside; remove the link")
    return (*above, identity)


def inventory_files(directory: Path, above: tuple[tuple[int, int], ...] = ()) -> list[Path]:
    """Inventory files of a directory inventory, alphabetically, subdirectories included."""
    inside = _descend(directory, above)
    files: list[Path] = []
    for entry in list_dir(directory):
        name = entry.name
        if name.startswith((".", "known_hosts")) or name.endswith(_IGNORED_SUFFIXES):
            continue
        if entry.is_dir():
            if name not in _VARS_DIRS:
                files.extend(inventory_files(entry, inside))
        elif entry.is_file():
            files.append(entry)
    return files


def _vars_dir_files(directory: Path, above: tuple[tuple[int, int], ...] = ()) -> list[Path]:
    """Files of a group_vars/<group>/ directory in merge order (as Ansible's loader lists
    them: sorted; directories without an extension recursed; files without an extension
    or ending in .yml, .yaml or .json)."""
    inside = _descend(directory, above)
    files: list[Path] = []
    for entry in list_dir(directory):
        if entry.name.startswith(".") or entry.name.endswith("~"):
            continue
        if entry.is_dir():
            if not entry.suffix:
                files.extend(_vars_dir_files(entry, inside))
        elif entry.suffix in _VARS_SUFFIXES:
            files.append(entry)
    return files


def _folded(name: str) -> str:
    """A file name folded so that names any file system takes for one (by case or
    Unicode normalisation) fold the same."""
    return unicodedata.normalize("NFKD", unicodedata.normalize("NFKD", name).casefold())


def folded_names(directory: Path) -> frozenset[str] | None:
    """The folded names of a directory's entries; None when it cannot be listed."""
    try:
        return frozenset(_folded(entry) for entry in os.listdir(directory))
    except OSError:
        return None


def vars_files(directory: Path, name: str, listed: frozenset[str] | None) -> list[Path]:
    """The group_vars/ or host_vars/ files of one group or host: only the first of NAME,
    NAME.yml, NAME.yaml and NAME.json that exists is read (a directory stands for its
    files), as Ansible's host_group_vars plugin does. ``listed`` (``folded_names(directory)``)
    spares looking for a name the directory cannot hold."""
    if "/" in name or name in {".", ".."}:  # a name that is not one file name
        return []
    folded = _folded(name)
    for suffix in _VARS_SUFFIXES:
        if listed is not None and folded + suffix not in listed:
            continue
        candidate = directory / f"{name}{suffix}"
        if candidate.is_dir():
            return _vars_dir_files(candidate)
        if candidate.exists():
            return [candidate]
    return []
