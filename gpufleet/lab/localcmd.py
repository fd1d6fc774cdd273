"""Run commands on the controller: argument lists only, clear errors for missing tools."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from gpufleet.errors import GpufleetError


class LocalCommandError(GpufleetError):
    """A controller-side command failed; the message carries its stderr."""


def require_root(what: str) -> None:
    """Fail clearly unless running as root."""
    if os.geteuid() != 0:
        raise GpufleetError(f"{what} must run as root (it manages network namespaces and mounts)")


def require_tools(tools: Sequence[str], hint: str) -> None:
    """Fail clearly, naming every missing tool, unless all are on PATH."""
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        raise GpufleetError(f"missing system tools: {', '.join(missing)} ({hint})")


def run(
    argv: Sequence[str],
    *,
    check: bool = True,
    input_text: str | None = None,
    timeout: float = 120.0,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` and capture text output; raise LocalCommandError on failure when ``check``."""
    try:
        proc = subprocess.run(
            list(argv),
            input=input_text,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=cwd,
            check=False,
        )
    except FileNotFoundError as exc:
        raise LocalCommandError(f"{argv[0]}: command not found") from exc
    except subprocess.TimeoutExpired as exc:
        raise LocalCommandError(f"{_short(argv)}: timed out after {timeout:.0f}s") from exc
    if check and proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip().splitlines()
        last = detail[-1] if detail else f"exit code {proc.returncode}"
        raise LocalCommandError(f"{_short(argv)}: {last}")
    return proc


def _short(argv: Sequence[str], limit: int = 120) -> str:
    text = " ".join(argv).replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."
