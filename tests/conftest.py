"""Shared test configuration."""

from __future__ import annotations

import stat
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"


def stand_in(bin_dir: Path, name: str, body: str) -> None:
    """An executable shell script ``bin_dir/name`` that stands in for a system tool."""
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
