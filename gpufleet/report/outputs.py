"""Report files on the controller, written atomically so a reader never sees half a file."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def local_put(path: str, content: bytes, mode: int = 0o644) -> None:
    """Write a controller-side file atomically (temp file in the same directory + rename)."""
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
