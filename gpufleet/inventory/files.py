"""Reading inventory sources safely: places for error messages, and bounds on what is read.

An inventory is input that gpufleet does not control. Files are read only when they are
regular files no larger than a bound, and the number of hosts and the nesting depth are
bounded too, so a hostile or broken inventory fails fast with one clear line instead of
hanging the controller or exhausting its memory. The bounds are configurable through the
environment (see docs/inventory.md).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from gpufleet.errors import InventoryError

__all__ = ["Limits", "Where", "check_path_text", "limits", "list_dir", "read_bytes", "read_text"]

_DEFAULT_MAX_HOSTS = 100_000
_DEFAULT_MAX_BYTES = 16 * 1024 * 1024
_DEFAULT_MAX_DEPTH = 64
_DEFAULT_MAX_NODES = 2_000_000


@dataclass(frozen=True)
class Where:
    """A place in an inventory source, for error messages."""

    file: Path
    line: int | None = None

    def __str__(self) -> str:
        return f"{self.file}:{self.line}" if self.line else str(self.file)

    def at(self, line: int | None) -> Where:
        return Where(self.file, line)

    def error(self, problem: str) -> InventoryError:
        return InventoryError(f"{self}: {problem}")


@dataclass(frozen=True)
class Limits:
    """How much of an inventory gpufleet accepts before refusing it."""

    max_hosts: int = _DEFAULT_MAX_HOSTS
    max_bytes: int = _DEFAULT_MAX_BYTES
    max_depth: int = _DEFAULT_MAX_DEPTH
    max_nodes: int = _DEFAULT_MAX_NODES


def _env_int(name: str, default: int) -> int:
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    if not text.isdigit() or int(text) < 1:
        raise InventoryError(f"environment variable {name} must be a positive integer, "
                             f"got {text!r}")
    return int(text)


def limits() -> Limits:
    """The bounds in force: the defaults, or GPUFLEET_MAX_* from the environment."""
    return Limits(
        max_hosts=_env_int("GPUFLEET_MAX_HOSTS", _DEFAULT_MAX_HOSTS),
        max_bytes=_env_int("GPUFLEET_MAX_INVENTORY_BYTES", _DEFAULT_MAX_BYTES),
        max_depth=_env_int("GPUFLEET_MAX_INVENTORY_DEPTH", _DEFAULT_MAX_DEPTH),
        max_nodes=_env_int("GPUFLEET_MAX_INVENTORY_NODES", _DEFAULT_MAX_NODES),
    )


def check_path_text(text: str, what: str) -> None:
    """Refuse a path that no file system holds: empty, or with a NUL or line break."""
    if not text:
        raise InventoryError(f"{what} is empty")
    for char, name in (("\0", "a NUL byte"), ("\n", "a line break"), ("\r", "a line break")):
        if char in text:
            raise InventoryError(f"{what} {text!r} contains {name}")


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def read_bytes(file: Path) -> bytes:
    """A regular file's bytes, refusing other kinds of file (a FIFO would block forever) and
    files larger than the bound."""
    where = Where(file)
    bound = limits().max_bytes
    try:
        fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except OSError as exc:
        raise where.error(f"cannot read: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise where.error(f"{_kind(info.st_mode)}, not an inventory file; refusing to read it")
        if info.st_size > bound:
            raise where.error(f"{info.st_size} bytes, more than the limit of {bound} "
                              "(GPUFLEET_MAX_INVENTORY_BYTES)")
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read(bound + 1)
    except OSError as exc:
        raise where.error(f"cannot read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(data) > bound:
        raise where.error(f"more than the limit of {bound} bytes (GPUFLEET_MAX_INVENTORY_BYTES)")
    return data


def read_text(file: Path) -> str:
    """A regular file's text (UTF-8, with or without a byte order mark, without NUL)."""
    data = read_bytes(file)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise Where(file, line).error("not UTF-8 text") from None
    if "\x00" in text:  # no inventory format can hold one; a host name with it is no name
        raise Where(file, text.count("\n", 0, text.index("\x00")) + 1).error(
            "contains a NUL byte")
    return text


def list_dir(directory: Path) -> list[Path]:
    """A directory's entries sorted by name."""
    try:
        return sorted(directory.iterdir(), key=lambda entry: entry.name)
    except OSError as exc:
        raise Where(directory).error(f"cannot list: {exc.strerror or exc}") from None
