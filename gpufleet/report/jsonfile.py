"""JSON reports, written atomically so a reader never sees half a file."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from gpufleet import __version__
from gpufleet.report.outputs import local_put


def envelope(schema: str, **body: Any) -> dict[str, Any]:
    """The common header of every gpufleet JSON document."""
    return {"schema": schema, "gpufleet_version": __version__,
            "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **body}


def write_json(path: str | Path, document: dict[str, Any]) -> None:
    """Write ``document`` as indented JSON to ``path`` atomically."""
    local_put(str(path), (json.dumps(document, indent=2, sort_keys=False, default=str) + "\n")
              .encode())
