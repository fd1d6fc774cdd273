"""Report files on the controller: checked writable before a run starts, written
atomically so a reader never sees half a file, or sent to standard output for ``-``."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from gpufleet.errors import GpufleetError

STDOUT = "-"


class OutputError(GpufleetError):
    """An output path that cannot be written (exit 2, before any host is contacted)."""


def check_writable(path: str | None, flag: str, *, directory: bool = False) -> None:
    """Refuse, before the run, an output that cannot be written: the path (or, for a file
    not there yet, its nearest existing parent) must be a writable directory, or an
    existing regular file. ``-`` (standard output) is accepted for files."""
    if path is None:
        return
    if path == STDOUT:
        if directory:
            raise OutputError(f"{flag} needs a directory, not {STDOUT}")
        return
    if not path or "\x00" in path:
        raise OutputError(f"{flag}: {path!r} is not a path")
    target = Path(path)
    if target.exists():
        if directory and not target.is_dir():
            raise OutputError(f"{flag} {path}: not a directory")
        if not directory and not target.is_file():
            raise OutputError(f"{flag} {path}: not a regular file")
        usable = target if directory else target.parent
        if not os.access(usable, os.W_OK | os.X_OK) or (
                not directory and not os.access(target, os.W_OK)):
            raise OutputError(f"{flag} {path}: not writable")
        return
    parent = target.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise OutputError(f"{flag} {path}: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(f"{flag} {path}: {parent} is not writable")


def to_stdout(*paths: str | None) -> bool:
    """Whether any of the outputs goes to standard output (the terminal report then goes to
    standard error)."""
    return STDOUT in paths


def local_put(path: str, content: bytes, mode: int = 0o644) -> None:
    """Write a controller-side file atomically (temp file in the same directory + rename);
    ``-`` writes ``content`` to standard output."""
    if path == STDOUT:
        sys.stdout.buffer.write(content)
        sys.stdout.flush()
        return
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(content)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
