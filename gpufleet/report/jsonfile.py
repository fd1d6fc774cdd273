"""JSON reports, written atomically so a reader never sees half a file."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from gpufleet import __version__
from gpufleet.errors import GpufleetError
from gpufleet.report.outputs import local_put


def utc(seconds: float | None = None) -> str:
    """A Unix time (now when None) as the documents write times: ``2025-12-06T05:46:40Z``."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def opening(schema: str) -> dict[str, Any]:
    """What every gpufleet JSON document starts with: its schema id, the version that wrote
    it and when (UTC)."""
    return {"schema": schema, "gpufleet_version": __version__, "generated_at": utc()}


def envelope(schema: str, *, inventory: str, inventory_digest: str, duration_s: float,
             summary: dict[str, int], **body: Any) -> dict[str, Any]:
    """A report with the header every report shares (docs/outputs.md): the opening, the
    inventory and its digest, the run's duration and its counts, then ``body``."""
    return {**opening(schema), "inventory": inventory, "inventory_digest": inventory_digest,
            "duration_s": round(duration_s, 3), "summary": summary, **body}


def finite(value: Any) -> Any:
    """``value`` with every NaN or infinite float inside it made null: JSON has no such
    numbers, and a ``NaN`` token breaks strict readers (jq, JSON Schema validators)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(item) for item in value]
    return value


def write_json(path: str | Path, document: dict[str, Any]) -> None:
    """Write ``document`` as indented JSON to ``path`` atomically, a NaN or infinite
    figure as null."""
    text = json.dumps(finite(document), indent=2, sort_keys=False, default=str,
                      allow_nan=False)
    local_put(str(path), (text + "\n").encode())


class BadJson(GpufleetError):
    """A JSON file gpufleet reads (from a node, or from its own history) is unusable."""


def read_json(data: bytes, what: str, *, max_bytes: int = 16 * 2**20) -> Any:
    """The JSON document in ``data`` read from ``what`` (a file on a node or in the
    history), bounded in size: BadJson names ``what`` and the problem instead of a decoder's
    exception or a RecursionError (a document nested thousands of levels deep)."""
    if len(data) > max_bytes:
        raise BadJson(f"{what}: {len(data)} bytes, more than {max_bytes}")
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise BadJson(f"{what}: not UTF-8 text") from None
    except RecursionError:
        raise BadJson(f"{what}: nested too deep to be a document gpufleet wrote") from None
    except ValueError as exc:
        raise BadJson(f"{what}: not JSON ({exc})") from None
