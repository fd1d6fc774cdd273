"""The CUDA stack's versions: the toolkit's ``version.json``, ``nvcc --version`` and the
torch probe's JSON."""

from __future__ import annotations

import re
from typing import Any

from gpufleet.errors import ParseError
from gpufleet.facts.parsers._capture import _error, _json_document

_NVCC_VERSION = re.compile(r"Cuda compilation tools, release [\d.]+, V(\d+(?:\.\d+)+)")


def cuda_version_json(text: str) -> str:
    """Return ``cuda.version`` from the toolkit's ``version.json``."""
    document = _json_document("cuda version.json", text, ("{",))
    cuda = document.get("cuda") if isinstance(document, dict) else None
    version = cuda.get("version") if isinstance(cuda, dict) else None
    if not isinstance(version, str):
        raise _error("cuda version.json", "a cuda.version string", text)
    return version


def nvcc_version(text: str) -> str:
    """Return the full nvcc version ("13.0.88") from ``nvcc --version``."""
    if match := _NVCC_VERSION.search(text):
        return match.group(1)
    raise _error("nvcc --version", "'Cuda compilation tools, release X, VX.Y.Z'", text)


def torch_info(text: str) -> dict[str, Any]:
    """Parse the torch probe's JSON; a Python traceback raises with its last line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if any(line.startswith("Traceback (most recent call last)") for line in lines):
        raise ParseError(f"torch probe: expected JSON, got traceback {lines[-1]!r}")
    document = _json_document("torch probe", text, ("{",))
    if not isinstance(document, dict) or "torch" not in document:
        raise _error("torch probe", "a JSON object with a 'torch' key", text)
    return document
